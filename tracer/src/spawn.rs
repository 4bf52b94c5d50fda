//! Starting the traced command suspended: fork, drop privileges, wait on a pipe, exec.
//!
//! The child blocks before `execve` until [`Gated::release`], so probes are attached
//! before the command's first instruction. `std::process::Command` cannot do this: its
//! `spawn` waits for the exec, so a gate in `pre_exec` deadlocks. Its end is ours too:
//! [`reap`] gives its exit code or killing signal.

use std::{
    ffi::{CString, OsStr, OsString},
    os::unix::ffi::{OsStrExt, OsStringExt},
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::privileges::TargetUser;

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("command not found: {0}")]
    NotFound(String),
    #[error("{0}: permission denied (not executable)")]
    NotExecutable(PathBuf),
    #[error("{0}: argument or environment contains a NUL byte")]
    NulByte(String),
    #[error("{call} failed: {error}")]
    Sys {
        call: &'static str,
        error: std::io::Error,
    },
    #[error("exec {path} failed: {error}")]
    Exec {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl SpawnError {
    fn last(call: &'static str) -> Self {
        SpawnError::Sys {
            call,
            error: std::io::Error::last_os_error(),
        }
    }
}

/// Resolves `program` like execvp: a path with a slash as is, else the first executable
/// match in `path_var`.
pub fn resolve(program: &OsStr, path_var: Option<&OsStr>) -> Result<PathBuf, SpawnError> {
    let display = program.to_string_lossy().into_owned();
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        return match path.metadata() {
            Ok(meta) if meta.is_file() && is_executable(&path) => Ok(path),
            Ok(meta) if meta.is_file() => Err(SpawnError::NotExecutable(path)),
            _ => Err(SpawnError::NotFound(display)),
        };
    }
    let search = path_var.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    let mut not_executable = None;
    for dir in std::env::split_paths(search) {
        let candidate = dir.join(program);
        if candidate.is_file() {
            if is_executable(&candidate) {
                return Ok(candidate);
            }
            not_executable.get_or_insert(candidate);
        }
    }
    Err(not_executable.map_or(SpawnError::NotFound(display), SpawnError::NotExecutable))
}

fn is_executable(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a NUL-terminated path.
    unsafe { libc::access(c_path.as_ptr(), libc::X_OK) == 0 }
}

fn cstring(bytes: Vec<u8>) -> Result<CString, SpawnError> {
    CString::new(bytes)
        .map_err(|e| SpawnError::NulByte(String::from_utf8_lossy(&e.into_vec()).into_owned()))
}

/// The signal dispositions and mask cudatrace was started with: what an untraced child of
/// the same shell would inherit. The command gets them back before its exec, whatever
/// cudatrace changed since (Rust's runtime ignores SIGPIPE; the signal handlers).
struct InheritedSignals {
    /// Signals that were ignored (`nohup` ignores SIGHUP, a background job of a
    /// non-interactive shell SIGINT and SIGQUIT): they stay ignored, as across any exec.
    ignored: Vec<libc::c_int>,
    mask: libc::sigset_t,
}

static INHERITED_SIGNALS: OnceLock<InheritedSignals> = OnceLock::new();

/// Highest signal number on Linux (`SIGRTMAX`).
const LAST_SIGNAL: libc::c_int = 64;

/// Records the dispositions and mask cudatrace started with; call first thing in `main`,
/// before any handler is installed. SIGPIPE is taken to have been at its default: Rust's
/// runtime ignores it before `main` (as `std::process::Command` does, its children get
/// it back at its default).
pub fn record_inherited_signals() {
    let mut ignored = Vec::new();
    for signal in 1..=LAST_SIGNAL {
        if signal == libc::SIGPIPE {
            continue;
        }
        // SAFETY: sigaction(2) with a null new action only reads the current one.
        let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
        let read = unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) };
        if read == 0 && current.sa_sigaction == libc::SIG_IGN {
            ignored.push(signal);
        }
    }
    // SAFETY: sigprocmask(2) with a null new set only reads the mask.
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut mask);
        libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut mask);
    }
    let _ = INHERITED_SIGNALS.set(InheritedSignals { ignored, mask });
}

/// In the forked child: every signal back to its default (or to ignored, where cudatrace
/// inherited it ignored) and the mask cudatrace started with. Only async-signal-safe calls.
///
/// # Safety
/// Call only in the child between fork and exec.
unsafe fn restore_inherited_signals(inherited: Option<&InheritedSignals>) {
    // SAFETY: sigaction(2) and sigprocmask(2) are async-signal-safe; the structs live on
    // the stack or were allocated before the fork.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        libc::sigemptyset(&mut action.sa_mask);
        for signal in 1..=LAST_SIGNAL {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let ignored = inherited.is_some_and(|i| i.ignored.contains(&signal));
            action.sa_sigaction = if ignored {
                libc::SIG_IGN
            } else {
                libc::SIG_DFL
            };
            // glibc's own signals (32, 33) refuse: they are reset by the exec anyway.
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        let mask = inherited.map_or(&empty as *const _, |i| &i.mask as *const _);
        libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut());
    }
}

/// A forked child waiting at the gate.
#[derive(Debug)]
pub struct Gated {
    pub pid: u32,
    gate_write: libc::c_int,
    error_read: libc::c_int,
    path: PathBuf,
}

