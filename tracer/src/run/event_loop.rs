//! The event loop: waits on the ring buffer, the traced processes' exits, Ctrl-C, SIGTERM,
//! SIGHUP and SIGQUIT, `--power`'s samples and a quarter-second tick; on any ending, stops
//! stopping processes, continues those waiting, detaches, drains the ring, settles the
//! losses and stops the sampler, so the footer that follows is complete and no process is
//! left stopped.
//!
//! Every drain is bounded, in records and in time, so a signal is seen within one drain
//! however fast the traced threads produce: the reader of a ring fed by more CPUs than it
//! has can never empty it. Once stopped, the probes are detached (nothing new arrives) and
//! the ring is drained to the end, or, when a signal stopped the run and time runs out,
//! what is left is counted (`not_drained`) rather than written.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    task::Poll,
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow};
use aya::maps::{MapData, RingBuf};
use tokio::{io::unix::AsyncFd, signal::unix::Signal};

use super::{
    bpf_stats,
    loss::NotDrained,
    outcome::Outcome,
    pipeline::Pipeline,
    power_feed::PowerFeed,
    signals::{self, any_signal, stop, stop_signal, stopping},
};
use tracer_common::attach_flags;

use crate::{
    events::{RawEvent, decode},
    probes::maps::CounterReader,
    sinks::progress::Progress,
    spawn,
};

/// Records one drain passes down the pipeline at most before the loop looks at signals
/// and the clock again.
const DRAIN_RECORDS: usize = 65536;
/// Time one drain takes at most while tracing.
const DRAIN_TIME: Duration = Duration::from_millis(50);
/// Time from a stopping signal to the footer: detaching and the last drain. What the ring
/// still holds after it is counted, not written.
const STOP_TIME: Duration = Duration::from_millis(500);

/// The stopping signals' streams and the watched processes' exits, registered up front.
pub struct Watches {
    signals: Vec<Signal>,
    /// pidfds, readable once their process exits.
    exits: Vec<(u32, AsyncFd<OwnedFd>)>,
    /// Processes to watch were given, and all had exited before the watch was set up.
    all_gone: bool,
    /// `--duration`: when the window's end stops tracing.
    close_at: Option<tokio::time::Instant>,
}

impl Watches {
    /// Must run inside the runtime's context. Tracing ends when every `watched` process
    /// has exited (none: only a signal ends it), or at `close_at` (the window's end).
    pub fn new(watched: &[u32], close_at: Option<tokio::time::Instant>) -> Result<Self> {
        let signals = signals::watch()?;
        let mut exits = Vec::new();
        for pid in watched {
            match pidfd_open(*pid) {
                Ok(fd) => exits.push((*pid, watch(fd, "a pidfd")?)),
                // Gone already: nothing to wait for.
                Err(error) if error.raw_os_error() == Some(libc::ESRCH) => {}
                Err(error) => return Err(anyhow::Error::from(error).context("pidfd_open")),
            }
        }
        Ok(Watches {
            all_gone: !watched.is_empty() && exits.is_empty(),
            signals,
            exits,
            close_at,
        })
    }
}

/// The index of the first watched process that exited.
async fn any_exit(exits: &[(u32, AsyncFd<OwnedFd>)]) -> usize {
    std::future::poll_fn(|cx| {
        for (index, (_, fd)) in exits.iter().enumerate() {
            if fd.poll_read_ready(cx).is_ready() {
                return Poll::Ready(index);
            }
        }
        Poll::Pending
    })
    .await
}

/// What the event loop reads beside `--power`'s sampler, and what ends it.
pub struct Sources {
    pub ring: RingBuf<MapData>,
    /// The kernel's drop counters.
    pub counters: CounterReader,
    pub watches: Watches,
    /// The command, running: reaped for its exit status, passed SIGTERM and SIGHUP on.
    pub child: Option<u32>,
    /// `-p PID --gpu`: the processes the injection library was put into, told to end
    /// their window before the probes go.
    pub late: Vec<u32>,
}

/// How long the libraries started late have to say their window ended (their last records
/// flushed, every kind off) before the probes go.
const DETACH_WAIT: Duration = Duration::from_secs(3);

