//! `cudatrace run`'s pipeline, top to bottom: **source** (the ring buffer) → **decode**
//! (`events::Decoder`: the probe catalog names each call's arguments; GPU records get their
//! process's kernel names and clock) → **enrich** (`analysis::Analysis`: kernel names and
//! live device bytes into the line; GPU work linked to its call; the run's stages and
//! figures) → **sinks** (`sinks::jsonl::TraceWriter`; the progress line reads its counts).
//! Each stage knows only the one before it; this file wires them. `--power`'s sampler is a
//! second source: its lines need no decoding and go through enrich and sinks.
//!
//! With `--gpu`, lines pass through an ordered queue (`queue.rs`) before enrich: GPU
//! records are linked to their calls as they come (`analysis::gpu_link`), a launch's line
//! waits for CUPTI's record of it, and what the program's own CUPTI client does is
//! followed (the control file tells the injection library to yield or resume).
//!
//! Beside it, the probes (`attaching.rs`, over the attach layer `probes::discovery`) take
//! the records that are for them rather than for the trace: a library opened, a fork, an
//! exec (they attach, give a `library` line for a new file, and continue the stopped
//! process), and every exit (the process's probes go).

use std::{
    io,
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};
use tracer_common::{
    AttachEvent, EventHeader, GpuRecord, proc_event,
    stacks::{RawPyFrame, StackEvent},
};

use super::{
    attaching::{Attaching, NotAttached},
    loss::{LossAccount, LossFigures, NotDrained},
    queue::{Item, OutputQueue},
    window::WindowFilter,
};
use crate::{
    analysis::{
        Analysis,
        gpu_link::{ClientChange, Node, NodeLink},
    },
    clock::monotonic_ns,
    events::{Decoder, Event, RawEvent, RawGpu, decode, gpu::GpuEvent},
    inject::control::ControlFile,
    probes::maps::Counters,
    schema::{GpuLine, Line, LostLine, PowerLine, StacksFooter, WindowFooter},
    sinks::jsonl::TraceWriter,
    stacks::{self, StackLines, Stacks},
};

/// How long a graph's work line waits for the rest of its graph launch at most.
const NODE_WAIT: Duration = Duration::from_secs(1);

pub struct Pipeline<'a> {
    decoder: Decoder,
    attaching: &'a mut Attaching,
    analysis: &'a mut Analysis,
    writer: &'a mut TraceWriter,
    /// The kernel's drop counters and the losses only userspace sees, as `lost` lines.
    loss: LossAccount,
    /// Records CUPTI said it dropped (`--gpu`), for the loss accounting.
    cupti_dropped: u64,
    /// Libraries a process could not be given its probes on, for the loss accounting.
    library_not_attached: u64,
    /// `--gpu` was given.
    gpu: bool,
    /// `--start-at`/`--duration`: the lines outside the window are analysed, not written.
    window: Option<WindowFilter>,
    /// `--stacks`: the stacks stage (interpreters, stack records, the calls' stacks).
    stacks: Option<Stacks>,
    /// `--gpu`: the lines on their way to enrich and the writer.
    queue: OutputQueue,
    /// `--gpu`: how the injection libraries are told to yield or resume.
    control: Option<Arc<ControlFile>>,
    /// GPU lines the linker released, on their way to the queue.
    gpu_lines: Vec<GpuLine>,
    /// The front of the queue waits for the rest of its graph launch, since.
    node_wait: Option<Instant>,
    /// `-p PID --gpu`: the processes whose library said its window ended (DETACHED).
    detached: Vec<u32>,
    /// CUDA driver calls seen per process (not CUPTI's), for a window with none.
    driver_calls: std::collections::HashMap<u32, u64>,
}

/// The stages the pipeline runs beside enrich and the sinks: decode, and those the flags
/// ask for.
pub struct Stages {
    pub decoder: Decoder,
    /// `--start-at`/`--duration`: which lines are written.
    pub window: Option<WindowFilter>,
    /// `--stacks`' stage.
    pub stacks: Option<Stacks>,
    /// `--gpu`: the injection libraries' control file.
    pub control: Option<Arc<ControlFile>>,
}

