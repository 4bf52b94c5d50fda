//! Running the bench's programs: a child measured with wait4, a background child stopped
//! with SIGINT, and Ctrl-C, which stops the bench between runs.

use std::{
    fs::{self, File},
    path::Path,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use super::procfs::status_line;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM with a handler (not SIG_IGN, which children would inherit):
/// Ctrl-C kills the running child, and the guards detach what they attached before the bench
/// exits.
pub fn catch_interrupts() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(signal, on_signal as *const () as libc::sighandler_t) };
    }
}

/// An error once Ctrl-C or SIGTERM came.
pub fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// A finished child: exit code (128 + signal when killed), wall time, and its resource use
/// (with its waited-for children) from wait4.
pub struct Finished {
    pub code: i32,
    pub wall_s: f64,
    pub max_rss_kib: u64,
    pub cpu_s: f64,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn ensure_ok(&self, what: &str) -> Result<()> {
        ensure!(
            self.code == 0,
            "{what} exited with {}; stderr:\n{}",
            self.code,
            tail(&self.stderr, 2000)
        );
        Ok(())
    }
}

pub fn tail(text: &str, max: usize) -> &str {
    let start = text.len().saturating_sub(max);
    let start = (start..=text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    &text[start..]
}

/// Runs `command` with stdout and stderr in files under `out`, waits with wait4 and
/// returns what it used. With a sampler, polls every 50 ms and calls it with the pid.
pub fn run_measured(
    out: &Path,
    command: &mut Command,
    mut sampler: Option<&mut dyn FnMut(u32)>,
) -> Result<Finished> {
    check_interrupted()?;
    let stdout_path = out.join("stdout.txt");
    let stderr_path = out.join("stderr.txt");
    command
        .stdin(Stdio::null())
        .stdout(File::create(&stdout_path)?)
        .stderr(File::create(&stderr_path)?);
    let started = Instant::now();
    let child = command
        .spawn()
        .with_context(|| format!("starting {command:?}"))?;
    let pid = child.id();
    let (code, usage) = loop {
        if let Some(sample) = sampler.as_deref_mut() {
            sample(pid);
            if let Some(done) = wait4(pid, false)? {
                break done;
            }
            thread::sleep(Duration::from_millis(50));
        } else {
            break wait4(pid, true)?.expect("a blocking wait4 returns the child");
        }
    };
    let wall_s = started.elapsed().as_secs_f64();
    // The child is reaped: std's handle must not wait for it again.
    drop(child);
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let finished = Finished {
        code,
        wall_s,
        max_rss_kib: usage.ru_maxrss as u64,
        cpu_s: tv(usage.ru_utime) + tv(usage.ru_stime),
        stdout: fs::read_to_string(&stdout_path).unwrap_or_default(),
        stderr: fs::read_to_string(&stderr_path).unwrap_or_default(),
    };
    check_interrupted()?;
    Ok(finished)
}

/// wait4 on one child: `None` while it runs (non-blocking), else its exit code and rusage.
fn wait4(pid: u32, block: bool) -> Result<Option<(i32, libc::rusage)>> {
    let pid = pid as libc::pid_t;
    loop {
        let mut status = 0;
        // SAFETY: rusage is plain data; wait4 fills it.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let flags = if block { 0 } else { libc::WNOHANG };
        // SAFETY: valid pointers to locals.
        let got = unsafe { libc::wait4(pid, &mut status, flags, &mut usage) };
        if got == pid {
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
            return Ok(Some((code, usage)));
        }
        if got == 0 {
            return Ok(None);
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(error).context("wait4");
        }
    }
}

/// A background child stopped with SIGINT (then SIGKILL) when dropped.
pub struct Background {
    child: Option<Child>,
    /// The program, for errors.
    name: &'static str,
}

impl Background {
    pub fn new(child: Child, name: &'static str) -> Self {
        Background {
            child: Some(child),
            name,
        }
    }

    pub fn try_wait(&mut self) -> Result<Option<std::process::ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => bail!("already stopped"),
        }
    }

    pub fn stop(&mut self) -> Result<()> {
        self.stop_with(libc::SIGINT)
    }

    /// Stops it with `signal` (then SIGKILL after 30 s).
    pub fn stop_with(&mut self, signal: libc::c_int) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        // SAFETY: our own child's pid, not yet reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(50));
        }
        // Where it was stuck, for the report.
        let pid = child.id();
        let state = status_line(pid, "State:").unwrap_or_default();
        let wchan = fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        let stack = fs::read_to_string(format!("/proc/{pid}/stack")).unwrap_or_default();
        child.kill()?;
        child.wait()?;
        bail!(
            "{} did not stop on signal {signal} in 30 s ({state}, wchan {wchan}; stack: {}); killed",
            self.name,
            stack.lines().take(6).collect::<Vec<_>>().join(" < ")
        )
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("xtask: bench: {e:#}");
        }
    }
}
