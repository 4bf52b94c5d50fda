//! A trace's lines drawn as a timeline: each call becomes a slice on its thread's track
//! (named by kernel, direction and size), driver events slices beside it, process and lost
//! lines instants, live device bytes a counter, and launches flow arrows to their
//! synchronisation. `--gpu` traces add a track per GPU and stream with the kernels, copies
//! and memsets that ran there, and an arrow from each call to the work it issued. The
//! analysis runs along, so traces without kernel names or live bytes get them.
//!
//! Here the exporter, its names, tracks and call labels; the lines are drawn in
//! `calls.rs`, `gpu.rs` (`--gpu`), `lines.rs` (process, lost, driver and power lines) and
//! `stacks.rs` (`--stacks`: the calls' Python stacks, the layer tracks) and `samples.rs`
//! (`--stacks`: the stacks as samples of calls and GPU time, for flame graphs).

mod calls;
mod gpu;
mod lines;
mod samples;
mod stacks;

pub use stacks::CUT_MARKER;

use std::{
    borrow::Cow,
    io::{self, BufRead},
};

use foldhash::{HashMap, HashSet};

use super::{
    arguments::Arguments,
    filters::Filters,
    flows::{FlowTracker, GpuFlows},
    power::GpuTracks,
    timeline::{ExportStats, ProcessName, TimelineSink, Track},
};
use crate::{
    analysis::{Analysis, Role, families::Families},
    format::push_bytes,
    reader::{ReadError, TraceLines},
    schema::{CallLine, Header, Line},
};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("writing the export: {0}")]
    Write(#[from] io::Error),
}

/// Process names, announced to the sink when first needed and after a change.
#[derive(Default)]
struct Names {
    /// Current name, and whether it is the command line from the header (kept over exec).
    processes: HashMap<u32, (String, bool)>,
    /// The process that forked each process, where the trace saw the fork.
    parents: HashMap<u32, u32>,
    announced: HashMap<u32, String>,
    threads: HashSet<Track>,
    /// The track of the last event, announced under its process's current name.
    current: Option<Track>,
}

impl Names {
    fn name(&self, pid: u32) -> Cow<'_, str> {
        match self.processes.get(&pid) {
            Some((name, _)) => Cow::Borrowed(name),
            None => Cow::Owned(format!("pid {pid}")),
        }
    }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

pub struct Exporter<'f, S> {
    sink: S,
    filters: &'f Filters,
    analysis: Analysis,
    families: Families,
    flows: FlowTracker,
    /// `--gpu` traces (the header says so): calls waiting for their GPU work's arrow.
    gpu_flows: Option<GpuFlows>,
    /// `--gpu`: per (device, pid, stream), where each lane's last slice ends.
    gpu_lanes: HashMap<(u32, u32, u32), Vec<u64>>,
    names: Names,
    /// Trace clock value of time 0: the header's start, else 0.
    base_ns: u64,
    stats: ExportStats,
    /// Device bytes of processes before the time window, drawn at its start.
    counter_before_window: HashMap<u32, u64>,
    /// A call's (or GPU activity's) arguments, reused from line to line.
    args: Arguments,
    /// The GPUs' groups (named from `--power`'s header) and `--power`'s counter tracks.
    gpus: GpuTracks,
    /// NCCL rank tracks by (pid, communicator, rank, nranks).
    nccl_tracks: HashMap<(u32, String, Option<i32>, Option<i32>), Track>,
    /// Per (pid, tid), the last collective's rank-track slice, held until the next
    /// collective of the thread shows whether it ran inside that one.
    pending_rank_slices: HashMap<(u32, u32), RankSlice>,
    /// `--stacks` traces: the stacks, and the layer entries being drawn.
    /// (Boxed: the exporter's hot fields stay together for traces without stacks.)
    stacks: Option<Box<stacks::ExportStacks>>,
    /// Layer entries ready to draw, reused.
    layers_ready: Vec<stacks::LayerEntry>,
}

/// A collective call's slice on its rank's track, not yet drawn.
struct RankSlice {
    track: Track,
    /// Relative to the trace's start.
    ts_ns: u64,
    dur_ns: u64,
    label: String,
    /// Sorted when the slice is drawn.
    args: Arguments,
    /// The call's own clock span and function.
    call_ts_ns: u64,
    call_end_ns: u64,
    function: String,
}

