//! `cudatrace run`'s pipeline, top to bottom: **source** (the ring buffer) → **decode**
//! (`events::Decoder`: the probe catalog names each call's arguments; GPU records get their
//! process's kernel names and clock) → **enrich** (`analysis::Analysis`: kernel names and
//! live device bytes into the line; GPU work linked to its call; the run's stages and
//! figures) → **sinks** (`sinks::jsonl::TraceWriter`; the progress line reads its counts).
//! Each stage knows only the one before it; this file wires them. `--power`'s sampler is a
//! second source: its lines need no decoding and go through enrich and sinks.
//!
//! Beside it, the probes (`attaching.rs`, over the attach layer `probes::discovery`) take
//! the records that are for them rather than for the trace: a library opened, a fork, an
//! exec (they attach, give a `library` line for a new file, and continue the stopped
//! process), and every exit (the process's probes go).

use std::{
    io,
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use tracer_common::proc_event;

use super::{
    attaching::{Attaching, NotAttached},
    window::WindowFilter,
};
use crate::{
    analysis::Analysis,
    clock::monotonic_ns,
    events::{Decoder, Event, RawEvent, decode, gpu::GpuEvent},
    probes::maps::Counters,
    schema::{GpuLine, Line, LostLine, PowerLine},
    sinks::jsonl::TraceWriter,
};

pub struct Pipeline<'a> {
    pub decoder: Decoder,
    pub attaching: &'a mut Attaching,
    pub analysis: &'a mut Analysis,
    pub writer: &'a mut TraceWriter,
    /// `--gpu` lines the enrich stage released, on their way to the writer.
    pub gpu_lines: Vec<GpuLine>,
    /// Records CUPTI said it dropped (`--gpu`), for the loss accounting.
    pub cupti_dropped: u64,
    /// Libraries a process could not be given its probes on, for the loss accounting.
    pub library_not_attached: u64,
    /// `--gpu` was given.
    pub gpu: bool,
    /// `--start-at`/`--duration`: the lines outside the window are analysed, not written.
    pub window: Option<WindowFilter>,
}

/// What one drain did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drained {
    pub records: usize,
    /// The ring was found empty (rather than the budget running out).
    pub empty: bool,
}

/// Records between two looks at the clock.
const CLOCK_EVERY: usize = 256;

impl<'a> Pipeline<'a> {
    pub fn new(
        decoder: Decoder,
        attaching: &'a mut Attaching,
        analysis: &'a mut Analysis,
        writer: &'a mut TraceWriter,
        gpu: bool,
    ) -> Self {
        Pipeline {
            decoder,
            attaching,
            analysis,
            writer,
            gpu_lines: Vec::new(),
            cupti_dropped: 0,
            library_not_attached: 0,
            gpu,
            window: None,
        }
    }

    /// The kernel's counters with the losses only userspace sees (CUPTI's).
    pub fn counters(&self, mut kernel: Counters) -> Counters {
        kernel.cupti_dropped = self.cupti_dropped;
        kernel.library_not_attached = self.library_not_attached;
        kernel
    }

    /// The source: passes records from the ring down the pipeline until it is empty, or
    /// `records` of them have passed, or `time` has elapsed, or `stop` says so.
    pub fn drain(
        &mut self,
        ring: &mut RingBuf<MapData>,
        records: usize,
        time: Duration,
        stop: &dyn Fn() -> bool,
    ) -> io::Result<Drained> {
        let deadline = Instant::now().checked_add(time);
        let mut n = 0;
        while n < records {
            if n % CLOCK_EVERY == CLOCK_EVERY - 1
                && (deadline.is_some_and(|deadline| Instant::now() >= deadline) || stop())
            {
                break;
            }
            let Some(record) = ring.next() else {
                return Ok(Drained {
                    records: n,
                    empty: true,
                });
            };
            self.record(&record)?;
            n += 1;
        }
        Ok(Drained {
            records: n,
            empty: false,
        })
    }

