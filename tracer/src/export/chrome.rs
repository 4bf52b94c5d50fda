//! Trace Event JSON, the format of chrome://tracing that the Perfetto UI also opens:
//! `{"traceEvents":[...], ...}`, written one event at a time.
//!
//! Times are microseconds with three decimals, so nanoseconds survive exactly.

use std::{
    collections::HashMap,
    fmt,
    io::{self, Write},
};

use serde_json::{Map, Value, json};

use super::timeline::{ExportStats, GPU_PID_BASE, GpuCounter, Instant, Slice, TimelineSink, Track};
use crate::schema::Header;

/// Driver tracks are threads of their own in this format: the thread's tid plus this.
pub const DRIVER_TID_OFFSET: u32 = 1 << 30;

/// NCCL rank tracks are threads of their process in this format: tid this plus the
/// track's index (above any Linux tid and the driver tracks').
pub const NCCL_TID_BASE: u32 = 3 << 29;

/// The category both ends of a flow share (viewers pair them by it, the name and the id).
pub const FLOW_CATEGORY: &str = "flow";

/// Nanoseconds written as microseconds, exactly.
struct Micros(u64);

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

pub struct ChromeWriter<W: Write> {
    out: W,
    events: u64,
    header: Option<Value>,
    /// `--gpu`: stream tracks, threads of their GPU's group, by tid from 1.
    gpu_tids: HashMap<Track, u32>,
}

impl<W: Write> ChromeWriter<W> {
    pub fn new(mut out: W) -> io::Result<Self> {
        out.write_all(b"{\"traceEvents\":[\n")?;
        Ok(ChromeWriter {
            out,
            events: 0,
            header: None,
            gpu_tids: HashMap::new(),
        })
    }

    fn pid_tid(&mut self, track: Track) -> (u32, u32) {
        match track {
            Track::Thread { pid, tid } => (pid, tid),
            Track::Driver { pid, tid } => (pid, tid.saturating_add(DRIVER_TID_OFFSET)),
            Track::Global => (0, 0),
            Track::Nccl { pid, index } => (pid, NCCL_TID_BASE.saturating_add(index)),
            Track::Gpu { device, .. } => {
                let next = self.gpu_tids.len() as u32 + 1;
                let tid = *self.gpu_tids.entry(track).or_insert(next);
                (GPU_PID_BASE.saturating_add(device), tid)
            }
        }
    }

    /// Starts an event: the separator, then `{"name":NAME,"ph":PH`.
    fn open(&mut self, name: &str, phase: &str) -> io::Result<()> {
        if self.events > 0 {
            self.out.write_all(b",\n")?;
        }
        self.events += 1;
        self.out.write_all(b"{\"name\":")?;
        serde_json::to_writer(&mut self.out, name)?;
        write!(self.out, ",\"ph\":\"{phase}\"")
    }

    fn string_field(&mut self, key: &str, text: &str) -> io::Result<()> {
        write!(self.out, ",\"{key}\":")?;
        serde_json::to_writer(&mut self.out, text)?;
        Ok(())
    }

    fn args(&mut self, args: &Map<String, Value>) -> io::Result<()> {
        self.out.write_all(b",\"args\":")?;
        serde_json::to_writer(&mut self.out, args)?;
        Ok(())
    }

    fn metadata(&mut self, kind: &str, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        self.open(kind, "M")?;
        write!(
            self.out,
            ",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":"
        )?;
        serde_json::to_writer(&mut self.out, name)?;
        self.out.write_all(b"}}")
    }

    /// One end of a flow arrow: `s` binds to the launch slice enclosing it, `f` (with
    /// `"bp":"e"`) to the synchronisation slice enclosing it.
    fn flow_end(
        &mut self,
        name: &str,
        phase: &str,
        id: u64,
        (pid, tid): (u32, u32),
        ts: u64,
    ) -> io::Result<()> {
        self.open(name, phase)?;
        self.string_field("cat", FLOW_CATEGORY)?;
        write!(
            self.out,
            ",\"id\":{id},\"ts\":{},\"pid\":{pid},\"tid\":{tid}",
            Micros(ts)
        )?;
        if phase == "f" {
            self.out.write_all(b",\"bp\":\"e\"")?;
        }
        self.out.write_all(b"}")
    }
}