impl<'f, S: TimelineSink> Exporter<'f, S> {
    pub fn new(filters: &'f Filters, sink: S) -> Self {
        Exporter {
            sink,
            filters,
            analysis: Analysis::default(),
            families: Families::default(),
            flows: FlowTracker::default(),
            gpu_flows: None,
            gpu_lanes: HashMap::default(),
            names: Names::default(),
            base_ns: 0,
            stats: ExportStats::default(),
            counter_before_window: HashMap::default(),
            args: Arguments::default(),
            gpus: GpuTracks::default(),
            nccl_tracks: HashMap::default(),
            pending_rank_slices: HashMap::default(),
            stacks: None,
            layers_ready: Vec::new(),
        }
    }

    /// Reads every line and draws it; the sink's `finish` last. Each line comes with
    /// whether it has no escapes ([`no_escapes`]).
    pub fn run(
        mut self,
        mut lines: TraceLines<impl BufRead, bool>,
    ) -> Result<ExportStats, ExportError> {
        while let Some((line, no_escapes)) = lines.next_prepared()? {
            match line {
                Line::Header(header) => self.header(header)?,
                Line::Call(record) => self.call(record, *no_escapes)?,
                Line::Process(process) => self.process(process)?,
                Line::Lost(lost) => self.lost(lost)?,
                Line::Driver(driver) => self.driver(driver)?,
                Line::Power(power) => self.power(power)?,
                Line::Gpu(gpu) => self.gpu(gpu)?,
                Line::Library(library) => self.families.add_library(library),
                Line::Stack(stack) => self
                    .stacks
                    .get_or_insert_with(Box::default)
                    .stack_line(stack),
                Line::Interpreter(_) | Line::Footer(_) => {}
                Line::Unknown => self.stats.unknown_lines += 1,
            }
        }
        let mut pending: Vec<RankSlice> = std::mem::take(&mut self.pending_rank_slices)
            .into_values()
            .collect();
        pending.sort_by_key(|slice| slice.call_ts_ns);
        for slice in pending {
            self.rank_slice(slice)?;
        }
        if let Some(stacks) = &mut self.stacks {
            stacks.finish(&mut self.layers_ready);
            if self.stats.gpu_samples > 0 {
                self.stats.gpu_ns_unsampled = stacks
                    .samples
                    .unsampled_gpu_ns(self.filters.gpu_sample_ns());
            }
            self.draw_layers()?;
        }
        for (pid, bytes) in std::mem::take(&mut self.counter_before_window) {
            self.counter(pid, self.filters.start_ns.unwrap_or(0), bytes)?;
        }
        self.stats.lines = lines.lines;
        self.stats.skipped_lines = lines.skipped_lines;
        self.stats.cut_warning = lines.cut_warning();
        self.stats.flows_dropped =
            self.flows.dropped + self.gpu_flows.as_ref().map_or(0, |f| f.dropped);
        self.sink.finish(&self.stats)?;
        Ok(self.stats)
    }

    fn relative(&self, ts_ns: u64) -> u64 {
        ts_ns.saturating_sub(self.base_ns)
    }

    fn header(&mut self, header: &Header) -> io::Result<()> {
        self.base_ns = header.start_monotonic_ns.unwrap_or(0);
        self.families = Families::from_header(header);
        self.gpus.header(header);
        if header.gpu.is_some() {
            self.gpu_flows = Some(GpuFlows::default());
        }
        if header.stacks.is_some() {
            let stacks = self.stacks.get_or_insert_with(Box::default);
            stacks.gpu = header.gpu.is_some();
        }
        if let (Some(pid), false) = (header.pids.first(), header.command.is_empty()) {
            let mut name = header.command.join(" ");
            if name.chars().count() > 80 {
                name = name.chars().take(79).chain(['…']).collect();
            }
            self.names.processes.insert(*pid, (name, true));
        }
        self.sink.header(header, self.base_ns)
    }