/// What the pipeline's stages counted, for the footer.
pub struct PipelineFigures {
    pub loss: LossFigures,
    /// Records the decoder could not decode.
    pub undecodable: u64,
    pub stacks: Option<StacksFooter>,
    /// What the window left out (whether it closed is the event loop's to say).
    pub window: Option<WindowFooter>,
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
        stages: Stages,
        attaching: &'a mut Attaching,
        analysis: &'a mut Analysis,
        writer: &'a mut TraceWriter,
    ) -> Self {
        let Stages {
            decoder,
            window,
            stacks,
            control,
        } = stages;
        let gpu = control.is_some();
        if gpu {
            analysis.linker().hold_launches = true;
        }
        Pipeline {
            decoder,
            attaching,
            analysis,
            writer,
            loss: LossAccount::new(gpu),
            cupti_dropped: 0,
            library_not_attached: 0,
            gpu,
            window,
            stacks,
            queue: OutputQueue::default(),
            control,
            gpu_lines: Vec::new(),
            node_wait: None,
            detached: Vec::new(),
            driver_calls: std::collections::HashMap::new(),
        }
    }

    /// CUDA driver calls of process `pid` seen so far (CUPTI's own calls left out).
    pub fn driver_calls(&self, pid: u32) -> u64 {
        self.driver_calls.get(&pid).copied().unwrap_or(0)
    }

    /// Every process with CUDA driver calls seen so far, and how many, by pid.
    pub fn driver_calls_by_process(&self) -> Vec<(u32, u64)> {
        let mut calls: Vec<(u32, u64)> = self
            .driver_calls
            .iter()
            .map(|(&pid, &calls)| (pid, calls))
            .collect();
        calls.sort_unstable();
        calls
    }

    /// `-p PID --gpu`: asks the library in `pid` to end its window (flush, every kind off).
    pub fn ask_detach(&self, pid: u32) {
        if let Some(control) = &self.control {
            control.detach(pid);
        }
    }

    /// `-p PID --gpu`: whether the library in `pid` said its window ended.
    pub fn detached(&self, pid: u32) -> bool {
        self.detached.contains(&pid)
    }

    /// `--gpu` was given.
    pub fn gpu(&self) -> bool {
        self.gpu
    }

    /// Tracing ends: the probes stop recording and go to a thread that detaches them
    /// (see [`Attaching::end`]); their last records are still drained through here.
    pub fn end_probes(&mut self) -> anyhow::Result<JoinHandle<()>> {
        self.attaching.end()
    }

    /// The first write of the trace that failed.
    pub fn write_failed(&self) -> Option<&io::Error> {
        self.writer.failed()
    }

    /// Call lines written so far.
    pub fn calls_written(&self) -> u64 {
        self.writer.footer.events.call
    }

    /// Everything lost so far, as last accounted.
    pub fn lost(&self) -> u64 {
        self.loss.lost()
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    /// Writes a `lost` line for each reason that grew since the last look: the kernel's
    /// counters, the losses only userspace sees, and `not_drained`.
    pub fn account_losses(&mut self, kernel: Counters, not_drained: NotDrained) -> io::Result<()> {
        let now = self.counters(kernel);
        self.loss.update(now, not_drained, self.writer)
    }

    /// Tracing is over: what the stages counted.
    pub fn figures(self) -> PipelineFigures {
        PipelineFigures {
            loss: self.loss.figures(),
            undecodable: self.decoder.undecodable,
            stacks: self.stacks.as_ref().map(Stacks::footer),
            window: self.window.map(|window| window.footer),
        }
    }

    /// The kernel's counters with the losses only userspace sees (CUPTI's, libraries not
    /// attached, and GPU work never recorded).
    fn counters(&mut self, mut kernel: Counters) -> Counters {
        kernel.cupti_dropped = self.cupti_dropped;
        kernel.library_not_attached = self.library_not_attached;
        if self.gpu {
            [
                kernel.gpu_cupti_held,
                kernel.gpu_no_api_record,
                kernel.gpu_not_flushed,
                kernel.gpu_not_recorded,
                kernel.gpu_missing,
            ] = self.analysis.linker().unrecorded();
        }
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

    /// One record through decode, enrich and the sinks (or to the attach layer, or the
    /// stacks stage).
    fn record(&mut self, bytes: &[u8]) -> io::Result<()> {
        let raw = decode(bytes);
        // Whether the call's probe has stacks, and whether `--stack-every` or
        // `--stack-rate` skipped it.
        let (mut stacked, mut left_out) = (false, None);
        match &raw {
            Ok(RawEvent::GpuBatch {
                header,
                records,
                missing,
            }) => return self.gpu_batch(header, records, *missing),
            Ok(RawEvent::Attach(event)) => return self.attach_event(event),
            Ok(RawEvent::Stack { event, frames }) => return self.stack_record(event, frames),
            Ok(RawEvent::Code { head, data }) => {
                if let Some(stacks) = &mut self.stacks {
                    stacks.code(head, data);
                }
                return Ok(());
            }
            Ok(RawEvent::Proc(event)) if event.what != proc_event::FORK => {
                if event.what == proc_event::EXIT {
                    self.attaching.process_exited(event.header.pid);
                }
                if let Some(stacks) = &mut self.stacks {
                    stacks.forget(event.header.pid);
                }
            }
            // The probe's stacks bit, looked up only when there are stacks to give. A known
            // stack that came in the call's own record goes first, as its record would
            // have come before the call.
            Ok(RawEvent::Call { call, stack, .. }) if self.stacks.is_some() => {
                if let Some(stack) = stack {
                    self.stack_record(stack, &[])?;
                    if let Some(stacks) = &mut self.stacks {
                        stacks.known_in_call();
                    }
                }
                stacked = self
                    .attaching
                    .plans()
                    .probe(call.probe_id)
                    .is_some_and(|probe| probe.stacks);
                left_out = stacks::left_out(call.header.flags);
            }
            _ => {}
        }
        let event = self.decoder.decode_raw(raw, self.attaching.plans());
        self.decoded(event, stacked, left_out)
    }

    /// A decoded record to its stage: a line to the sinks (a stacked call's through the
    /// stacks stage first), a GPU record to enrich.
    fn decoded(
        &mut self,
        event: Option<Event>,
        stacked: bool,
        left_out: Option<stacks::Reason>,
    ) -> io::Result<()> {
        match event {
            Some(Event::Line(mut line)) => {
                if stacked && let (Some(stacks), Line::Call(call)) = (&mut self.stacks, &mut line) {
                    // The footer's stacks count the call lines written: a window's alone.
                    let written = self
                        .window
                        .as_ref()
                        .is_none_or(|window| window.info.contains(call.ts_ns));
                    stacks.call(call, left_out, written);
                }
                self.line(line)
            }
            Some(Event::Gpu(event)) => {
                self.gpu_arrived(event);
                self.settle(false)
            }
            None => Ok(()),
        }
    }

    /// A batch of GPU records: each through decode and enrich as if it came alone; those
    /// the entry was too short to hold count as undecodable, one each.
    fn gpu_batch(
        &mut self,
        header: &EventHeader,
        records: &[GpuRecord],
        missing: u32,
    ) -> io::Result<()> {
        self.decoder.undecodable += u64::from(missing);
        for record in records {
            let raw = Ok(RawEvent::Gpu(RawGpu {
                header: EventHeader {
                    kind: tracer_common::kind::GPU,
                    ..*header
                },
                record: *record,
                text: None,
            }));
            let event = self.decoder.decode_raw(raw, self.attaching.plans());
            self.decoded(event, false, None)?;
        }
        Ok(())
    }

    /// For the attach layer, no line of its own: it attaches, and a new library file
    /// gets its `library` line, a process that could not get its probes a `lost` line.
    fn attach_event(&mut self, event: &AttachEvent) -> io::Result<()> {
        // While the process waits: its interpreter, before its probes let it go on.
        if let Some(line) = self.stacks.as_mut().and_then(|s| s.attach_event(event)) {
            self.writer.write(&line)?;
        }
        let (lines, not_attached) = self.attaching.handle(event);
        for line in lines {
            self.writer.write(&line)?;
        }
        if let Some(lost) = not_attached {
            self.library_lost(event.header.ts_ns, lost)?;
        }
        Ok(())
    }

    /// A stack record, to the stacks stage: its `stack` (and `interpreter`) lines.
    fn stack_record(&mut self, event: &StackEvent, frames: &[RawPyFrame]) -> io::Result<()> {
        let Some(stacks) = &mut self.stacks else {
            return Ok(());
        };
        for line in stacks.stack(event, frames) {
            match line {
                StackLines::Interpreter(line) => self.writer.write(&line)?,
                StackLines::Stack(line) => self.writer.write(&line)?,
            }
        }
        Ok(())
    }

    /// A decoded line: enrich, then the sinks; with `--gpu`, through the queue.
    fn line(&mut self, mut line: Line) -> io::Result<()> {
        if self.gpu {
            self.line_arrived(line);
            return self.settle(false);
        }
        self.analysis.line(&mut line);
        if self.kept(&line) {
            self.writer.line(&line)?;
        }
        self.decoder.recycle(line);
        Ok(())
    }

    /// `--gpu`: a decoded line, into the queue.
    fn line_arrived(&mut self, line: Line) {
        match &line {
            Line::Call(call) => {
                if !call.name.starts_with("cupti") {
                    *self.driver_calls.entry(call.pid).or_default() += 1;
                }
                let (hold, change) = self.analysis.linker().call_arrived(call);
                if let Some(change) = change {
                    self.tell(call.pid, change);
                }
                if hold {
                    self.queue.push_held(line);
                    return;
                }
            }
            Line::Process(process) if process.event.ends_address_space() => {
                self.analysis
                    .linker()
                    .end_process(process.pid, &mut self.gpu_lines);
                self.queue_gpu_lines();
            }
            _ => {}
        }
        self.queue.push(Item::Line(line));
    }

    /// `--gpu`: a GPU record, to the linker; the lines it gives, into the queue.
    fn gpu_arrived(&mut self, event: GpuEvent) {
        let now = monotonic_ns();
        let linker = self.analysis.linker();
        match event {
            GpuEvent::Dropped { count, .. } => self.cupti_dropped += count,
            GpuEvent::Started(info, session) => {
                let change = linker.started(session, info.ts_ns);
                if let Some(change) = change {
                    self.tell(session.pid, change);
                }
                self.gpu_lines.push(GpuLine::Info(info));
            }
            GpuEvent::Client {
                pid,
                resumed,
                ts_ns,
            } => linker.client(pid, resumed, ts_ns),
            GpuEvent::Attached { pid, ts_ns } => linker.attached(pid, ts_ns),
            GpuEvent::HeldAtAttach { pid, ts_ns } => {
                linker.held_at_attach(pid, ts_ns);
                eprintln!(
                    "cudatrace: --gpu: process {pid}: another CUPTI client (torch.profiler, \
                     Nsight, ...) holds CUPTI: its GPU work is not recorded while it does \
                     (gpu_gap, cupti_held); its own records are untouched"
                );
                // Marked held, so that its letting go (seen on libcupti) wakes the library.
                self.tell(pid, ClientChange::Taken { ts_ns, tid: 0 });
            }
            GpuEvent::Detached { pid, ts_ns } => {
                linker.detached(pid, ts_ns);
                self.detached.push(pid);
            }
            GpuEvent::Api(api) => linker.api(api, now, &mut self.gpu_lines),
            GpuEvent::Line(GpuLine::Error(error)) => {
                if error.fatal {
                    linker.failed(error.pid, error.ts_ns);
                }
                self.gpu_lines.push(GpuLine::Error(error));
            }
            GpuEvent::Line(line) => linker.work(line, now, &mut self.gpu_lines),
        }
        self.queue_gpu_lines();
    }

    /// Tells the process's injection library that another CUPTI client took or let go of
    /// the activity API.
    fn tell(&self, pid: u32, change: ClientChange) {
        if let Some(control) = &self.control {
            control.set(pid, matches!(change, ClientChange::Taken { .. }));
        }
    }

    fn queue_gpu_lines(&mut self) {
        for line in self.gpu_lines.drain(..) {
            self.queue.push(Item::Gpu(Box::new(line)));
        }
    }

    /// Lets held lines go as the linker says, then writes what may go.
    fn settle(&mut self, force: bool) -> io::Result<()> {
        self.queue_gpu_lines();
        for hold in self.analysis.linker().holds.drain(..) {
            self.queue
                .release(hold.pid, hold.tid, hold.ts_ns, hold.result);
        }
        let nodes_due = force
            || self
                .node_wait
                .is_some_and(|since| since.elapsed() >= NODE_WAIT);
        while let Some(item) = self.queue.pop_ready(force) {
            match item {
                Item::Line(line) => self.write_line(line)?,
                Item::Gpu(mut line) => {
                    let (pid, correlation) = line
                        .work()
                        .map_or((0, 0), |work| (work.pid, work.link.correlation_id));
                    let queue = &self.queue;
                    let replay = || queued_nodes(queue, pid, correlation);
                    let linked = self
                        .analysis
                        .linker()
                        .line_written(&mut line, replay, nodes_due);
                    if linked == NodeLink::Wait {
                        self.node_wait.get_or_insert_with(Instant::now);
                        self.queue.put_back(Item::Gpu(line));
                        break;
                    }
                    self.node_wait = None;
                    self.write_gpu(&mut line)?;
                }
            }
        }
        Ok(())
    }

    fn write_line(&mut self, mut line: Line) -> io::Result<()> {
        self.analysis.line(&mut line);
        match &line {
            Line::Call(call) => self.analysis.linker().call_written(call),
            Line::Process(process) if process.event.ends_address_space() => {
                for gap in self.analysis.linker().finish_process(process.pid) {
                    self.write_gpu(&mut GpuLine::Gap(gap))?;
                }
            }
            _ => {}
        }
        if self.kept(&line) {
            self.writer.line(&line)?;
        }
        self.decoder.recycle(line);
        Ok(())
    }

    /// Whether the window (if any) keeps `line`; it counts what it does not.
    fn kept(&mut self, line: &Line) -> bool {
        self.window.as_mut().is_none_or(|window| window.keeps(line))
    }

    /// A library a process did not get its probes on: a loss, its own `lost` line naming
    /// it (the loss accounting counts it in the footer, without a line of its own).
    fn library_lost(&mut self, ts_ns: u64, lost: NotAttached) -> io::Result<()> {
        self.library_not_attached += 1;
        let last = self.loss.last();
        // Everything lost so far: the last tick's figures, with this run's library losses.
        let total = last.total - last.library_not_attached + self.library_not_attached;
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

    fn write_gpu(&mut self, line: &mut GpuLine) -> io::Result<()> {
        if let GpuLine::Error(error) = &line {
            // Errors print even with -q: the user asked for GPU activity.
            eprintln!(
                "cudatrace: GPU recording, pid {} ({}): {}",
                error.pid, error.stage, error.message
            );
        }
        self.analysis.written_gpu_line(line);
        if self
            .window
            .as_mut()
            .is_none_or(|window| window.keeps_gpu(line))
        {
            self.writer.gpu(line)?;
        }
        Ok(())
    }

    /// Every tick: GPU work that waited too long for its call's record goes out unlinked,
    /// launch lines that waited too long go as they are.
    pub fn tick(&mut self) -> io::Result<()> {
        if !self.gpu {
            return Ok(());
        }
        self.analysis
            .linker()
            .expire(monotonic_ns(), &mut self.gpu_lines);
        self.settle(false)
    }

    /// Tracing ended and the ring is drained: whatever still waits goes out, and every
    /// launch, copy and memset is counted.
    pub fn finish(&mut self) -> io::Result<()> {
        if !self.gpu {
            return Ok(());
        }
        self.analysis.linker().finish(&mut self.gpu_lines);
        self.settle(true)?;
        for gap in self.analysis.linker().finish_all() {
            self.write_gpu(&mut GpuLine::Gap(gap))?;
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

/// The nodes of graph launch `correlation` of process `pid` waiting in the queue.
fn queued_nodes(queue: &OutputQueue, pid: u32, correlation: u32) -> Vec<Node> {
    queue
        .gpu_lines()
        .filter(|line| {
            line.work()
                .is_some_and(|w| w.pid == pid && w.link.correlation_id == correlation)
        })
        .filter_map(Node::of)
        .collect()
}
