//! The event loop: waits on the ring buffer, the traced command's exit, Ctrl-C and SIGTERM
//! and a quarter-second tick; on any ending, stops stopping processes, continues those
//! waiting, detaches, drains the ring and settles the losses, so the footer that follows
//! is complete and no process is left stopped.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use anyhow::{Result, anyhow};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{Signal, SignalKind, signal},
};

use super::{loss::LossAccount, outcome::Outcome, pipeline::Pipeline};
use crate::{
    probes::maps::{self, CounterReader},
    sinks::progress::Progress,
};

/// SIGINT/SIGTERM streams and the watched process's exit, registered up front.
pub struct Watches {
    sigint: Signal,
    sigterm: Signal,
    /// Readable once the watched process exits.
    exit_fd: Option<AsyncFd<OwnedFd>>,
    /// The watched process had already exited when the watch was set up.
    already_exited: bool,
}

impl Watches {
    /// Must run inside the runtime's context.
    pub fn new(watched: Option<u32>) -> Result<Self> {
        let sigint = signal(SignalKind::interrupt())?;
        let sigterm = signal(SignalKind::terminate())?;
        let (exit_fd, already_exited) = match watched.map(pidfd_open) {
            Some(Ok(fd)) => (Some(watch(fd, "the pidfd")?), false),
            Some(Err(error)) if error.raw_os_error() == Some(libc::ESRCH) => (None, true),
            Some(Err(error)) => return Err(anyhow::Error::from(error).context("pidfd_open")),
            None => (None, false),
        };
        Ok(Watches {
            sigint,
            sigterm,
            exit_fd,
            already_exited,
        })
    }
}

/// Runs until the command exits or a signal stops tracing; `child` is reaped for its exit
/// status and passed SIGTERM on.
pub async fn event_loop(
    pipeline: &mut Pipeline<'_>,
    watches: Watches,
    child: Option<u32>,
    quiet: bool,
) -> Result<Outcome> {
    let mut ring = watch(
        maps::take_ring(&mut pipeline.discovery.bpf)?,
        "the ring buffer",
    )?;
    let counters = CounterReader::take(&mut pipeline.discovery.bpf)?;
    let Watches {
        mut sigint,
        mut sigterm,
        exit_fd,
        already_exited,
    } = watches;
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    let mut loss = LossAccount::default();
    let mut progress = Progress::new(quiet);
    let mut outcome = Outcome::default();

    // A `-p` target that was gone before the watch started: nothing more will come.
    let mut running = !already_exited;
    while running {
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard?;
                let n = pipeline.drain(guard.get_inner_mut(), 65536)?;
                if n < 65536 {
                    // Drained: wait for the next wakeup (the fd is edge-triggered).
                    guard.clear_ready();
                }
            }
            _ = async { exit_fd.as_ref().unwrap().readable().await }, if exit_fd.is_some() => {
                if let Some(pid) = child {
                    let (code, signal) = reap(pid);
                    outcome.code = code;
                    outcome.signal = signal;
                }
                running = false;
            }
            _ = sigint.recv() => {
                outcome.stopped_by = Some("SIGINT");
                running = false;
            }
            _ = sigterm.recv() => {
                outcome.stopped_by = Some("SIGTERM");
                if let Some(pid) = child {
                    // SAFETY: kill(2) on our own child.
                    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                }
                running = false;
            }
            _ = ticker.tick() => {
                // Records below the wakeup threshold raise no readiness: collect them here.
                pipeline.drain(ring.get_mut(), usize::MAX)?;
                loss.update(counters.read()?, pipeline.writer)?;
                progress.update(pipeline.writer.footer.events.call, loss.lost());
                // A live trace can be followed (`tail -f`) a quarter second behind.
                pipeline.writer.flush()?;
            }
        }
    }

    // No more stops; the stop events still in the ring continue their processes; then
    // detach (continuing any process still stopped) so nothing new arrives, and drain
    // what the ring still holds.
    pipeline.discovery.begin_ending();
    let ring = ring.get_mut();
    while pipeline.drain(ring, usize::MAX)? > 0 {}
    pipeline.discovery.finish();
    while pipeline.drain(ring, usize::MAX)? > 0 {}
    loss.update(counters.read()?, pipeline.writer)?;
    pipeline.writer.footer.undecodable = pipeline.decoder.undecodable;
    progress.finish();
    pipeline.writer.flush()?;
    Ok(outcome)
}

/// A pidfd: readable once the process exits (works for non-children too).
fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Registers `inner` with the reactor for readability.
fn watch<T: AsRawFd>(inner: T, what: &str) -> Result<AsyncFd<T>> {
    // SAFETY: the AsyncFd owns `inner`, so the fd stays open while it is registered.
    unsafe { AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE) }
        .map_err(|_| anyhow!("cannot poll {what}"))
}

/// Reaps the child: (exit code, killing signal).
fn reap(pid: u32) -> (Option<i32>, Option<i32>) {
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
