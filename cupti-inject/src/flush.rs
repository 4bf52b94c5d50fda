//! Getting records out: CUPTI is asked for completed buffers every period (the owner's
//! flush thread, which also follows cudatrace's control slot), and once more at exit,
//! incomplete records included.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tracer_common::gpu_stage;

use crate::buffers::Buffers;
use crate::cupti::CUPTI_SUCCESS;
use crate::env;
use crate::outbox::{Failure, Outbox};
use crate::session::Session;

/// How often CUPTI is asked for completed buffers, by default.
const DEFAULT_FLUSH_PERIOD: Duration = Duration::from_millis(200);

/// The flush period: [`env::FLUSH_MS`] (10 ms at least), else 200 ms.
pub fn period() -> Duration {
    env::number(env::FLUSH_MS).map_or(DEFAULT_FLUSH_PERIOD, |ms| Duration::from_millis(ms.max(10)))
}

/// Flushing's state: stopped at exit, and whether a failure was reported.
pub struct Flush {
    /// Whether the periodic flush has stopped (set at exit); held while flushing.
    stopped: Mutex<bool>,
    /// A failed `cuptiActivityFlushAll` is reported once.
    failure_reported: AtomicBool,
}

impl Flush {
    pub const fn new() -> Self {
        Flush {
            stopped: Mutex::new(false),
            failure_reported: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, bool> {
        self.stopped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The flush lock, to hold while flushing; `None` once flushing stopped at exit.
    pub fn running(&self) -> Option<MutexGuard<'_, bool>> {
        Some(self.lock()).filter(|stopped| !**stopped)
    }

    /// Stops the periodic flush; the lock is held by the caller until it lets go of it.
    pub fn stop(&self) -> MutexGuard<'_, bool> {
        let mut stopped = self.lock();
        *stopped = true;
        stopped
    }

    /// One flush (`flag`: 0, or `FLUSH_FORCED`); the caller holds the flush lock, so exit
    /// waits for it.
    pub fn flush(&self, flag: u32, session: &Session, buffers: &Buffers, outbox: &Outbox) {
        // A pair before the buffers' records: taken after they were stamped, on the clock
        // of the latest of them (another client's timestamp callback may have changed it).
        if session.clock_flags != 0
            && let Some(sender) = outbox.lock().as_mut()
        {
            session.send_clock_pair(sender);
        }
        // SAFETY: callbacks were registered; CUPTI calls buffer_completed before returning.
        let rc = unsafe { (session.cupti.flush_all)(flag) };
        buffers.read_completed(session, outbox);
        if rc != CUPTI_SUCCESS && !self.failure_reported.swap(true, Ordering::Relaxed) {
            outbox.report(Failure {
                stage: gpu_stage::FLUSH,
                result: rc,
                detail: flag,
                fatal: false,
                message: format!(
                    "cuptiActivityFlushAll failed: {}",
                    session.cupti.result_string(rc)
                ),
            });
        }
        outbox.flush();
    }
}
