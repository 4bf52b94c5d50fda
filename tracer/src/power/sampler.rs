//! The sampler: a thread of its own that reads every GPU every period and sends each
//! tick's lines to the event loop through a bounded channel. It never waits for the event
//! loop (a full channel drops the tick's lines and counts them), and the event loop never
//! waits for it (it receives in its `select!`).
//!
//! Ticks are due at `start + k × period`. A tick is sampled as soon as it is due; when the
//! sampler gets to it a whole period late or more (a slow read, a late wake-up on a busy
//! machine), the ticks passed are skipped and counted and the latest one is sampled at
//! once: every sample is taken within a period of its tick's time, and the sampler neither
//! drifts nor bursts. Stopping it takes one last sample at once.

use std::{
    collections::BTreeMap,
    sync::mpsc::{self as std_mpsc, RecvTimeoutError, TryRecvError},
    thread::JoinHandle,
    time::Duration,
};

use nvml_wrapper::Device;
use tokio::sync::mpsc;

use super::{fields::Sampled, library::Loaded, library::error_name};
use crate::{
    clock::monotonic_ns,
    schema::{PowerFooter, PowerLine},
};

/// One tick's lines, one per GPU.
pub type Batch = Vec<PowerLine>;

/// Ticks the channel holds before the sampler drops them (about 20 s at 20 ms).
const CHANNEL_TICKS: usize = 1024;

/// How long stopping may take (one last round of NVML reads) before it is given up.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The running sampler.
pub struct Sampler {
    stop: std_mpsc::Sender<()>,
    thread: JoinHandle<PowerFooter>,
}

impl Sampler {
    /// Starts sampling `devices` of `loaded` every `period`, from now, and returns once
    /// the first tick is sampled (or a second has passed): the command, released next,
    /// starts inside the samples, so its whole life has energy readings around it.
    pub fn start(
        loaded: Loaded,
        devices: Vec<Sampled>,
        period: Duration,
    ) -> std::io::Result<(Sampler, mpsc::Receiver<Batch>)> {
        let (lines, receiver) = mpsc::channel(CHANNEL_TICKS);
        let (stop, stop_requested) = std_mpsc::channel();
        let period_ns = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1);
        let (first_sampled, first_taken) = std_mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("cudatrace-power".into())
            .spawn(move || {
                let mut run = SamplerRun {
                    lines,
                    footer: PowerFooter::default(),
                    lines_sampled: 0,
                    read_ns_total: 0,
                };
                run.sample_until_stopped(
                    &loaded,
                    &devices,
                    period_ns,
                    &stop_requested,
                    first_sampled,
                );
                run.finish()
            })?;
        // A sampler that fails before its first tick says why in its footer.
        let _ = first_taken.recv_timeout(Duration::from_secs(1));
        Ok((Sampler { stop, thread }, receiver))
    }

    /// Asks for the last sample and the end; the caller drains the channel until it
    /// closes, then calls [`Sampler::join`].
    pub fn request_stop(&self) {
        let _ = self.stop.send(());
    }

    /// The sampler's figures, once its channel has closed.
    pub fn join(self) -> PowerFooter {
        self.thread.join().unwrap_or_else(|_| PowerFooter {
            error: Some("the sampler thread panicked".into()),
            ..PowerFooter::default()
        })
    }
}

struct SamplerRun {
    lines: mpsc::Sender<Batch>,
    footer: PowerFooter,
    lines_sampled: u64,
    read_ns_total: u64,
}

impl SamplerRun {
    fn sample_until_stopped(
        &mut self,
        loaded: &Loaded,
        devices: &[Sampled],
        period_ns: u64,
        stop_requested: &std_mpsc::Receiver<()>,
        first_sampled: std_mpsc::SyncSender<()>,
    ) {
        let mut first_sampled = Some(first_sampled);
        let mut handles = Vec::new();
        for sampled in devices {
            match loaded.nvml.device_by_index(sampled.index) {
                Ok(device) => handles.push((sampled, device)),
                Err(e) => self.count_error("nvmlDeviceGetHandleByIndex_v2", &error_name(&e)),
            }
        }
        let start = monotonic_ns();
        let mut tick: u64 = 0;
        loop {
            let due = start.saturating_add(tick.saturating_mul(period_ns));
            let now = monotonic_ns();
            let stop = if now < due {
                match stop_requested.recv_timeout(Duration::from_nanos(due - now)) {
                    Err(RecvTimeoutError::Timeout) => false,
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
                }
            } else {
                !matches!(stop_requested.try_recv(), Err(TryRecvError::Empty))
            };
            if !stop {
                // Woken (or finished the last reads) a period late or more: the ticks
                // passed are skipped, the latest one is sampled now.
                let latest_due = monotonic_ns().saturating_sub(start) / period_ns;
                if latest_due > tick {
                    self.footer.skipped_ticks += latest_due - tick;
                    tick = latest_due;
                }
            }
            let batch = self.sample(&handles, tick);
            if let Some(first) = first_sampled.take() {
                let _ = first.send(());
            }
            if stop {
                // The last sample: it waits for room, the event loop is draining.
                let _ = self.lines.blocking_send(batch);
                return;
            }
            if self.lines.try_send(batch).is_err() {
                self.footer.dropped_samples += 1;
            }
            tick += 1;
        }
    }

    /// One tick: every GPU's fields, each line stamped right after its reads.
    fn sample(&mut self, handles: &[(&Sampled, Device<'_>)], seq: u64) -> Batch {
        self.footer.samples += 1;
        let mut batch = Vec::with_capacity(handles.len());
        for (sampled, device) in handles {
            let mut line = PowerLine {
                device: sampled.index,
                seq,
                ..PowerLine::default()
            };
            let reads_start = monotonic_ns();
            for field in &sampled.fields {
                if let Err(error) = field.read(device, &mut line) {
                    let name = error_name(&error);
                    self.count_error(field.function(), &name);
                    line.errors.insert(field.key().to_owned(), name);
                }
            }
            line.ts_ns = monotonic_ns();
            line.read_ns = line.ts_ns - reads_start;
            self.lines_sampled += 1;
            self.read_ns_total += line.read_ns;
            self.footer.read_ns_max = self.footer.read_ns_max.max(line.read_ns);
            batch.push(line);
        }
        batch
    }

    fn count_error(&mut self, function: &str, error: &str) {
        *self
            .footer
            .read_errors
            .entry(format!("{function}: {error}"))
            .or_default() += 1;
    }

    fn finish(mut self) -> PowerFooter {
        self.footer.read_ns_mean = self.read_ns_total / self.lines_sampled.max(1);
        self.footer
    }
}

/// `--power`'s errors during sampling, for the closing lines: `function: ERROR ×n, ...`.
pub fn describe_errors(errors: &BTreeMap<String, u64>) -> String {
    errors
        .iter()
        .map(|(what, count)| format!("{what} ×{count}"))
        .collect::<Vec<_>>()
        .join(", ")
}
