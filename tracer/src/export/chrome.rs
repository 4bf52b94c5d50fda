//! Trace Event JSON, the format of chrome://tracing that the Perfetto UI also opens:
//! `{"traceEvents":[...], ...}`, written one event at a time.
//!
//! Times are microseconds with three decimals, so nanoseconds survive exactly.

use std::io::{self, Write};

use foldhash::HashMap;
use serde_json::{Map, Value, json};

use super::{
    arguments::Arg,
    call_args::{CALL_ARG_KEYS, SliceArgs, hex_digits},
    timeline::{
        ExportStats, GPU_PID_BASE, GpuCounter, Instant, ProcessName, Slice, TimelineSink, Track,
    },
};
use crate::{reader::compact, schema::Header};

/// Driver tracks are threads of their own in this format: the thread's tid plus this.
pub const DRIVER_TID_OFFSET: u32 = 1 << 30;
/// `--stacks`: a thread's layer track is this plus its tid (tids are below 2^22).
pub const LAYERS_TID_OFFSET: u32 = 1 << 29;

/// NCCL rank tracks are threads of their process in this format: tid this plus the
/// track's index (above any Linux tid and the driver tracks').
pub const NCCL_TID_BASE: u32 = 3 << 29;

/// The category both ends of a flow share (viewers pair them by it, the name and the id),
/// as its field: `,"cat":"flow"`.
const FLOW_CATEGORY_FIELD: &[u8] = b",\"cat\":\"flow\"";

/// Output is gathered here and handed to the writer in blocks of this size.
const FLUSH_BYTES: usize = 256 << 10;

pub struct ChromeWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
    events: u64,
    header: Option<Value>,
    /// `--gpu`: stream tracks, threads of their GPU's group, by tid from 1.
    gpu_tids: HashMap<Track, u32>,
    /// `"KEY":` of each of [`CALL_ARG_KEYS`] (plain names: nothing to escape).
    call_keys: Vec<Vec<u8>>,
    /// The last event's pid and tid, and `,"pid":PID,"tid":TID` for them.
    pid_tid_text: (Option<(u32, u32)>, Vec<u8>),
}

