//! `ptrace.rs`'s interface where the x86-64 trampoline is not built: every attach is refused
//! (`target::inspect` refuses the process first; this is the answer should it not).

use std::time::Duration;

use super::Target;

/// How the trampoline was started, and what it cost the thread.
#[derive(Debug)]
pub struct Injected {
    pub tid: u32,
    /// The system call the thread was in (its name).
    pub syscall: &'static str,
    /// From the seize to the release of the thread that runs the trampoline.
    pub stopped: Duration,
    /// Threads seized and let go unchanged (not at a safe point), over all tries.
    pub passed_over: u32,
    /// Tries over all threads.
    pub rounds: u32,
}

/// Why the trampoline could not be started.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("{0}")]
    Trampoline(String),
}

/// Refuses: the trampoline is x86-64 code.
pub fn inject(
    target: &Target,
    _library: &[u8],
    _settings: &[u8],
    _bound: Duration,
) -> Result<Injected, InjectError> {
    Err(InjectError::Trampoline(format!(
        "process {}: attaching injects x86-64 code, which this {} build of cudatrace does \
         not carry: start the program under `cudatrace run --gpu -- CMD` instead",
        target.pid,
        std::env::consts::ARCH
    )))
}
