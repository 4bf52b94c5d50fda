//! The signals that stop tracing (SIGINT, SIGTERM, SIGHUP, SIGQUIT): noted by their
//! handlers at once, so that a drain sees one between two records, and passed on to the
//! command where the terminal does not send them to it already.

use std::{
    sync::atomic::{AtomicI32, Ordering},
    task::Poll,
};

use anyhow::Result;
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::outcome::Outcome;

/// The signals that end tracing, and whether each is passed on to the command.
const STOP_SIGNALS: [(&str, libc::c_int, bool); 4] = [
    // The terminal sends Ctrl-C and Ctrl-\ to the command as well.
    ("SIGINT", libc::SIGINT, false),
    ("SIGTERM", libc::SIGTERM, true),
    ("SIGHUP", libc::SIGHUP, true),
    ("SIGQUIT", libc::SIGQUIT, false),
];

/// Takes the stopping signal received since the last look, if any (after the window,
/// while cudatrace waits for the command).
pub fn take_stop_signal() -> Option<i32> {
    match STOP_SIGNAL.swap(0, Ordering::Relaxed) {
        0 => None,
        number => Some(number),
    }
}

/// The last stopping signal received, stored by the signal handler itself: a drain sees it
/// between two records, without waiting for the runtime to deliver the signal (which it
/// does only between polls, and a ring that never empties is always ready).
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// A stopping signal was received: a drain stops between two records.
pub fn stopping() -> bool {
    STOP_SIGNAL.load(Ordering::Relaxed) != 0
}

/// The stopping signal received, as its index in `STOP_SIGNALS`.
pub fn stop_signal() -> Option<usize> {
    let number = STOP_SIGNAL.load(Ordering::Relaxed);
    STOP_SIGNALS.iter().position(|(_, n, _)| *n == number)
}

/// The stopping signals' streams, and the handlers that note them at once (must run inside
/// the runtime's context).
pub fn watch() -> Result<Vec<Signal>> {
    let signals = STOP_SIGNALS
        .iter()
        .map(|(_, number, _)| signal(SignalKind::from_raw(*number)))
        .collect::<std::io::Result<Vec<_>>>()?;
    for (_, number, _) in STOP_SIGNALS {
        // SAFETY: the action only stores to an atomic, which is async-signal-safe.
        unsafe {
            signal_hook_registry::register(number, move || {
                STOP_SIGNAL.store(number, Ordering::Relaxed)
            })
        }?;
    }
    Ok(signals)
}

/// The index of the first stopping signal received.
pub async fn any_signal(signals: &mut [Signal]) -> usize {
    std::future::poll_fn(|cx| {
        for (index, signal) in signals.iter_mut().enumerate() {
            if signal.poll_recv(cx).is_ready() {
                return Poll::Ready(index);
            }
        }
        Poll::Pending
    })
    .await
}

/// Records that the signal `STOP_SIGNALS[index]` stopped tracing, and passes it on.
pub fn stop(outcome: &mut Outcome, index: usize, child: Option<u32>) {
    let (name, number, pass_on) = STOP_SIGNALS[index];
    outcome.stopped_by = Some(name);
    if let (Some(pid), true) = (child, pass_on) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as i32, number) };
    }
}