    /// Names a process before an event of it, and again after it changed.
    fn announce_process(&mut self, pid: u32) -> io::Result<()> {
        let name = self.names.name(pid);
        if self.names.announced.get(&pid).map(String::as_str) == Some(&*name) {
            return Ok(());
        }
        let name = name.into_owned();
        self.sink.process(&ProcessName {
            pid,
            name: &name,
            parent: self.names.parents.get(&pid).copied(),
        })?;
        self.names.announced.insert(pid, name);
        Ok(())
    }

    /// Announces the track's process and thread before an event on it.
    fn track(&mut self, track: Track) -> io::Result<()> {
        // Runs of events on one thread: nothing to announce after the first.
        if self.names.current == Some(track) {
            return Ok(());
        }
        let (pid, tid, driver) = match track {
            Track::Thread { pid, tid } => (pid, tid, false),
            Track::Driver { pid, tid } => (pid, tid, true),
            Track::Layers { pid, tid } => {
                self.announce_process(pid)?;
                if self.names.threads.insert(track) {
                    self.sink
                        .thread(track, &format!("Python layers, tid {tid}"))?;
                }
                self.names.current = Some(track);
                return Ok(());
            }
            Track::Gpu {
                device,
                pid,
                stream,
                lane,
            } => {
                if self.gpus.first_sight(device) {
                    self.sink.gpu(device, &self.gpus.name(device))?;
                }
                if self.names.threads.insert(track) {
                    let mut name = format!("stream {stream}, pid {pid} ({})", self.names.name(pid));
                    if lane > 0 {
                        name.push_str(&format!(", overlapping {lane}"));
                    }
                    self.sink.thread(track, &name)?;
                }
                return Ok(());
            }
            Track::Global | Track::Nccl { .. } => return Ok(()),
        };
        self.announce_process(pid)?;
        if self.names.threads.insert(track) {
            let thread_name = match (driver, tid == pid) {
                (false, true) => "main thread".to_owned(),
                (false, false) => "thread".to_owned(),
                (true, _) => format!("NVIDIA driver, tid {tid}"),
            };
            self.sink.thread(track, &thread_name)?;
        }
        self.names.current = Some(track);
        Ok(())
    }

    fn counter(&mut self, pid: u32, ts_ns: u64, bytes: u64) -> io::Result<()> {
        self.announce_process(pid)?;
        self.sink.counter(pid, ts_ns, bytes)?;
        self.stats.counters += 1;
        Ok(())
    }
}

/// A call's slice name: launches by kernel, copies and memsets with direction and size,
/// failures with their error.
pub fn call_label(record: &CallLine, role: Role) -> Cow<'_, str> {
    let mut label = match role {
        Role::Launch => match (&record.kernel, record.function) {
            (Some(kernel), _) => Cow::Borrowed(kernel.as_str()),
            (None, Some(function)) => Cow::Owned(format!("function {:#x}", function.0)),
            (None, None) => Cow::Borrowed(record.name.as_str()),
        },
        Role::Copy => {
            let mut label = String::with_capacity(record.name.len() + 32);
            label.push_str(&record.name);
            if let Some(kind) = &record.kind {
                label.push(' ');
                label.push_str(kind);
            }
            if let Some(bytes) = record.bytes {
                label.push(' ');
                push_bytes(&mut label, bytes);
            }
            Cow::Owned(label)
        }
        Role::Memset => match record.bytes {
            Some(bytes) => {
                let mut label = String::with_capacity(record.name.len() + 16);
                label.push_str(&record.name);
                label.push(' ');
                push_bytes(&mut label, bytes);
                Cow::Owned(label)
            }
            None => Cow::Borrowed(record.name.as_str()),
        },
        _ => Cow::Borrowed(record.name.as_str()),
    };
    if !record.ok() {
        let label = label.to_mut();
        label.push_str(" → ");
        match &record.ret_name {
            Some(name) => label.push_str(name),
            None => label.push_str(&format!("error {}", record.ret.unwrap_or(0))),
        }
    }
    label
}

/// The reader's [`Prepare`](crate::reader::Prepare) for an export: whether the line has
/// no backslash, and so none of its strings has anything JSON escapes (a quote or a
/// control character can only be in a string escaped). Checked on the reader's workers.
pub fn no_escapes(bytes: &[u8], _: &Line) -> bool {
    memchr::memchr(b'\\', bytes).is_none()
}