impl<W: Write> ChromeWriter<W> {
    pub fn new(out: W) -> io::Result<Self> {
        let mut writer = ChromeWriter {
            out,
            buf: Vec::new(),
            events: 0,
            header: None,
            gpu_tids: HashMap::default(),
            call_keys: CALL_ARG_KEYS
                .iter()
                .map(|key| format!("\"{key}\":").into_bytes())
                .collect(),
            pid_tid_text: (None, Vec::new()),
        };
        writer.buf.reserve(FLUSH_BYTES + 4096);
        writer.raw(b"{\"traceEvents\":[\n");
        Ok(writer)
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    fn number(&mut self, number: impl itoa::Integer) {
        self.raw(itoa::Buffer::new().format(number).as_bytes());
    }

    /// Nanoseconds written as microseconds, exactly (three decimals).
    fn micros(&mut self, ns: u64) {
        self.number(ns / 1000);
        let fraction = (ns % 1000) as u16;
        self.raw(&[
            b'.',
            b'0' + (fraction / 100) as u8,
            b'0' + (fraction / 10 % 10) as u8,
            b'0' + (fraction % 10) as u8,
        ]);
    }

    /// A string with nothing to escape, quoted.
    fn quoted(&mut self, text: &str) {
        self.buf.push(b'"');
        self.raw(text.as_bytes());
        self.buf.push(b'"');
    }

    /// A JSON string, escaped as serde_json escapes it.
    fn string(&mut self, text: &str) {
        if compact::plain(text.as_bytes()) {
            self.quoted(text);
        } else {
            // Writing into a Vec does not fail.
            let _ = serde_json::to_writer(&mut self.buf, text);
        }
    }

    /// Ends an event: hands the output on once a block is full.
    fn close(&mut self) -> io::Result<()> {
        self.buf.push(b'}');
        if self.buf.len() >= FLUSH_BYTES {
            self.out.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    fn pid_tid(&mut self, track: Track) -> (u32, u32) {
        match track {
            Track::Thread { pid, tid } => (pid, tid),
            Track::Driver { pid, tid } => (pid, tid.saturating_add(DRIVER_TID_OFFSET)),
            Track::Layers { pid, tid } => (pid, tid.saturating_add(LAYERS_TID_OFFSET)),
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
    /// `plain`: `name` is known to hold nothing to escape.
    fn open(&mut self, name: &str, plain: bool, phase: &str) {
        if self.events > 0 {
            self.raw(b",\n");
        }
        self.events += 1;
        self.raw(b"{\"name\":");
        match plain {
            true => self.quoted(name),
            false => self.string(name),
        }
        self.raw(b",\"ph\":\"");
        self.raw(phase.as_bytes());
        self.buf.push(b'"');
    }

    fn category(&mut self, category: &str) {
        self.raw(b",\"cat\":");
        self.string(category);
    }

    fn write_pid_tid(&mut self, pid: u32, tid: u32) {
        // Runs of events on one thread (a slice and its flows): the text is kept.
        let (last, text) = &mut self.pid_tid_text;
        if *last != Some((pid, tid)) {
            *last = Some((pid, tid));
            text.clear();
            text.extend_from_slice(b",\"pid\":");
            text.extend_from_slice(itoa::Buffer::new().format(pid).as_bytes());
            text.extend_from_slice(b",\"tid\":");
            text.extend_from_slice(itoa::Buffer::new().format(tid).as_bytes());
        }
        self.buf.extend_from_slice(text);
    }

    /// `,"args":{...}`, as serde_json writes a map.
    fn args(&mut self, args: SliceArgs<'_>) {
        self.raw(b",\"args\":{");
        // Checked where they were collected: nothing to escape.
        let plain = args.is_plain();
        let mut first = true;
        match args {
            SliceArgs::Collected(arguments) => {
                for (key, value) in arguments.iter() {
                    self.arg(&mut first, plain, key, value);
                }
            }
            SliceArgs::Call(call) => call.visit(|index, _, value| {
                if !std::mem::take(&mut first) {
                    self.buf.push(b',');
                }
                self.buf.extend_from_slice(&self.call_keys[index]);
                self.value(plain, value);
            }),
        }
        self.buf.push(b'}');
    }

    /// One `"key":value` of `args`, after a comma unless `first`.
    fn arg(&mut self, first: &mut bool, plain: bool, key: &str, value: Arg<'_>) {
        if !std::mem::take(first) {
            self.buf.push(b',');
        }
        match plain {
            true => self.quoted(key),
            false => self.string(key),
        }
        self.buf.push(b':');
        self.value(plain, value);
    }

    /// An argument's value; `plain`: a text has nothing to escape.
    fn value(&mut self, plain: bool, value: Arg<'_>) {
        match value {
            Arg::Text(text) if plain => self.quoted(text),
            Arg::Hex(value) => {
                self.buf.push(b'"');
                self.raw(hex_digits(&mut [0; 18], value));
                self.buf.push(b'"');
            }
            Arg::Unsigned(n) => self.number(n),
            Arg::Signed(n) => self.number(n),
            Arg::Float(x) => {
                let _ = serde_json::to_writer(&mut self.buf, &x);
            }
            Arg::Bool(b) => self.raw(if b { b"true" } else { b"false" }),
            Arg::Text(text) => self.string(text),
            Arg::Json(json) => self.raw(json.as_bytes()),
        }
    }

    fn metadata(&mut self, kind: &str, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        self.open(kind, false, "M");
        self.write_pid_tid(pid, tid);
        self.raw(b",\"args\":{\"name\":");
        self.string(name);
        self.buf.push(b'}');
        self.close()
    }

    /// One end of a flow arrow: its start (`s`) binds to the launch slice enclosing it, its
    /// finish (`f`, with `"bp":"e"`) to the synchronisation slice enclosing it.
    fn flow_end(
        &mut self,
        name: &str,
        finish: bool,
        id: u64,
        (pid, tid): (u32, u32),
        ts: u64,
    ) -> io::Result<()> {
        // A flow is named by TO_SYNC or TO_GPU: nothing to escape (tested below).
        self.open(name, true, if finish { "f" } else { "s" });
        self.raw(FLOW_CATEGORY_FIELD);
        self.raw(b",\"id\":");
        self.number(id);
        self.raw(b",\"ts\":");
        self.micros(ts);
        self.write_pid_tid(pid, tid);
        if finish {
            self.raw(b",\"bp\":\"e\"");
        }
        self.close()
    }
}

/// Like a `BufWriter`, what was gathered is handed on when the writer is dropped (after a
/// failed read, the events before it).
impl<W: Write> Drop for ChromeWriter<W> {
    fn drop(&mut self) {
        let _ = self.out.write_all(&self.buf);
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

    fn process(&mut self, process: &ProcessName<'_>) -> io::Result<()> {
        // Viewers take the last `process_name`: a rename is the same event again.
        self.metadata("process_name", process.pid, process.pid, process.name)
    }

    fn thread(&mut self, track: Track, name: &str) -> io::Result<()> {
        let (pid, tid) = self.pid_tid(track);
        self.metadata("thread_name", pid, tid, name)
    }

    fn slice(&mut self, slice: &Slice<'_>) -> io::Result<()> {
        let (pid, tid) = self.pid_tid(slice.track);
        self.open(slice.name, slice.plain_name, "X");
        self.category(slice.category);
        self.raw(b",\"ts\":");
        self.micros(slice.ts_ns);
        self.raw(b",\"dur\":");
        self.micros(slice.dur_ns);
        self.write_pid_tid(pid, tid);
        self.args(slice.args);
        self.close()?;
        let arrives = slice.ts_ns + slice.dur_ns / 2;
        for start in slice.flows_in {
            let from = (start.pid, start.tid);
            // Perfetto's JSON reader drops an arrow that arrives before it leaves: GPU
            // work can start, and be half done, before the middle of the call that issued
            // it. Such an arrow leaves earlier in its call, at the start at the earliest.
            let leaves = start.ts_ns.min(arrives).max(start.slice_ts_ns);
            self.flow_end(start.name, false, start.id, from, leaves)?;
            self.flow_end(start.name, true, start.id, (pid, tid), arrives)?;
        }
        Ok(())
    }

    fn instant(&mut self, instant: &Instant<'_>) -> io::Result<()> {
        let (pid, tid) = self.pid_tid(instant.track);
        let scope: &[u8] = if instant.track == Track::Global {
            b"g"
        } else {
            b"t"
        };
        self.open(instant.name, false, "i");
        self.category(instant.category);
        self.raw(b",\"s\":\"");
        self.raw(scope);
        self.raw(b"\",\"ts\":");
        self.micros(instant.ts_ns);
        self.write_pid_tid(pid, tid);
        self.args(SliceArgs::Collected(instant.args));
        self.close()
    }

    fn counter(&mut self, pid: u32, ts_ns: u64, bytes: u64) -> io::Result<()> {
        self.open("device memory", false, "C");
        self.raw(b",\"cat\":\"memory\",\"ts\":");
        self.micros(ts_ns);
        self.raw(b",\"pid\":");
        self.number(pid);
        self.raw(b",\"args\":{\"bytes\":");
        self.number(bytes);
        self.buf.push(b'}');
        self.close()
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
        self.open(name, false, "C");
        self.raw(b",\"cat\":\"power\",\"ts\":");
        self.micros(ts_ns);
        self.raw(b",\"pid\":");
        self.number(GPU_PID_BASE + device);
        self.raw(b",\"args\":{");
        self.string(unit);
        self.buf.push(b':');
        serde_json::to_writer(&mut self.buf, &value)?;
        self.buf.push(b'}');
        self.close()
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
        self.raw(b"\n],\"displayTimeUnit\":\"ns\",\"otherData\":");
        serde_json::to_writer(&mut self.buf, &other)?;
        self.raw(b"}\n");
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::flows::{TO_GPU, TO_SYNC};

    /// Flow events are written without the escaping check: their names and category must
    /// need none.
    #[test]
    fn flow_names_and_their_category_need_no_escaping() {
        let event: Value =
            serde_json::from_slice(&[b"{\"ph\":\"s\"", FLOW_CATEGORY_FIELD, b"}"].concat())
                .unwrap();
        assert_eq!(event["cat"], "flow");
        for name in [TO_SYNC, TO_GPU] {
            assert!(compact::plain(name.as_bytes()), "{name}");
            assert_eq!(serde_json::to_string(name).unwrap(), format!("\"{name}\""));
        }
    }
}
