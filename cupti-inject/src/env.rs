//! The environment variables the library reads (set by cudatrace; docs/gpu.md's table).

use std::ffi::OsString;
use std::sync::RwLock;

use crate::clock::monotonic_ns;

/// libcupti to load; unset: the loader's search for `libcupti.so.13`, then `libcupti.so`.
pub const CUPTI: &str = "CUDATRACE_CUPTI";
/// Also append every record sent, as a JSON line, to this file (tests, GPU smoke checks).
pub const DEBUG_FILE: &str = "CUDATRACE_INJECT_DEBUG_FILE";
/// Another injection library to start after this one (a user's own `CUDA_INJECTION64_PATH`).
pub const CHAIN: &str = "CUDATRACE_INJECT_CHAIN";
/// `0`: errors go only to cudatrace, not also to the program's stderr.
pub const STDERR: &str = "CUDATRACE_INJECT_STDERR";
/// cudatrace's control file: a `u32` per pid saying whether another CUPTI client of the
/// process holds the activity API (`control.rs`). Unset: the library never yields.
pub const CONTROL: &str = "CUDATRACE_INJECT_CONTROL";
/// How often CUPTI is asked for completed buffers, in ms (default 200).
pub const FLUSH_MS: &str = "CUDATRACE_INJECT_FLUSH_MS";
/// Bytes per activity buffer handed to CUPTI, in KiB (default 4096).
pub const BUFFER_KIB: &str = "CUDATRACE_INJECT_BUFFER_KIB";
/// `1`: say on stderr what each buffer held and how CUPTI was taken back (diagnostics).
pub const VERBOSE: &str = "CUDATRACE_INJECT_VERBOSE";

/// Of a late start with [`LATE_CALLS`] `off`: how the driver calls' API records are
/// switched on (`session.rs`, [`crate::session::Session::take_late`]): `kind` (default: the
/// DRIVER kind, then every other function off), `functions` (the functions alone, as at `cuInit`), `all` (the
/// DRIVER kind alone: every driver call). Passed by cudatrace from its own environment.
pub const DRIVER_API: &str = "CUDATRACE_INJECT_DRIVER_API";

/// Of a start at `cuInit`, for measuring what CUPTI costs (never set by cudatrace): where
/// the driver calls' API records come from. Unset or `records`: CUPTI's DRIVER activity
/// records of the linked functions; `callbacks`: CUPTI's callback API, as a late start
/// (`calls.rs`; it holds CUPTI 13.0's one subscriber, so a profiler started beside it gets
/// no CUDA activity); `none`: no API records at all (GPU records are then unlinked).
pub const CALLS: &str = "CUDATRACE_INJECT_CALLS";
/// For measuring: `0` registers no timestamp callback (records on CUPTI's clock, converted
/// with clock pairs, as beside another subscriber).
pub const TIMESTAMP_CALLBACK: &str = "CUDATRACE_INJECT_TIMESTAMP_CALLBACK";

/// For measuring (`cargo xtask bench --only gpu`): `1` leaves batches unmarked, so the
/// uprobe copies them record by record, as it does an earlier build's.
pub const UNMARKED: &str = "CUDATRACE_INJECT_UNMARKED";

/// Of a late start: where the driver calls' API records come from. Unset (the default):
/// CUPTI's callback API (`calls.rs`), no DRIVER activity records; `off`: CUPTI's DRIVER
/// activity records, as [`DRIVER_API`] says; `debug`: those, and the callbacks' records
/// written to the debug file only (`detail` 1000), for diagnostics.
pub const LATE_CALLS: &str = "CUDATRACE_INJECT_LATE_CALLS";
/// Of a late start, diagnostics: `1` also enables CUPTI's RUNTIME kind; its records go to
/// the debug file only (`detail` 5).
pub const LATE_RUNTIME: &str = "CUDATRACE_INJECT_LATE_RUNTIME";

/// Of a late start (`cudatrace run -p PID --gpu`): cudatrace's pid and its start time
/// (`/proc/PID/stat`'s 22nd field): once that process is gone, the library stops recording.
pub const TRACER: &str = "CUDATRACE_INJECT_TRACER";

/// The variables a late start was given (`cudatrace_attach`): a running program's
/// environment is its own, so cudatrace's settings come in its call instead, and take the
/// place of the environment's of the same name. Replaced whole at each attach.
static GIVEN: RwLock<Vec<(String, OsString)>> = RwLock::new(Vec::new());

/// Takes `KEY=VALUE` lines as the settings of this attach.
pub fn set_given(text: &str) {
    let given = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.to_owned(), OsString::from(value)))
        .collect();
    *GIVEN.write().unwrap_or_else(|e| e.into_inner()) = given;
}

/// A variable: as a late start gave it, else from the environment.
pub fn var(name: &str) -> Option<OsString> {
    let given = GIVEN.read().unwrap_or_else(|e| e.into_inner());
    match given.iter().find(|(key, _)| key == name) {
        Some((_, value)) => Some(value.clone()),
        None => std::env::var_os(name),
    }
}

/// A whole number from the environment, where set and valid.
pub fn number(name: &str) -> Option<u64> {
    var(name)?.to_str()?.trim().parse().ok()
}

/// A path from the environment, where set and not empty.
pub fn path(name: &str) -> Option<OsString> {
    var(name).filter(|p| !p.is_empty())
}

/// Whether failures also go to the program's stderr ([`STDERR`] is not `0`).
pub fn errors_on_stderr() -> bool {
    var(STDERR).is_none_or(|v| v != "0")
}

/// Whether [`VERBOSE`] is `1`.
pub fn is_verbose() -> bool {
    var(VERBOSE).is_some_and(|v| v == "1")
}

/// A line on stderr where [`VERBOSE`] is `1`.
pub fn verbose(what: std::fmt::Arguments) {
    if is_verbose() {
        eprintln!("cudatrace-inject: +{} ns: {what}", monotonic_ns());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A late start's settings take the place of the environment's, and are replaced whole
    /// at the next attach.
    #[test]
    fn given_settings_come_before_the_environment() {
        // SAFETY: this test alone reads or writes this variable.
        unsafe { std::env::set_var("CUDATRACE_TEST_GIVEN", "from the environment") };
        assert_eq!(
            var("CUDATRACE_TEST_GIVEN"),
            Some("from the environment".into())
        );
        set_given("CUDATRACE_TEST_GIVEN=given\nCUDATRACE_INJECT_FLUSH_MS= 50\nno equals sign\n");
        assert_eq!(var("CUDATRACE_TEST_GIVEN"), Some("given".into()));
        assert_eq!(number(FLUSH_MS), Some(50));
        set_given("CUDATRACE_INJECT_FLUSH_MS=20\n");
        assert_eq!(
            var("CUDATRACE_TEST_GIVEN"),
            Some("from the environment".into())
        );
        assert_eq!(number(FLUSH_MS), Some(20));
        set_given("");
    }
}
