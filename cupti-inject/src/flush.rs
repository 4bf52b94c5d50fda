//! Getting records out: a thread asks CUPTI for completed buffers every period (and follows
//! cudatrace's control slot, `control.rs`), and an `atexit` handler forces out the rest.
//! Also the clocks: CLOCK_MONOTONIC, and clock pairs where records come on CUPTI's clock.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracer_common::{GpuRecord, gpu_record, gpu_stage};

use crate::buffers::read_completed;
use crate::cupti::{CUPTI_SUCCESS, Cupti, FLUSH_FORCED};
use crate::sender::Sender;
use crate::session::session;
use crate::{ENV_FLUSH_MS, Failure, Uprobe, control, env_number, report, report_now, sender};

/// How often CUPTI is asked for completed buffers, by default.
const DEFAULT_FLUSH_PERIOD: Duration = Duration::from_millis(200);

/// Whether the periodic flush has stopped (set at exit); held while flushing.
static FLUSH_STOPPED: Mutex<bool> = Mutex::new(false);

/// The flush period: [`ENV_FLUSH_MS`] (10 ms at least), else 200 ms.
pub fn period() -> Duration {
    env_number(ENV_FLUSH_MS).map_or(DEFAULT_FLUSH_PERIOD, |ms| Duration::from_millis(ms.max(10)))
}

/// Registers the exit flush and starts the flush thread.
pub fn start() {
    // SAFETY: a plain function, run once at normal exit.
    unsafe { libc::atexit(at_exit) };
    if let Err(e) = std::thread::Builder::new()
        .name("cudatrace-flush".into())
        .spawn(flush_periodically)
    {
        report_now(Failure {
            stage: gpu_stage::FLUSH,
            result: 0,
            detail: 0,
            fatal: false,
            message: format!(
                "cannot start the flush thread ({e}): records arrive in full buffers and at exit"
            ),
        });
    }
}

/// Asks CUPTI for completed buffers every period until exit, except while another client
/// holds the activity API; wakes early when cudatrace changes the control slot.
fn flush_periodically() {
    let period = period();
    loop {
        control::wait(period);
        let stopped = FLUSH_STOPPED.lock().unwrap_or_else(|e| e.into_inner());
        if *stopped {
            return;
        }
        control::follow();
        if !control::yielded() {
            flush(0);
        } else {
            // Buffers of ours another client's flush handed back.
            read_completed();
        }
    }
}

/// One flush; the caller holds [`FLUSH_STOPPED`], so exit waits for it.
fn flush(flag: u32) {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    let Some(session) = session() else {
        return;
    };
    // A pair before the buffers' records: taken after they were stamped, on the clock of
    // the latest of them (another client's timestamp callback may have changed it).
    if session.clock_flags != 0
        && let Some(sender) = sender().as_mut()
    {
        send_clock_pair(&session.cupti, sender);
    }
    // SAFETY: callbacks were registered; CUPTI calls buffer_completed before returning.
    let rc = unsafe { (session.cupti.flush_all)(flag) };
    read_completed();
    if rc != CUPTI_SUCCESS && !REPORTED.swap(true, Ordering::Relaxed) {
        report_now(Failure {
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
    if let Some(sender) = sender().as_mut() {
        sender.flush();
    }
}

/// At normal exit: stop the periodic flush, then force out every buffer, incomplete
/// records included, so a short program loses nothing. Registered after libcupti was
/// loaded, so it runs before libcupti's own teardown. Not while another client holds the
/// activity API: the buffers are its own then.
extern "C" fn at_exit() {
    let Some(session) = session() else {
        return;
    };
    if session.pid != std::process::id() {
        // A forked child: CUPTI is not set up here, and the lock may be held forever.
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        let mut stopped = FLUSH_STOPPED.lock().unwrap_or_else(|e| e.into_inner());
        *stopped = true;
        control::follow();
        if !control::yielded() && !control::held_by_other() {
            flush(FLUSH_FORCED);
        } else {
            read_completed();
            if let Some(sender) = sender().as_mut() {
                sender.flush();
            }
        }
    });
}

/// CLOCK_MONOTONIC in ns: the trace's clock.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(clock, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Pairs read for one CLOCK record: the tightest is kept.
const CLOCK_PAIR_TRIES: usize = 4;

/// Queues a CLOCK record: CUPTI's timestamp and CLOCK_MONOTONIC (the midpoint of two reads
/// around it), the tightest of [`CLOCK_PAIR_TRIES`] reads. A midpoint is off by up to half
/// the time between its two reads, and one read can be slow (the first touches pages for
/// the first time; the thread can be preempted): 16 µs off at `cuInit` under QEMU's TCG,
/// enough to put a call's CUPTI record before the call.
pub fn send_clock_pair(cupti: &Cupti, sender: &mut Sender<Uprobe>) {
    let mut tightest: Option<(u64, u64, u64)> = None;
    for _ in 0..CLOCK_PAIR_TRIES {
        let mut cupti_ns = 0;
        let before = monotonic_ns();
        // SAFETY: reads the clock only.
        let rc = unsafe { (cupti.get_timestamp)(&mut cupti_ns) };
        let after = monotonic_ns();
        if rc != CUPTI_SUCCESS {
            report(
                sender,
                Failure {
                    stage: gpu_stage::TIMESTAMP,
                    result: rc,
                    detail: 0,
                    fatal: false,
                    message: format!("cuptiGetTimestamp failed: {}", cupti.result_string(rc)),
                },
            );
            return;
        }
        let gap = after.saturating_sub(before);
        if tightest.is_none_or(|(best, _, _)| gap < best) {
            tightest = Some((gap, cupti_ns, before + gap / 2));
        }
    }
    if let Some((_, cupti_ns, monotonic)) = tightest {
        sender.push(GpuRecord {
            what: gpu_record::CLOCK,
            start: cupti_ns,
            end: monotonic,
            ..GpuRecord::default()
        });
    }
}
