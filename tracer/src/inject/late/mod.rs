//! `cudatrace run -p PID --gpu`: the injection library put into a process that already
//! runs (docs/gpu.md, "Attaching to a running process").
//!
//! | file | |
//! |---|---|
//! | `target.rs` | what is read of the process first: its mappings, state, word size, `dlopen`; every refusal |
//! | `ptrace.rs` | one thread seized at a safe point, pointed at the trampoline, let go |
//! | `trampoline.rs` (+ `trampoline.S`) | the code the thread runs: two anonymous files, a wait for cudatrace, `dlopen`, `dlsym`, `cudatrace_attach`, then back |
//! | `handover.rs` | the library's bytes into the anonymous file, the probes and the control file, then go |
//! | `shared_library.rs` | the library's name, by its contents |
//! | `injected.rs` | what an inject did, or why not |
//!
//! Who uses whom: `mod` → `ptrace` → `trampoline`, `target`; `mod` → `handover` →
//! `trampoline`, `ptrace`; `mod` → `shared_library`.
//!
//! The trampoline and the registers it is started with are x86-64's: elsewhere (arm64)
//! `target` refuses every process first (it is not a 64-bit x86 program), and `ptrace` and
//! `trampoline` are not built.

#[cfg(target_arch = "x86_64")]
pub mod handover;
mod injected;
#[cfg(target_arch = "x86_64")]
pub mod ptrace;
pub mod shared_library;
pub mod target;
#[cfg(target_arch = "x86_64")]
pub mod trampoline;

use std::{
    ffi::OsString,
    fs::File,
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

/// The injection library's name in the processes it goes into (its anonymous file's),
/// by its contents: another build's is never taken for it.
pub fn library_name() -> String {
    shared_library::file_name(crate::inject::private_dir::INJECTION_LIBRARY)
}

/// Whether process `pid` can take the library (`run -p PID --gpu`'s check before anything,
/// `doctor -p PID`): every refusal that files tell.
pub fn check(pid: u32) -> Result<Target, Refusal> {
    target::inspect(pid, &library_name())
}

/// What the caller is given once the library is in the process, before it starts: the
/// library's file (to attach the probes to), the control file, its path there. It returns
/// the settings the library starts with.
pub struct Handed {
    pub library: File,
    /// As the process's maps name the library.
    pub library_shown_as: String,
    /// An earlier attach loaded it.
    pub reused: bool,
    pub control: File,
    pub control_path: String,
}

/// Makes process `pid` load the injection library and start it with the settings `take`
/// returns (after attaching its probes to the library and taking the control file).
pub fn attach(
    pid: u32,
    take: &mut dyn FnMut(Handed) -> Result<Vec<u8>, String>,
) -> Result<Attached, AttachError> {
    let start = Instant::now();
    let name = library_name();
    let target = target::inspect(pid, &name)?;
    let injected = inject(&target, &name, take)?;
    Ok(Attached {
        target,
        injected,
        took: start.elapsed(),
    })
}

#[cfg(target_arch = "x86_64")]
fn inject(
    target: &Target,
    name: &str,
    take: &mut dyn FnMut(Handed) -> Result<Vec<u8>, String>,
) -> Result<Injected, InjectError> {
    // Opened before the process is touched: a library that cannot be opened refuses here.
    let loaded = match &target.injected {
        Some(loaded) => Some((
            File::open(&loaded.file).map_err(|e| {
                InjectError::Trampoline(format!(
                    "opening the library an earlier attach loaded ({}): {e}",
                    loaded.file.display()
                ))
            })?,
            loaded.path.clone(),
        )),
        None => None,
    };
    let injected = ptrace::inject(target, name.as_bytes(), SAFE_POINT_BOUND)?;
    let reused = loaded.is_some();
    let (library, shown_as) = match loaded {
        Some((file, path)) => (handover::Library::Loaded(file), path),
        None => (
            handover::Library::Write(crate::inject::private_dir::INJECTION_LIBRARY),
            format!("/memfd:{name} (deleted)"),
        ),
    };
    handover::hand_over(target.pid, injected.block_at, library, &mut |files| {
        take(Handed {
            library: files.library,
            library_shown_as: shown_as.clone(),
            reused,
            control: files.control,
            control_path: files.control_path,
        })
    })?;
    Ok(injected)
}

/// Not reached: `target::inspect` refuses every process that is not a 64-bit x86 program.
#[cfg(not(target_arch = "x86_64"))]
fn inject(
    _: &Target,
    _: &str,
    _: &mut dyn FnMut(Handed) -> Result<Vec<u8>, String>,
) -> Result<Injected, InjectError> {
    Err(InjectError::Trampoline(format!(
        "attaching injects x86-64 code: not on {}",
        std::env::consts::ARCH
    )))
}
