//! The JSONL trace: a header line, one line per event, a footer line.
//! The schema is documented, versioned, in docs/trace-format.md.

use std::{
    collections::BTreeMap,
    io::{self, BufWriter, Write},
};

use serde::Serialize;

use crate::{
    analysis::{Analysis, MemoryFooter},
    events::CallRecord,
};

/// Bumped on any incompatible change of the line schema.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize)]
pub struct LibcudaInfo {
    pub path: String,
    pub version: Option<String>,
    /// True when tracing cudatrace's stand-in library, not NVIDIA's driver.
    pub standin: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProbeInfo {
    pub id: u32,
    pub symbol: String,
    pub function: &'static str,
    pub family: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct AttachFailureInfo {
    pub symbol: String,
    pub error: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Header {
    #[serde(rename = "type")]
    pub record_type: &'static str,
    pub format: &'static str,
    pub version: u32,
    pub cudatrace_version: &'static str,
    /// `command`, `pid` (-p) or `all` (--all).
    pub mode: &'static str,
    pub command: Vec<String>,
    pub pids: Vec<u32>,
    pub start_wall: String,
    pub start_wall_ns: u64,
    /// Event `ts_ns` values are on this clock; wall = start_wall_ns + (ts_ns - start_monotonic_ns).
    pub clock: &'static str,
    pub start_monotonic_ns: u64,
    pub host: String,
    pub kernel: String,
    pub libcuda: LibcudaInfo,
    pub ring_bytes: u32,
    pub probes: Vec<ProbeInfo>,
    pub missing_functions: Vec<&'static str>,
    pub aliases: Vec<(String, String)>,
    pub attach_failures: Vec<AttachFailureInfo>,
    /// `--kernel`: the driver hooks in use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_hooks: Option<KernelHooksInfo>,
}

#[derive(Clone, Debug, Serialize)]
pub struct KernelHooksInfo {
    /// `kprobe` or `tracepoint`.
    pub mechanism: &'static str,
    /// Why it was chosen.
    pub reason: String,
    /// Kernel functions with kprobes (kprobe mechanism).
    pub functions: Vec<String>,
    /// Whether `nvidia:nvidia_dev_xid` is attached.
    pub xid: bool,
    /// Files whose path starts with this are NVIDIA device files.
    pub device_prefix: String,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct LostCounts {
    /// Call events dropped because the ring buffer was full.
    pub ring_full: u64,
    /// Calls nested deeper than the per-thread frame stack.
    pub too_deep: u64,
    /// Calls of threads beyond the frame table's capacity.
    pub frames_full: u64,
    /// Process (fork/exec/exit) events dropped because the ring buffer was full.
    pub process_ring_full: u64,
    /// Driver (`--kernel`) events dropped because the ring buffer was full.
    pub driver_ring_full: u64,
    /// Call events lost: `ring_full + too_deep + frames_full`.
    pub calls: u64,
    /// Everything lost.
    pub total: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct EventCounts {
    pub call: u64,
    pub process: u64,
    pub lost: u64,
    /// `"type":"driver"` lines (`--kernel`).
    pub driver: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Footer {
    #[serde(rename = "type")]
    pub record_type: &'static str,
    pub end_wall: String,
    pub duration_ns: u64,
    /// Lines written per type (`lost` counts `"type":"lost"` lines).
    pub events: EventCounts,
    pub calls_by_name: BTreeMap<String, u64>,
    /// Events the kernel dropped, by reason.
    pub lost: LostCounts,
    /// Calls the kernel saw start in traced processes.
    pub entries_seen: u64,
    /// Returns with no recorded entry (a call already running when probes attached).
    pub unmatched_returns: u64,
    /// Records the loader could not decode.
    pub undecodable: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_signal: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Live device memory per process: peaks, final figures and leaks
    /// (docs/trace-format.md, "Analysis fields").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryFooter>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessLine<'a> {
    #[serde(rename = "type")]
    pub record_type: &'static str,
    pub event: &'static str,
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child_pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<&'a str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LostLine {
    #[serde(rename = "type")]
    pub record_type: &'static str,
    pub ts_ns: u64,
    pub reason: &'static str,
    pub count: u64,
    pub total: u64,
}

/// Writes trace lines and keeps the footer's counts.
pub struct TraceWriter {
    out: BufWriter<Box<dyn Write>>,
    pub footer: Footer,
    /// Fed every call before it is written (kernel names, live bytes, the summary), so
    /// each path that writes calls also analyses them.
    pub analysis: Analysis,
}

impl TraceWriter {
    pub fn new(out: Box<dyn Write>) -> Self {
        Self {
            out: BufWriter::with_capacity(1 << 20, out),
            footer: Footer {
                record_type: "footer",
                ..Footer::default()
            },
            analysis: Analysis::default(),
        }
    }

    fn line<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, value)?;
        self.out.write_all(b"\n")
    }

    pub fn header(&mut self, header: &Header) -> io::Result<()> {
        self.line(header)?;
        // The header reaches the disk before the command starts.
        self.out.flush()
    }

    pub fn call(&mut self, record: &CallRecord) -> io::Result<()> {
        self.footer.events.call += 1;
        match self.footer.calls_by_name.get_mut(&record.name) {
            Some(count) => *count += 1,
            None => {
                self.footer.calls_by_name.insert(record.name.clone(), 1);
            }
        }
        self.line(record)
    }

    pub fn process(&mut self, line: &ProcessLine<'_>) -> io::Result<()> {
        self.footer.events.process += 1;
        self.line(line)
    }

    pub fn driver(&mut self, record: &crate::kernel_hooks::DriverRecord) -> io::Result<()> {
        self.footer.events.driver += 1;
        self.line(record)
    }

    pub fn lost(&mut self, line: &LostLine) -> io::Result<()> {
        self.footer.events.lost += 1;
        self.line(line)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Writes the footer and flushes; the trace is complete after this.
    pub fn finish(mut self) -> io::Result<Footer> {
        let footer = std::mem::take(&mut self.footer);
        self.line(&footer)?;
        self.out.flush()?;
        Ok(footer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{cell::RefCell, rc::Rc};

    #[derive(Clone, Default)]
    struct Shared(Rc<RefCell<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn footer_counts_what_was_written() {
        let buffer = Shared::default();
        let mut writer = TraceWriter::new(Box::new(buffer.clone()));
        let record = CallRecord {
            record_type: "call".into(),
            name: "cuInit".into(),
            ..Default::default()
        };
        writer.call(&record).unwrap();
        writer.call(&record).unwrap();
        writer
            .lost(&LostLine {
                record_type: "lost",
                ts_ns: 1,
                reason: "ring_full",
                count: 3,
                total: 3,
            })
            .unwrap();
        writer.footer.lost.total = 3;
        writer.finish().unwrap();
        let text = String::from_utf8(buffer.0.borrow().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 4);
        let footer = &lines[3];
        assert_eq!(footer["type"], "footer");
        assert_eq!(footer["events"]["call"], 2);
        assert_eq!(footer["events"]["lost"], 1);
        assert_eq!(footer["calls_by_name"]["cuInit"], 2);
        assert_eq!(footer["lost"]["total"], 3);
    }
}
