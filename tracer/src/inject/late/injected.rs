//! What an inject did, or why it did not: the same on every architecture (the inject
//! itself, `ptrace.rs`, is x86-64's).

use std::time::Duration;

/// How the trampoline was started, and what it cost the thread.
#[derive(Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct Injected {
    /// Where the trampoline's data block is (on that thread's stack).
    pub block_at: u64,
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
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub enum InjectError {
    #[error("ptrace refused to seize thread {tid}: {error}")]
    Seize { tid: u32, error: std::io::Error },
    #[error(
        "no thread of process {pid} stopped at a safe point (a blocking system call outside \
         malloc and the loader) within {waited:?} ({threads} threads, {tries} tries: {last}); \
         the process is untouched"
    )]
    NoSafePoint {
        pid: u32,
        waited: Duration,
        threads: usize,
        tries: u32,
        last: String,
    },
    #[error("{0}")]
    Trampoline(String),
    #[error("handing the library over: {0}")]
    Handover(String),
}