/// Runs until the watched processes exit or a signal stops tracing, then detaches, drains
/// and settles: the pipeline's figures and `power`'s are complete after it.
pub async fn event_loop(
    pipeline: &mut Pipeline<'_>,
    sources: Sources,
    power: &mut Option<PowerFeed>,
    quiet: bool,
) -> Result<Outcome> {
    let Sources {
        ring,
        counters,
        watches,
        child,
        late,
    } = sources;
    let Watches {
        signals,
        exits,
        all_gone,
        close_at,
    } = watches;
    let mut tracing = Tracing {
        ring: watch(ring, "the ring buffer")?,
        counters,
        signals,
        exits,
        close_at,
        child,
        progress: Progress::new(quiet),
        outcome: Outcome::default(),
    };
    // `-p` targets that were gone before the watch started: nothing more will come.
    if !all_gone {
        tracing.trace(pipeline, power).await?;
    }
    crate::phases::reached("tracing_stopped");
    tracing.end_late_starts(pipeline, &late).await?;
    crate::phases::reached("late_starts_ended");
    let not_drained = tracing.detach_and_drain(pipeline)?;
    crate::phases::reached("probes_detached");
    tracing.settle(pipeline, power, not_drained).await?;
    crate::phases::reached("settled");
    let Tracing {
        signals,
        exits,
        child,
        mut outcome,
        ..
    } = tracing;
    if pipeline.write_failed().is_some() && outcome.stopped_by.is_none() {
        // The trace could not be written: the command's life goes on as it would have,
        // its signals passed on, until it ends.
        wait_for_the_rest(&mut outcome, exits, signals, child).await;
    }
    Ok(outcome)
}

/// The event loop's own state: what it watches, and how tracing is ending.
struct Tracing {
    ring: AsyncFd<RingBuf<MapData>>,
    counters: CounterReader,
    signals: Vec<Signal>,
    /// The watched processes still running.
    exits: Vec<(u32, AsyncFd<OwnedFd>)>,
    /// `--duration`: when the window's end stops tracing.
    close_at: Option<tokio::time::Instant>,
    child: Option<u32>,
    progress: Progress,
    outcome: Outcome,
}

impl Tracing {
    /// Traces until the watched processes exit, a signal stops tracing, the window closes
    /// or the trace cannot be written.
    async fn trace(
        &mut self,
        pipeline: &mut Pipeline<'_>,
        power: &mut Option<PowerFeed>,
    ) -> Result<()> {
        let Tracing {
            ring,
            counters,
            signals,
            exits,
            close_at,
            child,
            progress,
            outcome,
        } = self;
        let (child, close_at) = (*child, *close_at);
        let mut ticker = tokio::time::interval(Duration::from_millis(250));
        // `--gpu`: the ring is read often, so that a program's own CUPTI client taking and
        // letting go of recording is followed at once (its few calls do not wake the reader).
        let mut cupti_clients = tokio::time::interval(Duration::from_millis(5));
        cupti_clients.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let sampling =
            |power: &Option<PowerFeed>| power.as_ref().is_some_and(PowerFeed::is_sampling);
        loop {
            if let Some(index) = stop_signal() {
                stop(outcome, index, child);
                return Ok(());
            }
            if let Some(error) = pipeline.write_failed() {
                // Said at once; recording stops, the command goes on (waited for below).
                eprintln!(
                    "cudatrace: error: cannot write the trace ({error}): recording stops here; the \
                     command goes on untraced and cudatrace waits for it to end (exit 73 then)"
                );
                return Ok(());
            }
            tokio::select! {
                guard = ring.readable_mut() => {
                    let mut guard = guard?;
                    let drained =
                        pipeline.drain(guard.get_inner_mut(), DRAIN_RECORDS, DRAIN_TIME, &stopping)?;
                    if drained.empty {
                        // Drained: wait for the next wakeup (the fd is edge-triggered).
                        guard.clear_ready();
                    } else {
                        // Still full: let the runtime poll its driver, which is what delivers
                        // signals and exits; a ring that never empties must not starve them.
                        drop(guard);
                        tokio::task::yield_now().await;
                    }
                }
                index = any_exit(exits), if !exits.is_empty() => {
                    let (pid, _) = exits.swap_remove(index);
                    if child == Some(pid) {
                        let (code, signal) = spawn::reap(pid);
                        outcome.code = code;
                        outcome.signal = signal;
                    }
                    if exits.is_empty() {
                        return Ok(());
                    }
                }
                index = any_signal(signals) => {
                    stop(outcome, index, child);
                    return Ok(());
                }
                _ = tokio::time::sleep_until(close_at.unwrap_or_else(tokio::time::Instant::now)),
                    if close_at.is_some() => {
                    // The window's end: recording stops as when the command ends (the whole
                    // ring is drained); the command runs on.
                    outcome.window_closed = true;
                    return Ok(());
                }
                batch = async { power.as_mut().expect("sampling").next().await }, if sampling(power) => {
                    match batch {
                        Some(lines) => pipeline.power(&lines)?,
                        // The sampler ended on its own: its figures say why.
                        None => *power = power.take().map(PowerFeed::ended),
                    }
                }
                _ = cupti_clients.tick(), if pipeline.gpu() => {
                    pipeline.drain(ring.get_mut(), DRAIN_RECORDS, DRAIN_TIME, &stopping)?;
                }
                _ = ticker.tick() => tick(pipeline, ring.get_mut(), counters, progress)?,
            }
        }
    }

