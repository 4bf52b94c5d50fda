//! `cudatrace export TRACE.jsonl`: the trace as a timeline for the Perfetto UI and
//! chrome://tracing (docs/export.md has the mapping).
//!
//! Lines are read, analysed (kernel names, live device bytes) and written one at a time:
//! memory holds the launches waiting for their synchronisation and a few entries per
//! process and thread, never the trace.

mod args;
mod chrome;
mod flows;
mod perfetto;
pub mod proto;

pub use args::{ExportArgs, ExportFormat};

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io::{self, BufRead, BufReader, BufWriter, Write},
    path::{Path, PathBuf},
    time::Instant as Clock,
};

use anyhow::anyhow;
use serde_json::{Map, Value};

use self::{
    chrome::ChromeWriter,
    flows::{FlowStart, FlowTracker, StreamKey},
    perfetto::PerfettoWriter,
};
use crate::{
    analysis::{Analysis, Role, classify, families::Families},
    exit::{ExitCode, Failure},
    format::format_bytes,
    reader::{ReadError, TraceLines},
    schema::{CallLine, DriverLine, Header, Line, LostLine, ProcessLine},
};

/// Which events to keep. Times are nanoseconds since the export's time base.
#[derive(Clone, Debug, Default)]
pub struct Filters {
    pub pids: Vec<u32>,
    /// Substrings of a call's function or slice name (case-sensitive); any one matches.
    pub names: Vec<String>,
    pub start_ns: Option<u64>,
    pub end_ns: Option<u64>,
}

impl Filters {
    fn pid(&self, pid: u32) -> bool {
        self.pids.is_empty() || self.pids.contains(&pid)
    }

    fn name(&self, function: &str, label: &str) -> bool {
        self.names.is_empty()
            || self
                .names
                .iter()
                .any(|n| function.contains(n.as_str()) || label.contains(n.as_str()))
    }

    /// A slice overlapping the window is kept whole.
    fn span(&self, ts: u64, dur: u64) -> bool {
        self.start_ns
            .is_none_or(|start| ts.saturating_add(dur) >= start)
            && self.end_ns.is_none_or(|end| ts <= end)
    }

    fn before_window(&self, ts: u64) -> bool {
        self.start_ns.is_some_and(|start| ts < start)
    }
}

/// Figures of one export, printed on stderr and checked by the tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    pub lines: u64,
    /// Complete slices: calls and driver events.
    pub slices: u64,
    pub driver_slices: u64,
    /// Process (fork/exec/exit) and lost-event markers.
    pub instants: u64,
    pub counters: u64,
    pub flows: u64,
    /// Events the filters left out.
    pub filtered: u64,
    pub unknown_lines: u64,
    pub skipped_lines: u64,
    /// Launches whose arrow was dropped because their stream had too many waiting.
    pub flows_dropped: u64,
}

/// Where an event is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Track {
    /// A thread's libcuda calls and process events.
    Thread { pid: u32, tid: u32 },
    /// What the NVIDIA kernel module did for a thread (`--kernel`), beside its calls.
    Driver { pid: u32, tid: u32 },
    /// Trace-wide markers (lost events).
    Global,
}

/// A slice: a call or a driver event. Times are ns since the base.
pub struct Slice<'a> {
    pub track: Track,
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub name: &'a str,
    pub category: &'a str,
    pub args: &'a Map<String, Value>,
    /// A launch: the flow it starts.
    pub flow_out: Option<u64>,
    /// A synchronisation: the launches it waited for.
    pub flows_in: &'a [FlowStart],
}

pub struct Instant<'a> {
    pub track: Track,
    pub ts_ns: u64,
    pub name: &'a str,
    pub category: &'a str,
    pub args: &'a Map<String, Value>,
}

