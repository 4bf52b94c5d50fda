//! Exit codes scripts can rely on (also listed in `cudatrace --help` and the README).

use std::fmt;

use crate::reader::ReadError;

/// cudatrace's own exit codes; otherwise it exits with the traced command's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitCode {
    /// Bad arguments (clap uses the same code).
    Usage = 2,
    /// A malformed trace line (`cudatrace summary` without --skip-bad-lines).
    BadInput = 65,
    /// `-p PID` names no process.
    NoSuchProcess = 66,
    /// A library given by path (`--libcuda`, `--lib`) cannot be used, or a library given
    /// or found at start exports none of the probed functions.
    NoLibcuda = 69,
    /// eBPF load/attach or another internal failure.
    Internal = 70,
    /// `--power` and no NVML can be loaded and started (or it sees no GPU).
    NoNvml = 72,
    /// The trace cannot be written.
    OutputNotWritable = 73,
    /// A trace to read cannot be opened or read (`--job DIR`: the folder, or it holds no
    /// `*.jsonl`; `view --offline`: the folder, or it has no `index.html`).
    InputUnreadable = 74,
    /// `cudatrace view`: port 9001 on 127.0.0.1 is taken (try again once it is free).
    PortBusy = 75,
    /// Not root and without CAP_BPF + CAP_PERFMON.
    NotPrivileged = 77,
    /// `--missing-probes error` and a function is missing or failed to attach.
    ProbesMissing = 78,
    /// `--gpu`: no libcupti found.
    NoCupti = 80,
    /// `--gpu`: the environment already names an injection library (`CUDA_INJECTION64_PATH`).
    InjectionPathSet = 81,
    /// `--gpu`: GPU recording failed in a process (CUPTI refused), and the command exited 0.
    GpuRecordingFailed = 82,
    /// `-p PID --gpu`: the process cannot take the injection library (refused before it
    /// was touched, or no thread reached a safe point).
    AttachRefused = 83,
    /// The command exists but cannot be executed.
    NotExecutable = 126,
    /// The command was not found.
    CommandNotFound = 127,
}

impl ExitCode {
    /// Every code, for the test that each is documented (a new code goes here too).
    #[cfg(test)]
    pub const ALL: [ExitCode; 17] = [
        ExitCode::Usage,
        ExitCode::BadInput,
        ExitCode::NoSuchProcess,
        ExitCode::NoLibcuda,
        ExitCode::Internal,
        ExitCode::NoNvml,
        ExitCode::OutputNotWritable,
        ExitCode::InputUnreadable,
        ExitCode::PortBusy,
        ExitCode::NotPrivileged,
        ExitCode::ProbesMissing,
        ExitCode::NoCupti,
        ExitCode::InjectionPathSet,
        ExitCode::GpuRecordingFailed,
        ExitCode::AttachRefused,
        ExitCode::NotExecutable,
        ExitCode::CommandNotFound,
    ];
}

/// An error with the exit code it maps to.
pub struct Failure {
    pub code: ExitCode,
    pub error: anyhow::Error,
}

impl Failure {
    pub fn new(code: ExitCode, error: impl Into<anyhow::Error>) -> Self {
        Failure {
            code,
            error: error.into(),
        }
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {:#}", self.code, self.error)
    }
}

/// What every reader command makes of a reading error: a malformed line is bad input, the
/// rest an unreadable trace.
impl From<ReadError> for Failure {
    fn from(error: ReadError) -> Self {
        let code = match error {
            ReadError::BadLine { .. } => ExitCode::BadInput,
            ReadError::Open { .. } | ReadError::Io { .. } => ExitCode::InputUnreadable,
        };
        Failure::new(code, error)
    }
}