    /// `-p PID --gpu`: tells each library started late to end its window (and says which
    /// processes started since made CUDA calls without it), and reads the ring until each
    /// said so (its DETACHED record, after its last records) or its process is gone, within
    /// [`DETACH_WAIT`]. A library that does not answer stops on its own once it finds this
    /// cudatrace gone.
    async fn end_late_starts(&mut self, pipeline: &mut Pipeline<'_>, late: &[u32]) -> Result<()> {
        if late.is_empty() {
            return Ok(());
        }
        for &pid in late {
            pipeline.ask_detach(pid);
            if pipeline.driver_calls(pid) == 0 {
                eprintln!(
                    "cudatrace: --gpu: process {pid} made no CUDA driver call in the window: it \
                     gave the GPU no work to record"
                );
            }
        }
        // The attached processes' children started since: traced on the call side, but the
        // library does not follow them.
        for (pid, calls) in pipeline.driver_calls_by_process() {
            if !late.contains(&pid) {
                eprintln!(
                    "cudatrace: --gpu: process {pid}, started after the attach, made {calls} CUDA \
                     driver calls in the window: the injection library does not follow new \
                     processes (a fork child's copy leaves CUPTI alone, an exec'd program has \
                     none), so its launches, copies and memsets are counted not_recorded"
                );
            }
        }
        let deadline = Instant::now() + DETACH_WAIT;
        let waiting = |pipeline: &Pipeline| -> Vec<u32> {
            late.iter()
                .copied()
                .filter(|&pid| {
                    !pipeline.detached(pid)
                        && std::path::Path::new(&format!("/proc/{pid}")).exists()
                })
                .collect()
        };
        loop {
            pipeline.drain(self.ring.get_mut(), DRAIN_RECORDS, DRAIN_TIME, &|| false)?;
            let left = waiting(pipeline);
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                eprintln!(
                    "cudatrace: warning: --gpu: the injection library of process(es) {left:?} did \
                     not say its window ended within {DETACH_WAIT:?}; it stops recording on its \
                     own when it finds cudatrace gone; records it sends later are not in the trace"
                );
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops recording at once, and stopping processes (those stopped go on); closes the
    /// links (the kernel takes its time) while the ring is drained, then drains what the
    /// last in-flight calls left: all of it when the command ended, as much as the time
    /// allows when a signal stopped the run. Returns what was left in the ring.
    fn detach_and_drain(&mut self, pipeline: &mut Pipeline<'_>) -> Result<NotDrained> {
        let stop = Instant::now();
        let deadline = self.outcome.stopped_by.map(|_| stop + STOP_TIME);
        bpf_stats::report();
        let closing = pipeline.end_probes()?;
        let ring = self.ring.get_mut();
        let never = || false;
        while !closing.is_finished() && !past(deadline) {
            if pipeline
                .drain(ring, DRAIN_RECORDS, left(deadline), &never)?
                .empty
            {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        if closing.join().is_err() {
            return Err(anyhow!("detaching the probes panicked"));
        }
        while !past(deadline)
            && !pipeline
                .drain(ring, DRAIN_RECORDS, left(deadline), &never)?
                .empty
        {}
        Ok(count_rest(ring))
    }

    /// Whatever still waits goes out, the last losses are counted and the sampler stops.
    async fn settle(
        &mut self,
        pipeline: &mut Pipeline<'_>,
        power: &mut Option<PowerFeed>,
        not_drained: NotDrained,
    ) -> Result<()> {
        pipeline.finish()?;
        let mut kernel = self.counters.read()?;
        kernel.child_unseen += self.counters.children_unseen();
        pipeline.account_losses(kernel, not_drained)?;
        if let Some(feed) = power.take() {
            *power = Some(feed.finish(|lines| pipeline.power(lines)).await?);
        }
        self.progress.finish();
        pipeline.flush()?;
        Ok(())
    }
}

/// Every quarter second: what the ring holds below its wakeup threshold, the pipeline's
/// waiting lines, the losses, the progress line, the trace flushed.
fn tick(
    pipeline: &mut Pipeline<'_>,
    ring: &mut RingBuf<MapData>,
    counters: &CounterReader,
    progress: &mut Progress,
) -> Result<()> {
    // Records below the wakeup threshold raise no readiness: collect them here.
    pipeline.drain(ring, DRAIN_RECORDS, DRAIN_TIME, &stopping)?;
    pipeline.tick()?;
    pipeline.account_losses(counters.read()?, NotDrained::default())?;
    progress.update(pipeline.calls_written(), pipeline.lost());
    // A live trace can be followed (`tail -f`) a quarter second behind.
    pipeline.flush()?;
    Ok(())
}

/// Waits until every watched process has exited, passing stopping signals on to the
/// command as tracing does (the first one is what stopped the run).
async fn wait_for_the_rest(
    outcome: &mut Outcome,
    mut exits: Vec<(u32, AsyncFd<OwnedFd>)>,
    mut signals: Vec<Signal>,
    child: Option<u32>,
) {
    while !exits.is_empty() {
        tokio::select! {
            index = any_exit(&exits) => {
                let (pid, _) = exits.swap_remove(index);
                if child == Some(pid) {
                    let (code, signal) = spawn::reap(pid);
                    outcome.code = code;
                    outcome.signal = signal;
                }
            }
            index = any_signal(&mut signals) => {
                let stopped_by = outcome.stopped_by;
                stop(outcome, index, child);
                outcome.stopped_by = stopped_by.or(outcome.stopped_by);
            }
        }
    }
}

fn past(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|deadline| Instant::now() >= deadline)
}

/// Time left before `deadline` (no deadline: no limit).
fn left(deadline: Option<Instant>) -> Duration {
    deadline.map_or(Duration::MAX, |deadline| {
        deadline.saturating_duration_since(Instant::now())
    })
}

/// Reads and counts what the ring still holds, without writing it. The probes are detached,
/// so this ends; the bound only guards against a producer left attached by mistake.
fn count_rest(ring: &mut RingBuf<MapData>) -> NotDrained {
    let mut rest = NotDrained::default();
    for _ in 0..(1usize << 24) {
        let Some(record) = ring.next() else { break };
        let kind = record.get(..4).map_or(0, |bytes| {
            u32::from_ne_bytes(bytes.try_into().unwrap_or_default())
        });
        if let Ok(RawEvent::Attach(event)) = decode(&record) {
            // For the attach layer, no line; a process it stopped goes on.
            if event.header.flags & attach_flags::STOPPED != 0 {
                // SAFETY: kill(2) of a process our probes stopped.
                unsafe { libc::kill(event.header.pid as i32, libc::SIGCONT) };
            }
            continue;
        }
        if crate::events::is_call_kind(kind) {
            rest.calls += 1;
        } else {
            rest.other += 1;
        }
    }
    rest
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