/// Where the timeline goes (Trace Event JSON or Perfetto protobuf). The exporter names
/// a process and a thread before the first event on their tracks.
pub trait TimelineSink {
    /// The trace's header, before any event.
    fn header(&mut self, header: &Header, base_ns: u64) -> io::Result<()>;
    /// Names (or renames, after an exec) a process.
    fn process(&mut self, pid: u32, name: &str) -> io::Result<()>;
    /// Names a thread's track (or its driver track).
    fn thread(&mut self, track: Track, name: &str) -> io::Result<()>;
    fn slice(&mut self, slice: &Slice<'_>) -> io::Result<()>;
    fn instant(&mut self, instant: &Instant<'_>) -> io::Result<()>;
    /// The process's device bytes from `ts_ns` on.
    fn counter(&mut self, pid: u32, ts_ns: u64, bytes: u64) -> io::Result<()>;
    fn finish(&mut self, stats: &ExportStats) -> io::Result<()>;
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("writing the export: {0}")]
    Write(#[from] io::Error),
}

/// Exports a whole trace to `out` in `format`.
pub fn export(
    reader: impl BufRead,
    label: &str,
    out: impl Write,
    format: ExportFormat,
    filters: &Filters,
    skip_bad_lines: bool,
) -> Result<ExportStats, ExportError> {
    let lines = TraceLines::new(reader, label, skip_bad_lines);
    match format {
        ExportFormat::Chrome => Exporter::new(filters, ChromeWriter::new(out)?).run(lines),
        ExportFormat::Perfetto => Exporter::new(filters, PerfettoWriter::new(out)).run(lines),
    }
}

/// Process names, announced to the sink when first needed and after a change.
#[derive(Default)]
struct Names {
    /// Current name, and whether it is the command line from the header (kept over exec).
    processes: HashMap<u32, (String, bool)>,
    announced: HashMap<u32, String>,
    threads: HashSet<Track>,
}

impl Names {
    fn name(&self, pid: u32) -> String {
        self.processes
            .get(&pid)
            .map_or_else(|| format!("pid {pid}"), |(name, _)| name.clone())
    }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

struct Exporter<'f, S> {
    sink: S,
    filters: &'f Filters,
    analysis: Analysis,
    families: Families,
    flows: FlowTracker,
    names: Names,
    /// Trace clock value of time 0: the header's start, else 0.
    base_ns: u64,
    stats: ExportStats,
    /// Device bytes of processes before the time window, drawn at its start.
    counter_before_window: HashMap<u32, u64>,
}

impl<'f, S: TimelineSink> Exporter<'f, S> {
    fn new(filters: &'f Filters, sink: S) -> Self {
        Exporter {
            sink,
            filters,
            analysis: Analysis::default(),
            families: Families::default(),
            flows: FlowTracker::default(),
            names: Names::default(),
            base_ns: 0,
            stats: ExportStats::default(),
            counter_before_window: HashMap::new(),
        }
    }

    fn run(mut self, mut lines: TraceLines<impl BufRead>) -> Result<ExportStats, ExportError> {
        while let Some(line) = lines.next_line()? {
            match line {
                Line::Header(header) => self.header(&header)?,
                Line::Call(mut record) => self.call(&mut record)?,
                Line::Process(process) => self.process(&process)?,
                Line::Lost(lost) => self.lost(&lost)?,
                Line::Driver(driver) => self.driver(&driver)?,
                Line::Footer(_) => {}
                Line::Unknown => self.stats.unknown_lines += 1,
            }
        }
        for (pid, bytes) in std::mem::take(&mut self.counter_before_window) {
            self.counter(pid, self.filters.start_ns.unwrap_or(0), bytes)?;
        }
        self.stats.lines = lines.lines;
        self.stats.skipped_lines = lines.skipped_lines;
        self.stats.flows_dropped = self.flows.dropped;
        self.sink.finish(&self.stats)?;
        Ok(self.stats)
    }

    fn relative(&self, ts_ns: u64) -> u64 {
        ts_ns.saturating_sub(self.base_ns)
    }

    fn header(&mut self, header: &Header) -> io::Result<()> {
        self.base_ns = header.start_monotonic_ns.unwrap_or(0);
        self.families = Families::from_header(header);
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
        if self.names.announced.get(&pid) != Some(&name) {
            self.sink.process(pid, &name)?;
            self.names.announced.insert(pid, name);
        }
        Ok(())
    }

    /// Announces the track's process and thread before an event on it.
    fn track(&mut self, track: Track) -> io::Result<()> {
        let (pid, tid, driver) = match track {
            Track::Thread { pid, tid } => (pid, tid, false),
            Track::Driver { pid, tid } => (pid, tid, true),
            Track::Global => return Ok(()),
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
        Ok(())
    }

    fn call(&mut self, record: &mut CallLine) -> io::Result<()> {
        self.analysis.observe(record);
        let (role, _) = classify(&record.name);
        let ts = self.relative(record.ts_ns);
        let label = call_label(record, role);
        let pid_kept = self.filters.pid(record.pid);
        let kept = pid_kept
            && self.filters.span(ts, record.dur_ns)
            && self.filters.name(&record.name, &label);

        // Flows follow every call, kept or not: a filtered-out sync still ends its launches'
        // wait (the arrow needs both ends).
        let mut flow_out = None;
        let mut flows_in = Vec::new();
        match role {
            Role::Launch | Role::GraphLaunch if record.ret == 0 => {
                if let Some(stream) = StreamKey::of(record) {
                    let id = self.flows.next_id();
                    self.flows.launch(
                        stream,
                        FlowStart {
                            id,
                            pid: record.pid,
                            tid: record.tid,
                            ts_ns: ts + record.dur_ns / 2,
                            launch_ts_ns: record.ts_ns,
                            kept,
                        },
                    );
                    flow_out = kept.then_some(id);
                }
            }
            Role::Sync if record.name.starts_with("cuCtxSynchronize") => {
                flows_in = self.flows.sync_process(record.pid, record.ts_ns);
            }
            Role::Sync if record.name.starts_with("cuStreamSynchronize") => {
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
            let args = call_args(record, role);
            let category = self.families.of(&record.name).unwrap_or("other");
            self.sink.slice(&Slice {
                track,
                ts_ns: ts,
                dur_ns: record.dur_ns,
                name: &label,
                category,
                args: &args,
                flow_out,
                flows_in: &flows_in,
            })?;
            self.stats.slices += 1;
            self.stats.flows += flows_in.len() as u64;
        } else {
            self.stats.filtered += 1;
        }

        if let (Some(bytes), true) = (record.live_bytes, pid_kept) {
            // The bytes are those after the call.
            let end = ts.saturating_add(record.dur_ns);
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
        match (
            line.event.as_str(),
            line.child_pid,
            &line.comm,
            &line.filename,
        ) {
            ("fork", Some(child), Some(comm), _) => {
                self.names.processes.insert(child, (comm.clone(), false));
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
            category: "driver",
            args: &line.details(),
            flow_out: None,
            flows_in: &[],
        })?;
        self.stats.slices += 1;
        self.stats.driver_slices += 1;
        Ok(())
    }
}

/// A call's slice name: launches by kernel, copies and memsets with direction and size,
/// failures with their error.
fn call_label(record: &CallLine, role: Role) -> String {
    let mut label = match role {
        Role::Launch => match (&record.kernel, record.function) {
            (Some(kernel), _) => kernel.clone(),
            (None, Some(function)) => format!("function {:#x}", function.0),
            (None, None) => record.name.clone(),
        },
        Role::Copy => {
            let mut label = record.name.clone();
            for part in [
                record.kind.as_deref().map(str::to_owned),
                record.bytes.map(format_bytes),
            ]
            .into_iter()
            .flatten()
            {
                label.push(' ');
                label.push_str(&part);
            }
            label
        }
        Role::Memset => match record.bytes {
            Some(bytes) => format!("{} {}", record.name, format_bytes(bytes)),
            None => record.name.clone(),
        },
        _ => record.name.clone(),
    };
    if record.ret != 0 {
        label.push_str(" → ");
        match &record.ret_name {
            Some(name) => label.push_str(name),
            None => label.push_str(&format!("error {}", record.ret)),
        }
    }
    label
}

/// The decoded fields of a call (everything but what the slice itself says).
fn call_args(record: &CallLine, role: Role) -> Map<String, Value> {
    let mut args = match serde_json::to_value(record) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    for key in ["type", "name", "pid", "tid", "dur_ns"] {
        args.remove(key);
    }
    if role == Role::Launch {
        args.insert("call".into(), Value::from(record.name.as_str()));
    }
    args
}

/// `TRACE.jsonl` → `TRACE.json` / `TRACE.pftrace`.
fn default_output(trace: &Path, format: ExportFormat) -> PathBuf {
    trace.with_extension(format.extension())
}

fn open_output(path: &Path) -> Result<Box<dyn Write>, Failure> {
    if path == Path::new("-") {
        return Ok(Box::new(io::stdout().lock()));
    }
    let file = File::create(path).map_err(|e| {
        Failure::new(
            ExitCode::OutputNotWritable,
            anyhow!("cannot write {}: {e}", path.display()),
        )
    })?;
    Ok(Box::new(file))
}

fn window_ns(ms: Option<f64>, flag: &str) -> Result<Option<u64>, Failure> {
    match ms {
        None => Ok(None),
        Some(ms) if ms.is_finite() && ms >= 0.0 => Ok(Some((ms * 1e6).round() as u64)),
        Some(ms) => Err(Failure::new(
            ExitCode::Usage,
            anyhow!("{flag} {ms}: give milliseconds since the trace start, 0 or more"),
        )),
    }
}

/// Runs `cudatrace export` and returns the exit code.
pub fn run(args: ExportArgs) -> Result<i32, Failure> {
    let filters = Filters {
        pids: args.pids.clone(),
        names: args.names.clone(),
        start_ns: window_ns(args.start_ms, "--start-ms")?,
        end_ns: window_ns(args.end_ms, "--end-ms")?,
    };
    if let (Some(start), Some(end)) = (filters.start_ns, filters.end_ns)
        && start > end
    {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!("--start-ms is after --end-ms: the window is empty"),
        ));
    }
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&args.trace, args.format));
    export_file(
        &args.trace,
        &output,
        args.format,
        &filters,
        args.skip_bad_lines,
    )?;
    Ok(0)
}

/// `cudatrace run --export FORMAT`: the trace just written, exported beside it
/// (`TRACE.json` or `TRACE.pftrace`). The trace is complete whatever happens here, so a
/// failure is a warning. Returns the export's path.
pub fn after_run(trace: &Path, format: ExportFormat) -> Option<PathBuf> {
    let output = default_output(trace, format);
    match export_file(trace, &output, format, &Filters::default(), false) {
        Ok(_) => Some(output),
        Err(failure) => {
            eprintln!(
                "cudatrace: warning: the trace is complete but exporting it failed: {:#}",
                failure.error
            );
            None
        }
    }
}

/// Exports `trace` to `output` (`-`: stdout) and says what was written on stderr.
fn export_file(
    trace: &Path,
    output: &Path,
    format: ExportFormat,
    filters: &Filters,
    skip_bad_lines: bool,
) -> Result<ExportStats, Failure> {
    let label = trace.display().to_string();
    let file = File::open(trace).map_err(|e| {
        Failure::new(
            ExitCode::NoSuchProcess,
            anyhow!("cannot open the trace {label}: {e}"),
        )
    })?;
    if output == trace {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!("the output would overwrite the trace {label}: pass -o"),
        ));
    }
    let started = Clock::now();
    let out = BufWriter::with_capacity(1 << 20, open_output(output)?);
    let stats = export(
        BufReader::with_capacity(1 << 20, file),
        &label,
        out,
        format,
        filters,
        skip_bad_lines,
    )
    .map_err(|e| match e {
        ExportError::Read(ReadError::BadLine { .. }) => Failure::new(ExitCode::BadInput, e),
        ExportError::Read(ReadError::Io { .. }) => Failure::new(ExitCode::NoSuchProcess, e),
        ExportError::Write(_) => Failure::new(ExitCode::OutputNotWritable, e),
    })?;
    if stats.skipped_lines > 0 {
        eprintln!(
            "cudatrace: skipped {} malformed lines of {label}",
            stats.skipped_lines
        );
    }
    if stats.unknown_lines > 0 {
        eprintln!(
            "cudatrace: {} lines of types this version does not know were left out",
            stats.unknown_lines
        );
    }
    if stats.flows_dropped > 0 {
        eprintln!(
            "cudatrace: {} launches got no flow arrow: more than {} waited on one stream",
            stats.flows_dropped,
            flows::MAX_PENDING_PER_STREAM
        );
    }
    let destination = if output == Path::new("-") {
        "stdout".to_owned()
    } else {
        output.display().to_string()
    };
    eprintln!(
        "cudatrace: wrote {destination} ({}): {} slices, {} counter values, {} flows, {} markers{} in {:.2} s",
        format.label(),
        stats.slices,
        stats.counters,
        stats.flows,
        stats.instants,
        match stats.filtered {
            0 => String::new(),
            n => format!(", {n} events filtered out"),
        },
        started.elapsed().as_secs_f64()
    );
    Ok(stats)
}

#[cfg(test)]
mod tests;