    /// One record through decode, enrich and the sinks (or to the attach layer).
    fn record(&mut self, bytes: &[u8]) -> io::Result<()> {
        let raw = decode(bytes);
        match &raw {
            Ok(RawEvent::Attach(event)) => {
                let (lines, not_attached) = self.attaching.handle(event);
                for line in lines {
                    self.writer.write(&line)?;
                }
                if let Some(lost) = not_attached {
                    self.library_lost(event.header.ts_ns, lost)?;
                }
                return Ok(());
            }
            Ok(RawEvent::Proc(event)) if event.what == proc_event::EXIT => {
                self.attaching.process_exited(event.header.pid);
            }
            _ => {}
        }
        let mut line = match self.decoder.decode_raw(raw, self.attaching.plans()) {
            Some(Event::Line(line)) => line,
            Some(Event::Gpu(gpu)) => return self.gpu(gpu),
            None => return Ok(()),
        };
        self.analysis.line(&mut line);
        if self
            .window
            .as_mut()
            .is_none_or(|window| window.keeps(&line))
        {
            self.writer.line(&line)?;
        }
        if let Line::Process(process) = &line
            && process.event.ends_address_space()
        {
            self.analysis
                .end_gpu(Some(process.pid), &mut self.gpu_lines);
            self.write_gpu_lines()?;
        }
        self.decoder.recycle(line);
        Ok(())
    }

    /// A library a process did not get its probes on: a loss, its own `lost` line naming
    /// it (the loss accounting counts it in the footer, without a line of its own).
    fn library_lost(&mut self, ts_ns: u64, lost: NotAttached) -> io::Result<()> {
        self.library_not_attached += 1;
        let footer = &self.writer.footer.lost;
        // Everything lost so far: the last tick's figures, with this run's library losses.
        let total = footer.total - footer.library_not_attached + self.library_not_attached;
        self.writer.write(&LostLine {
            ts_ns,
            reason: "library_not_attached".into(),
            count: 1,
            total,
            library: Some(lost.library),
            pid: Some(lost.pid),
            error: Some(lost.error),
            ..LostLine::default()
        })
    }

    fn gpu(&mut self, event: GpuEvent) -> io::Result<()> {
        if let GpuEvent::Dropped { count, .. } = event {
            self.cupti_dropped += count;
            return Ok(());
        }
        self.analysis
            .enrich_gpu(event, monotonic_ns(), &mut self.gpu_lines);
        self.write_gpu_lines()
    }

    /// Every tick: GPU work that waited too long for its call's record goes out unlinked.
    pub fn tick(&mut self) -> io::Result<()> {
        self.analysis
            .expire_gpu(monotonic_ns(), &mut self.gpu_lines);
        self.write_gpu_lines()
    }

    /// Tracing ended and the ring is drained: whatever still waits goes out.
    pub fn finish(&mut self) -> io::Result<()> {
        self.analysis.end_gpu(None, &mut self.gpu_lines);
        self.write_gpu_lines()
    }

    fn write_gpu_lines(&mut self) -> io::Result<()> {
        for line in self.gpu_lines.drain(..) {
            if let GpuLine::Error(error) = &line {
                // Errors print even with -q: the user asked for GPU activity.
                eprintln!(
                    "cudatrace: GPU recording, pid {} ({}): {}",
                    error.pid, error.stage, error.message
                );
            }
            if self
                .window
                .as_mut()
                .is_none_or(|window| window.keeps_gpu(&line))
            {
                self.writer.gpu(&line)?;
            }
        }
        Ok(())
    }

    /// `--power`: one tick's lines through enrich and the sinks.
    pub fn power(&mut self, lines: &[PowerLine]) -> io::Result<()> {
        for line in lines {
            self.analysis.power_sample(line);
            if self
                .window
                .as_mut()
                .is_none_or(|window| window.keeps_time(line.ts_ns))
            {
                self.writer.write(line)?;
            }
        }
        Ok(())
    }
}