/// Forks the child, which drops to `user` (if any) and waits before `execve`.
/// Call before starting threads: the child only makes async-signal-safe calls.
pub fn spawn_gated(
    path: &Path,
    args: &[OsString],
    env: &[(OsString, OsString)],
    user: Option<&TargetUser>,
    stdout_to_stderr: bool,
) -> Result<Gated, SpawnError> {
    // Everything the child needs is allocated before fork.
    let c_path = cstring(path.as_os_str().as_bytes().to_vec())?;
    let c_args = args
        .iter()
        .map(|a| cstring(a.clone().into_vec()))
        .collect::<Result<Vec<_>, _>>()?;
    let c_env = env
        .iter()
        .map(|(k, v)| {
            let mut entry = k.clone().into_vec();
            entry.push(b'=');
            entry.extend_from_slice(v.as_bytes());
            cstring(entry)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = c_env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let groups: Vec<libc::gid_t> = user.map(|u| u.groups.clone()).unwrap_or_default();
    let inherited = INHERITED_SIGNALS.get();

    let mut gate = [0; 2];
    let mut errors = [0; 2];
    // SAFETY: pipe2 fills the two-element arrays.
    if unsafe { libc::pipe2(gate.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SpawnError::last("pipe2"));
    }
    if unsafe { libc::pipe2(errors.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SpawnError::last("pipe2"));
    }
    // SAFETY: the child below only calls async-signal-safe functions, then execs or exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SpawnError::last("fork"));
    }
    if pid == 0 {
        unsafe {
            libc::close(gate[1]);
            libc::close(errors[0]);
            let fail = |stage: i32| -> ! {
                let errno = *libc::__errno_location();
                let report = [stage, errno];
                libc::write(errors[1], report.as_ptr().cast(), 8);
                libc::_exit(127);
            };
            if let Some(user) = user {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                    fail(1);
                }
                if libc::setgid(user.gid) != 0 {
                    fail(2);
                }
                if libc::setuid(user.uid) != 0 {
                    fail(3);
                }
            }
            if stdout_to_stderr && libc::dup2(2, 1) < 0 {
                fail(5);
            }
            // As an untraced child of the same shell: nothing of cudatrace's own signal
            // set-up reaches the command (a pipeline's `yes | head` needs SIGPIPE).
            restore_inherited_signals(inherited);
            let mut byte = 0u8;
            // EOF means cudatrace died before releasing us: do not run untraced.
            if libc::read(gate[0], (&mut byte as *mut u8).cast(), 1) != 1 {
                libc::_exit(127);
            }
            libc::execve(c_path.as_ptr(), argv.as_ptr(), envp.as_ptr());
            fail(4);
        }
    }
    unsafe {
        libc::close(gate[0]);
        libc::close(errors[1]);
    }
    Ok(Gated {
        pid: pid as u32,
        gate_write: gate[1],
        error_read: errors[0],
        path: path.to_owned(),
    })
}

impl Gated {
    /// Lets the child exec, and reports a failed privilege drop or exec.
    pub fn release(self) -> Result<u32, SpawnError> {
        let byte = 1u8;
        // SAFETY: plain write/read/close on fds this struct owns.
        unsafe {
            libc::write(self.gate_write, (&byte as *const u8).cast(), 1);
            libc::close(self.gate_write);
            let mut report = [0i32; 2];
            let n = libc::read(self.error_read, report.as_mut_ptr().cast(), 8);
            libc::close(self.error_read);
            if n == 8 {
                let error = std::io::Error::from_raw_os_error(report[1]);
                let mut status = 0;
                libc::waitpid(self.pid as i32, &mut status, 0);
                return Err(match report[0] {
                    1 => SpawnError::Sys {
                        call: "setgroups",
                        error,
                    },
                    2 => SpawnError::Sys {
                        call: "setgid",
                        error,
                    },
                    3 => SpawnError::Sys {
                        call: "setuid",
                        error,
                    },
                    5 => SpawnError::Sys {
                        call: "dup2",
                        error,
                    },
                    _ => SpawnError::Exec {
                        path: self.path,
                        error,
                    },
                });
            }
        }
        Ok(self.pid)
    }
}

/// Reaps the child: (exit code, killing signal).
pub fn reap(pid: u32) -> (Option<i32>, Option<i32>) {
    let mut status = 0;
    // SAFETY: waitpid on our own child.
    let rc = unsafe { libc::waitpid(pid as i32, &mut status, 0) };
    if rc != pid as i32 {
        return (None, None);
    }
    if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_through_path_like_execvp() {
        let found = resolve(
            OsStr::new("sh"),
            Some(OsStr::new("/nonexistent:/bin:/usr/bin")),
        )
        .unwrap();
        assert!(found.ends_with("sh"), "{}", found.display());
        assert!(matches!(
            resolve(OsStr::new("no-such-command-xyz"), Some(OsStr::new("/bin"))),
            Err(SpawnError::NotFound(name)) if name == "no-such-command-xyz"
        ));
        let plain = std::env::temp_dir().join(format!("cudatrace-noexec-{}", std::process::id()));
        std::fs::write(&plain, "data").unwrap();
        let result = resolve(plain.as_os_str(), None);
        std::fs::remove_file(&plain).unwrap();
        assert!(
            matches!(result, Err(SpawnError::NotExecutable(_))),
            "{result:?}"
        );
    }
}
