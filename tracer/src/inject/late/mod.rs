//! `cudatrace run -p PID --gpu`: the injection library put into a process that already
//! runs (docs/gpu.md, "Attaching to a running process").
//!
//! | file | |
//! |---|---|
//! | `target.rs` | what is read of the process first: its mappings, state, word size, `dlopen`; every refusal |
//! | `ptrace.rs` | one thread seized at a safe point, pointed at the trampoline, let go |
//! | `trampoline.rs` (+ `trampoline.S`) | the code the thread runs: `dlopen`, `dlsym`, `cudatrace_attach`, then back |
//! | `shared_library.rs` | the library's file, kept where every attach finds the same one |
//! | `injected.rs` | what an inject did, or why not |
//!
//! Who uses whom: `mod` → `ptrace` → `trampoline`, `target`; `mod` → `shared_library`.
//!
//! The trampoline and the registers it is started with are x86-64's: elsewhere (arm64)
//! `target` refuses every process first (it is not a 64-bit x86 program), and `ptrace` and
//! `trampoline` are not built.

mod injected;
#[cfg(target_arch = "x86_64")]
pub mod ptrace;
pub mod shared_library;
pub mod target;
#[cfg(target_arch = "x86_64")]
pub mod trampoline;

use std::{
    ffi::OsString,
    path::Path,
    time::{Duration, Instant},
};

pub use self::{
    injected::{InjectError, Injected},
    target::{Refusal, Target},
};

/// How long finding a thread at a safe point may take before the attach is refused.
pub const SAFE_POINT_BOUND: Duration = Duration::from_secs(2);

/// The settings a late start gets in place of environment variables (`KEY=VALUE` lines).
pub fn settings(vars: &[(OsString, OsString)]) -> Vec<u8> {
    let mut text = Vec::new();
    for (key, value) in vars {
        use std::os::unix::ffi::OsStrExt;
        text.extend_from_slice(key.as_bytes());
        text.push(b'=');
        text.extend_from_slice(value.as_bytes());
        text.push(b'\n');
    }
    text
}

/// This process's pid and start time (`/proc/self/stat`'s 22nd field): the library stops
/// recording once this cudatrace is gone, whatever else takes its pid.
pub fn tracer_identity() -> String {
    let start = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.split_whitespace().nth(19).map(str::to_owned)
        })
        .unwrap_or_default();
    format!("{}:{start}", std::process::id())
}

/// What an attach did.
#[derive(Debug)]
pub struct Attached {
    pub target: Target,
    pub injected: Injected,
    /// From the first look at the process to the thread let go.
    pub took: Duration,
}

/// Why an attach did not happen; the process is untouched either way.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error(transparent)]
    Inject(#[from] InjectError),
}

/// Whether process `pid` can take the library (`run -p PID --gpu`'s check before anything,
/// `doctor -p PID`): every refusal that files tell.
pub fn check(pid: u32) -> Result<Target, Refusal> {
    let name = shared_library::file_name(crate::inject::private_dir::INJECTION_LIBRARY);
    target::inspect(pid, Path::new(&name))
}

/// Makes process `pid` load `library` and start it with `settings`.
pub fn attach(pid: u32, library: &Path, settings: &[u8]) -> Result<Attached, AttachError> {
    let start = Instant::now();
    let target = target::inspect(pid, library)?;
    let injected = inject(&target, library, settings)?;
    Ok(Attached {
        target,
        injected,
        took: start.elapsed(),
    })
}

#[cfg(target_arch = "x86_64")]
fn inject(target: &Target, library: &Path, settings: &[u8]) -> Result<Injected, InjectError> {
    use std::os::unix::ffi::OsStrExt;
    ptrace::inject(
        target,
        library.as_os_str().as_bytes(),
        settings,
        SAFE_POINT_BOUND,
    )
}

/// Not reached: `target::inspect` refuses every process that is not a 64-bit x86 program.
#[cfg(not(target_arch = "x86_64"))]
fn inject(_: &Target, _: &Path, _: &[u8]) -> Result<Injected, InjectError> {
    Err(InjectError::Trampoline(format!(
        "attaching injects x86-64 code: not on {}",
        std::env::consts::ARCH
    )))
}
