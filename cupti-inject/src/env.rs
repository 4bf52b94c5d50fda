//! The environment variables the library reads (set by cudatrace; docs/gpu.md's table).

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

/// A whole number from the environment, where set and valid.
pub fn number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// A path from the environment, where set and not empty.
pub fn path(name: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(name).filter(|p| !p.is_empty())
}

/// Whether failures also go to the program's stderr ([`STDERR`] is not `0`).
pub fn errors_on_stderr() -> bool {
    std::env::var_os(STDERR).is_none_or(|v| v != "0")
}

/// Whether [`VERBOSE`] is `1`.
pub fn is_verbose() -> bool {
    std::env::var_os(VERBOSE).is_some_and(|v| v == "1")
}

/// A line on stderr where [`VERBOSE`] is `1`.
pub fn verbose(what: std::fmt::Arguments) {
    if is_verbose() {
        eprintln!("cudatrace-inject: +{} ns: {what}", monotonic_ns());
    }
}