impl<W: Write> TimelineSink for ChromeWriter<W> {
    fn header(&mut self, header: &Header, base_ns: u64) -> io::Result<()> {
        self.header = Some(json!({
            "command": header.command,
            "pids": header.pids,
            "time_base_monotonic_ns": base_ns,
        }));
        Ok(())
    }

    fn process(&mut self, pid: u32, name: &str) -> io::Result<()> {
        self.metadata("process_name", pid, pid, name)
    }

    fn thread(&mut self, track: Track, name: &str) -> io::Result<()> {
        let (pid, tid) = self.pid_tid(track);
        self.metadata("thread_name", pid, tid, name)
    }

    fn slice(&mut self, slice: &Slice<'_>) -> io::Result<()> {
        let (pid, tid) = self.pid_tid(slice.track);
        self.open(slice.name, "X")?;
        self.string_field("cat", slice.category)?;
        write!(
            self.out,
            ",\"ts\":{},\"dur\":{},\"pid\":{pid},\"tid\":{tid}",
            Micros(slice.ts_ns),
            Micros(slice.dur_ns)
        )?;
        self.args(slice.args)?;
        self.out.write_all(b"}")?;
        let arrives = slice.ts_ns + slice.dur_ns / 2;
        for start in slice.flows_in {
            let from = (start.pid, start.tid);
            self.flow_end(start.name, "s", start.id, from, start.ts_ns)?;
            self.flow_end(start.name, "f", start.id, (pid, tid), arrives)?;
        }
        Ok(())
    }

    fn instant(&mut self, instant: &Instant<'_>) -> io::Result<()> {
        let (pid, tid) = self.pid_tid(instant.track);
        let scope = if instant.track == Track::Global {
            "g"
        } else {
            "t"
        };
        self.open(instant.name, "i")?;
        self.string_field("cat", instant.category)?;
        write!(
            self.out,
            ",\"s\":\"{scope}\",\"ts\":{},\"pid\":{pid},\"tid\":{tid}",
            Micros(instant.ts_ns)
        )?;
        self.args(instant.args)?;
        self.out.write_all(b"}")
    }

    fn counter(&mut self, pid: u32, ts_ns: u64, bytes: u64) -> io::Result<()> {
        self.open("device memory", "C")?;
        write!(
            self.out,
            ",\"cat\":\"memory\",\"ts\":{},\"pid\":{pid},\"args\":{{\"bytes\":{bytes}}}}}",
            Micros(ts_ns)
        )
    }

    fn gpu(&mut self, device: u32, name: &str) -> io::Result<()> {
        // Its stream threads are numbered from 1: tid 0 is the group itself.
        self.metadata("process_name", GPU_PID_BASE + device, 0, name)
    }

    fn gpu_counter(
        &mut self,
        device: u32,
        counter: GpuCounter,
        ts_ns: u64,
        value: f64,
    ) -> io::Result<()> {
        let (name, unit) = counter.name_and_unit();
        self.open(name, "C")?;
        write!(
            self.out,
            ",\"cat\":\"power\",\"ts\":{},\"pid\":{},\"args\":{{",
            Micros(ts_ns),
            GPU_PID_BASE + device
        )?;
        serde_json::to_writer(&mut self.out, unit)?;
        self.out.write_all(b":")?;
        serde_json::to_writer(&mut self.out, &value)?;
        self.out.write_all(b"}}")
    }

    fn finish(&mut self, stats: &ExportStats) -> io::Result<()> {
        let mut other = match self.header.take() {
            Some(Value::Object(map)) => map,
            _ => Map::new(),
        };
        other.insert(
            "generator".into(),
            concat!("cudatrace ", env!("CARGO_PKG_VERSION")).into(),
        );
        other.insert(
            "time_base".into(),
            "ts = µs since time_base_monotonic_ns (the header's start_monotonic_ns)".into(),
        );
        other.insert("slices".into(), stats.slices.into());
        other.insert("counters".into(), stats.counters.into());
        other.insert("flows".into(), stats.flows.into());
        self.out
            .write_all(b"\n],\"displayTimeUnit\":\"ns\",\"otherData\":")?;
        serde_json::to_writer(&mut self.out, &other)?;
        self.out.write_all(b"}\n")?;
        self.out.flush()
    }
}
