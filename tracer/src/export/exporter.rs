//! A trace's lines drawn as a timeline: each call becomes a slice on its thread's track
//! (named by kernel, direction and size), driver events slices beside it, process and lost
//! lines instants, live device bytes a counter, and launches flow arrows to their
//! synchronisation. `--gpu` traces add a track per GPU and stream with the kernels, copies
//! and memsets that ran there, and an arrow from each call to the work it issued. The
//! analysis runs along, so traces without kernel names or live bytes get them.

use std::{
    borrow::Cow,
    io::{self, BufRead},
};

use foldhash::{HashMap, HashSet};
use serde_json::{Map, Value};

use super::{
    arguments::Arguments,
    call_args::{CallArgs, SliceArgs},
    filters::Filters,
    flows::{FlowStart, FlowTracker, GpuFlows, StreamKey, TO_GPU, TO_SYNC},
    power::GpuTracks,
    timeline::{ExportStats, Instant, ProcessName, Slice, TimelineSink, Track},
};
use crate::{
    analysis::{Analysis, Role, families::Families},
    catalog::{SyncOn, nccl::collective_op},
    format::{format_bytes, push_bytes},
    reader::{ReadError, TraceLines},
    schema::{CallLine, DriverLine, GpuLine, Header, Line, LostLine, PowerLine, ProcessLine},
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
                Line::Footer(_) => {}
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
        for (pid, bytes) in std::mem::take(&mut self.counter_before_window) {
            self.counter(pid, self.filters.start_ns.unwrap_or(0), bytes)?;
        }
        self.stats.lines = lines.lines;
        self.stats.skipped_lines = lines.skipped_lines;
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

    /// `no_escapes`: the line had none, so neither have its strings.
    fn call(&mut self, record: &mut CallLine, no_escapes: bool) -> io::Result<()> {
        let named = (record.kernel.is_some(), record.warnings.len());
        let role = self.analysis.annotate(record);
        // A kernel name the analysis added comes from another line, which may have had
        // escapes; its numbers need none.
        let plain = no_escapes && named == (record.kernel.is_some(), record.warnings.len());
        let ts = self.relative(record.ts_ns);
        let label = call_label(record, role);
        let pid_kept = self.filters.pid(record.pid);
        let kept = pid_kept
            && self.filters.span(ts, record.dur_or_zero())
            && self.filters.name(&record.name, &label);

        // Flows follow every call, kept or not: a filtered-out sync still ends its launches'
        // wait (the arrow needs both ends).
        // To its GPU work and to its synchronisation: at most two (not allocated).
        let mut flow_out = [0u64; 2];
        let mut flows_out = 0;
        let mut flows_in = Vec::new();
        let start = |id, name| FlowStart {
            id,
            pid: record.pid,
            tid: record.tid,
            ts_ns: ts + record.dur_or_zero() / 2,
            launch_ts_ns: record.ts_ns,
            kept,
            name,
        };
        if let Some(gpu_flows) = &mut self.gpu_flows
            && record.ok()
            && matches!(
                role,
                Role::Launch | Role::GraphLaunch | Role::Copy | Role::Memset
            )
        {
            let id = self.flows.next_id();
            gpu_flows.call(start(id, TO_GPU));
            if kept {
                flow_out[flows_out] = id;
                flows_out += 1;
            }
        }
        match role {
            Role::Launch | Role::GraphLaunch if record.ok() => {
                if let Some(stream) = StreamKey::of(record) {
                    let id = self.flows.next_id();
                    self.flows.launch(stream, start(id, TO_SYNC));
                    if kept {
                        flow_out[flows_out] = id;
                        flows_out += 1;
                    }
                }
            }
            Role::Sync(SyncOn::Context) => {
                flows_in = self.flows.sync_process(record.pid, record.ts_ns);
            }
            Role::Sync(SyncOn::Stream) => {
                if let Some(stream) = StreamKey::of(record) {
                    flows_in = self.flows.sync_stream(record.pid, stream, record.ts_ns);
                }
            }
            _ => {}
        }
        flows_in.retain(|start| start.kept && kept);

        if kept {
            let track = Track::Thread {
                pid: record.pid,
                tid: record.tid,
            };
            self.track(track)?;
            let category = self.families.of(&record.name).unwrap_or("other");
            // A call probed at entry alone (--launch-entry-only) is a zero-length slice.
            self.sink.slice(&Slice {
                track,
                ts_ns: ts,
                dur_ns: record.dur_or_zero(),
                name: &label,
                plain_name: plain,
                category,
                // A launch's slice is named by its kernel: the function called is an
                // argument.
                args: SliceArgs::Call(CallArgs {
                    record,
                    with_call: role == Role::Launch,
                    plain,
                }),
                flow_out: &flow_out[..flows_out],
                flows_in: &flows_in,
            })?;
            self.stats.slices += 1;
            self.stats.flows += flows_in.len() as u64;
            if let Some(op) = collective_op(&record.name) {
                self.collective(record, op, ts)?;
            }
        } else {
            self.stats.filtered += 1;
        }

        if let (Some(bytes), true) = (record.live_bytes, pid_kept) {
            // The bytes are those after the call.
            let end = ts.saturating_add(record.dur_or_zero());
            if self.filters.before_window(end) {
                self.counter_before_window.insert(record.pid, bytes);
            } else if self.filters.span(end, 0) {
                if let Some(before) = self.counter_before_window.remove(&record.pid) {
                    self.counter(record.pid, self.filters.start_ns.unwrap_or(0), before)?;
                }
                self.counter(record.pid, end, bytes)?;
            }
        }
        Ok(())
    }

    /// An NCCL collective call, again on its rank's track: one track per process,
    /// communicator (its unique id's start where known, else the `ncclComm_t`) and rank.
    fn collective(&mut self, record: &CallLine, op: &str, ts: u64) -> io::Result<()> {
        let comm = record.comm.map_or(0, |comm| comm.0);
        let communicator = self
            .analysis
            .nccl_comm(record.pid, comm)
            .and_then(|info| info.unique_id.as_deref())
            .map_or_else(
                || format!("{comm:#x}"),
                |id| format!("{}…", id.chars().take(16).collect::<String>()),
            );
        let key = (record.pid, communicator, record.rank, record.nranks);
        let track = match self.nccl_tracks.get(&key) {
            Some(track) => *track,
            None => {
                let track = Track::Nccl {
                    pid: record.pid,
                    index: self.nccl_tracks.len() as u32 + 1,
                };
                let name = nccl_track_name(&key.1, record.rank, record.nranks);
                self.nccl_tracks.insert(key, track);
                self.announce_process(record.pid)?;
                self.sink.thread(track, &name)?;
                track
            }
        };
        let mut label = match record.bytes {
            Some(bytes) => format!("{op} {}", format_bytes(bytes)),
            None => op.to_owned(),
        };
        if !record.ok() {
            label.push_str(" → ");
            match &record.ret_name {
                Some(name) => label.push_str(name),
                None => label.push_str(&format!("error {}", record.ret.unwrap_or(0))),
            }
        }
        let mut args = Arguments::default();
        args.fill(record, |key| !NCCL_ARGS.contains(&key));
        args.insert_text("call", &record.name);
        // A collective NCCL made inside another (ncclBcast runs as ncclBroadcast) is
        // drawn once: the outer call, which names the inner one.
        let thread = (record.pid, record.tid);
        let end = record.ts_ns + record.dur_or_zero();
        if let Some(previous) = self.pending_rank_slices.remove(&thread) {
            if record.ts_ns <= previous.call_ts_ns && previous.call_end_ns <= end {
                args.insert_text("ran_as", &previous.function);
            } else {
                self.rank_slice(previous)?;
            }
        }
        self.pending_rank_slices.insert(
            thread,
            RankSlice {
                track,
                ts_ns: ts,
                dur_ns: record.dur_or_zero(),
                label,
                args,
                call_ts_ns: record.ts_ns,
                call_end_ns: end,
                function: record.name.clone(),
            },
        );
        Ok(())
    }

    fn rank_slice(&mut self, mut slice: RankSlice) -> io::Result<()> {
        slice.args.sort();
        self.sink.slice(&Slice {
            track: slice.track,
            ts_ns: slice.ts_ns,
            dur_ns: slice.dur_ns,
            name: &slice.label,
            plain_name: false,
            category: "nccl_rank",
            args: SliceArgs::Collected(&slice.args),
            flow_out: &[],
            flows_in: &[],
        })?;
        self.stats.slices += 1;
        self.stats.nccl_slices += 1;
        Ok(())
    }

    fn counter(&mut self, pid: u32, ts_ns: u64, bytes: u64) -> io::Result<()> {
        self.announce_process(pid)?;
        self.sink.counter(pid, ts_ns, bytes)?;
        self.stats.counters += 1;
        Ok(())
    }

    fn process(&mut self, line: &ProcessLine) -> io::Result<()> {
        self.analysis.process_event(line.pid, &line.event);
        let ts = self.relative(line.ts_ns);
        let kept = self.filters.pid(line.pid) && self.filters.span(ts, 0);
        let name = match line.event.as_str() {
            "fork" => format!("fork: pid {}", line.child_pid.unwrap_or(0)),
            "exec" => format!("exec {}", line.filename.as_deref().unwrap_or("?")),
            other => other.to_owned(),
        };
        if kept {
            let track = Track::Thread {
                pid: line.pid,
                tid: line.tid,
            };
            self.track(track)?;
            let mut args = Map::new();
            for (key, value) in [
                ("child_pid", line.child_pid.map(Value::from)),
                ("comm", line.comm.clone().map(Value::from)),
                ("filename", line.filename.clone().map(Value::from)),
            ] {
                if let Some(value) = value {
                    args.insert(key.to_owned(), value);
                }
            }
            let args = Arguments::from_map(&args);
            self.sink.instant(&Instant {
                track,
                ts_ns: ts,
                name: &name,
                category: "process",
                args: &args,
            })?;
            self.stats.instants += 1;
        } else {
            self.stats.filtered += 1;
        }
        // Names take effect for the events after this one.
        self.names.current = None;
        match (
            line.event.as_str(),
            line.child_pid,
            &line.comm,
            &line.filename,
        ) {
            ("fork", Some(child), comm, _) => {
                self.names.parents.insert(child, line.pid);
                if let Some(comm) = comm {
                    self.names.processes.insert(child, (comm.clone(), false));
                }
            }
            ("exec", _, _, Some(filename)) => {
                let from_command = self.names.processes.get(&line.pid).is_some_and(|n| n.1);
                if !from_command {
                    let name = basename(filename).to_owned();
                    self.names.processes.insert(line.pid, (name, false));
                }
                self.flows.forget_process(line.pid);
            }
            ("exit", ..) => self.flows.forget_process(line.pid),
            _ => {}
        }
        if matches!(line.event.as_str(), "exec" | "exit")
            && let Some(gpu_flows) = &mut self.gpu_flows
        {
            gpu_flows.forget_process(line.pid);
        }
        Ok(())
    }

    /// A `--power` sample: a value on each of its GPU's counter tracks. The GPU's tracks
    /// are not any process's: `--pid` and `--name` keep them; the time window applies.
    fn power(&mut self, line: &PowerLine) -> io::Result<()> {
        let values = self.gpus.values(line);
        let ts = self.relative(line.ts_ns);
        if !self.filters.span(ts, 0) {
            self.stats.filtered += 1;
            return Ok(());
        }
        if self.gpus.first_sight(line.device) {
            self.sink.gpu(line.device, &self.gpus.name(line.device))?;
        }
        for (counter, value) in values {
            self.sink.gpu_counter(line.device, counter, ts, value)?;
            self.stats.counters += 1;
        }
        Ok(())
    }

    fn lost(&mut self, line: &LostLine) -> io::Result<()> {
        let ts = self.relative(line.ts_ns);
        if !self.filters.span(ts, 0) || !self.filters.pids.is_empty() {
            self.stats.filtered += 1;
            return Ok(());
        }
        let name = format!("lost {} events ({})", line.count, line.reason);
        let mut args = Map::new();
        args.insert("count".into(), line.count.into());
        args.insert("reason".into(), line.reason.clone().into());
        let args = Arguments::from_map(&args);
        self.sink.instant(&Instant {
            track: Track::Global,
            ts_ns: ts,
            name: &name,
            category: "lost",
            args: &args,
        })?;
        self.stats.instants += 1;
        Ok(())
    }

    fn driver(&mut self, line: &DriverLine) -> io::Result<()> {
        let ts = self.relative(line.ts_ns);
        let name = line.what();
        let kept = self.filters.pid(line.pid)
            && self.filters.span(ts, line.dur_ns)
            && self.filters.name(&line.hook, &name);
        if !kept {
            self.stats.filtered += 1;
            return Ok(());
        }
        let track = Track::Driver {
            pid: line.pid,
            tid: line.tid,
        };
        self.track(track)?;
        self.sink.slice(&Slice {
            track,
            ts_ns: ts,
            dur_ns: line.dur_ns,
            name: &name,
            plain_name: false,
            category: "driver",
            args: SliceArgs::Collected(&Arguments::from_map(&line.details())),
            flow_out: &[],
            flows_in: &[],
        })?;
        self.stats.slices += 1;
        self.stats.driver_slices += 1;
        Ok(())
    }

    /// A `--gpu` line: work as a slice on its GPU stream's track, with the arrow from its
    /// call; a recording start or error as a marker on the process's main thread.
    fn gpu(&mut self, line: &GpuLine) -> io::Result<()> {
        let Some(work) = line.work() else {
            return self.gpu_status(line);
        };
        let ts = self.relative(work.ts_ns);
        let label = gpu_label(line);
        let kind = match line {
            GpuLine::Kernel(_) => "gpu_kernel",
            GpuLine::Copy(_) => "gpu_copy",
            _ => "gpu_memset",
        };
        let kept = self.filters.pid(work.pid)
            && self.filters.span(ts, work.dur_ns)
            && self.filters.name(kind, &label)
            && work.link.timed();
        let flow = match (work.link.call(), &mut self.gpu_flows) {
            (Some((tid, call_ts)), Some(flows)) => flows.work(work.pid, tid, call_ts),
            _ => None,
        };
        if !kept {
            self.stats.filtered += 1;
            return Ok(());
        }
        // The first lane of the stream whose last slice ended by this one's start.
        let lanes = self
            .gpu_lanes
            .entry((work.device, work.pid, work.stream))
            .or_default();
        let lane = match lanes.iter().position(|end| *end <= ts) {
            Some(lane) => lane,
            None => {
                lanes.push(0);
                lanes.len() - 1
            }
        };
        lanes[lane] = ts.saturating_add(work.dur_ns);
        let track = Track::Gpu {
            device: self.gpus.group_of(work.device),
            pid: work.pid,
            stream: work.stream,
            lane: lane as u32,
        };
        self.announce_process(work.pid)?;
        self.track(track)?;
        let flows_in: Vec<FlowStart> = flow.into_iter().filter(|start| start.kept).collect();
        // Kernels can be as many as launches: their fields go into the reused arguments.
        let args = &mut self.args;
        args.clear();
        let skip = |key: &str| matches!(key, "type" | "pid" | "ts_ns" | "dur_ns");
        match line {
            GpuLine::Kernel(k) => args.fill(k, skip),
            GpuLine::Copy(c) => args.fill(c, skip),
            GpuLine::Memset(m) => args.fill(m, skip),
            GpuLine::Info(_) | GpuLine::Error(_) => {}
        }
        args.sort();
        self.sink.slice(&Slice {
            track,
            ts_ns: ts,
            dur_ns: work.dur_ns,
            name: &label,
            plain_name: false,
            category: "gpu",
            args: SliceArgs::Collected(&self.args),
            flow_out: &[],
            flows_in: &flows_in,
        })?;
        self.stats.slices += 1;
        self.stats.gpu_slices += 1;
        self.stats.flows += flows_in.len() as u64;
        Ok(())
    }

    fn gpu_status(&mut self, line: &GpuLine) -> io::Result<()> {
        let (pid, ts_ns, name, args) = match line {
            GpuLine::Info(info) => (
                info.pid,
                info.ts_ns,
                format!("GPU recording: CUPTI {}", info.cupti_version),
                serde_json::to_value(info),
            ),
            GpuLine::Error(error) => (
                error.pid,
                error.ts_ns,
                format!("GPU recording error ({}): {}", error.stage, error.message),
                serde_json::to_value(error),
            ),
            _ => return Ok(()),
        };
        let ts = self.relative(ts_ns);
        if !self.filters.pid(pid) || !self.filters.span(ts, 0) {
            self.stats.filtered += 1;
            return Ok(());
        }
        let mut args = match args {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        for key in ["type", "pid", "ts_ns"] {
            args.remove(key);
        }
        let track = Track::Thread { pid, tid: pid };
        self.track(track)?;
        self.sink.instant(&Instant {
            track,
            ts_ns: ts,
            name: &name,
            category: "gpu",
            args: &Arguments::from_map(&args),
        })?;
        self.stats.instants += 1;
        Ok(())
    }
}

/// The fields of a collective call its rank-track slice carries.
const NCCL_ARGS: [&str; 12] = [
    "comm", "rank", "nranks", "count", "datatype", "bytes", "op", "root", "peer", "stream",
    "group", "ret",
];

/// `NCCL rank 0/2 (comm 0a1b2c3d4e5f6071…)`; `?` for what is not known.
pub fn nccl_track_name(communicator: &str, rank: Option<i32>, nranks: Option<i32>) -> String {
    let known = |value: Option<i32>| value.map_or_else(|| "?".to_owned(), |v| v.to_string());
    format!(
        "NCCL rank {}/{} (comm {communicator})",
        known(rank),
        known(nranks)
    )
}

/// A GPU work slice's name: the kernel, or the copy's direction and size, or the memset's
/// size.
pub fn gpu_label(line: &GpuLine) -> String {
    match line {
        GpuLine::Kernel(k) => k.kernel.clone(),
        GpuLine::Copy(c) => format!("{} {}", c.kind, format_bytes(c.bytes)),
        GpuLine::Memset(m) => format!("memset {}", format_bytes(m.bytes)),
        GpuLine::Info(_) => "GPU recording".into(),
        GpuLine::Error(e) => format!("GPU recording error ({})", e.stage),
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
