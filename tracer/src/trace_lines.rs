//! A trace read back line by line with what viewers need from each line: the header's
//! clock and probe families, calls, process and lost lines, and `--kernel`'s driver lines.
//!
//! Lines are accepted and rejected exactly as `cudatrace summary` does (through
//! [`parse_line`]); this adds the fields the summary has no use for.

use std::{
    collections::HashMap,
    io::BufRead,
    sync::{Arc, OnceLock},
};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::{
    analysis::reader::{MAX_LINE_BYTES, ReadError, TraceLine, parse_line, read_line},
    catalog::{CATALOG, STREAM_VARIANTS},
    events::CallRecord,
};

/// The header fields viewers use.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Header {
    /// Taken before the probes were attached: no event is earlier.
    pub start_monotonic_ns: Option<u64>,
    #[serde(default)]
    pub command: Vec<String>,
    /// The processes traced from the start, the command's first.
    #[serde(default)]
    pub pids: Vec<u32>,
    #[serde(default)]
    pub probes: Vec<Probe>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Probe {
    pub symbol: String,
    pub family: String,
}

/// A `"type":"process"` line.
#[derive(Clone, Debug, Deserialize)]
pub struct ProcessLine {
    /// `fork`, `exec` or `exit`.
    pub event: String,
    pub pid: u32,
    #[serde(default)]
    pub tid: u32,
    #[serde(default)]
    pub ts_ns: u64,
    pub child_pid: Option<u32>,
    pub comm: Option<String>,
    pub filename: Option<String>,
}

/// A `"type":"lost"` line.
#[derive(Clone, Debug, Deserialize)]
pub struct LostLine {
    #[serde(default)]
    pub ts_ns: u64,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub count: u64,
}

/// A `"type":"driver"` line (`cudatrace run --kernel`): what the NVIDIA kernel module did
/// for a thread. Only the fields every hook has are typed; the rest are kept as arguments.
#[derive(Clone, Debug)]
pub struct DriverLine {
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    pub dur_ns: u64,
    /// The most specific name the line has, as the summary's driver section gives it: the
    /// escape or UVM command name, the kernel function, `Xid N`, `mmap DEVICE`...
    pub name: String,
    pub args: Map<String, Value>,
}

/// One line of a trace.
#[derive(Debug)]
pub enum Line {
    Header(Box<Header>),
    Call(Box<CallRecord>),
    Process(ProcessLine),
    Lost(LostLine),
    Driver(Box<DriverLine>),
    Footer,
    /// A type this version does not know (a newer trace).
    Unknown,
}

/// The lines of a trace, one at a time; memory holds one line.
pub struct TraceLines<R> {
    reader: R,
    file: String,
    buf: Vec<u8>,
    skip_bad_lines: bool,
    /// Lines read so far.
    pub lines: u64,
    /// Malformed lines passed over (with `skip_bad_lines`).
    pub skipped_lines: u64,
    /// The first few of them: (line number, message).
    pub first_skipped: Vec<(u64, String)>,
}

impl<R: BufRead> TraceLines<R> {
    pub fn new(reader: R, file: &str, skip_bad_lines: bool) -> Self {
        TraceLines {
            reader,
            file: file.to_owned(),
            buf: Vec::new(),
            skip_bad_lines,
            lines: 0,
            skipped_lines: 0,
            first_skipped: Vec::new(),
        }
    }

    /// The next line, `None` at the end. A malformed line is an error naming the file and
    /// line, unless `skip_bad_lines`.
    pub fn next_line(&mut self) -> Result<Option<Line>, ReadError> {
        loop {
            let kept =
                read_line(&mut self.reader, &mut self.buf, MAX_LINE_BYTES).map_err(|source| {
                    ReadError::Io {
                        file: self.file.clone(),
                        source,
                    }
                })?;
            let Some(kept) = kept else { return Ok(None) };
            self.lines += 1;
            let parsed = if kept {
                parse(&self.buf)
            } else {
                Err(format!("line longer than {} MiB", MAX_LINE_BYTES >> 20))
            };
            match parsed {
                Ok(line) => return Ok(Some(line)),
                Err(message) if self.skip_bad_lines => {
                    self.skipped_lines += 1;
                    if self.first_skipped.len() < 5 {
                        self.first_skipped.push((self.lines, message));
                    }
                }
                Err(message) => {
                    return Err(ReadError::BadLine {
                        file: self.file.clone(),
                        line: self.lines,
                        message,
                    });
                }
            }
        }
    }
}

/// One line, validated by the summary's parser first so both accept the same traces.
fn parse(bytes: &[u8]) -> Result<Line, String> {
    let typed = |what: &str, result: Result<Line, serde_json::Error>| {
        result.map_err(|e| format!("{what} line: {e}"))
    };
    Ok(match parse_line(bytes)? {
        TraceLine::Call(record) => Line::Call(record),
        TraceLine::Header { .. } => typed(
            "header",
            serde_json::from_slice(bytes).map(|h| Line::Header(Box::new(h))),
        )?,
        TraceLine::Process { .. } => {
            typed("process", serde_json::from_slice(bytes).map(Line::Process))?
        }
        TraceLine::Lost { .. } => typed("lost", serde_json::from_slice(bytes).map(Line::Lost))?,
        TraceLine::Footer { .. } => Line::Footer,
        TraceLine::Driver(summarised) => {
            let mut fields: Map<String, Value> =
                serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
            Line::Driver(Box::new(driver_line(&mut fields, summarised.what)?))
        }
        TraceLine::Unknown => Line::Unknown,
    })
}

/// `name` is what the summary's driver section calls the event.
fn driver_line(fields: &mut Map<String, Value>, name: String) -> Result<DriverLine, String> {
    let mut number = |key: &str| fields.remove(key).and_then(|v| v.as_u64());
    let pid = number("pid").ok_or("driver line: no \"pid\" number")?;
    let tid = number("tid").unwrap_or(pid);
    let ts_ns = number("ts_ns").ok_or("driver line: no \"ts_ns\" number")?;
    let dur_ns = number("dur_ns").unwrap_or(0);
    fields.remove("type");
    Ok(DriverLine {
        pid: u32::try_from(pid).map_err(|_| "driver line: pid out of range")?,
        tid: u32::try_from(tid).map_err(|_| "driver line: tid out of range")?,
        ts_ns,
        dur_ns,
        name,
        args: std::mem::take(fields),
    })
}

/// The API family of each symbol (`init`, `context`, `memory`, `virtual_memory`, `copy`,
/// `memset`, `launch`, `sync`, `module`): the header's probe list first, the catalog for
/// traces whose header lacks a name.
#[derive(Clone, Debug, Default)]
pub struct Families {
    from_header: HashMap<String, Arc<str>>,
}

/// Families in the order the plot's lanes show them.
pub const FAMILIES: [&str; 9] = [
    "init",
    "context",
    "memory",
    "virtual_memory",
    "copy",
    "memset",
    "launch",
    "sync",
    "module",
];

fn catalog_families() -> &'static HashMap<&'static str, &'static str> {
    static FAMILIES_BY_SYMBOL: OnceLock<HashMap<&'static str, &'static str>> = OnceLock::new();
    FAMILIES_BY_SYMBOL.get_or_init(|| {
        CATALOG
            .iter()
            .flat_map(|spec| {
                spec.symbols
                    .iter()
                    .map(move |symbol| (*symbol, spec.family.as_str()))
            })
            .collect()
    })
}

impl Families {
    pub fn from_header(header: &Header) -> Self {
        Families {
            from_header: header
                .probes
                .iter()
                .map(|probe| (probe.symbol.clone(), Arc::from(probe.family.as_str())))
                .collect(),
        }
    }

    /// The family of a call's `name`, `None` for a function neither knows.
    pub fn of<'a>(&'a self, name: &str) -> Option<&'a str> {
        if let Some(family) = self.from_header.get(name) {
            return Some(family);
        }
        let base = STREAM_VARIANTS
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        catalog_families().get(base).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str, skip: bool) -> Result<Vec<Line>, ReadError> {
        let mut reader = TraceLines::new(text.as_bytes(), "t.jsonl", skip);
        let mut out = Vec::new();
        while let Some(line) = reader.next_line()? {
            out.push(line);
        }
        Ok(out)
    }

    #[test]
    fn every_line_type_is_read_with_its_fields() {
        let text = r#"{"type":"header","start_monotonic_ns":1000,"command":["./app","-x"],"pids":[7],"probes":[{"id":0,"symbol":"cuInit","function":"cuInit","family":"init"}]}
{"type":"process","event":"fork","pid":7,"tid":7,"ts_ns":1500,"child_pid":8,"comm":"app"}
{"type":"call","name":"cuInit","pid":7,"tid":7,"ts_ns":2000,"dur_ns":10,"ret":0}
{"type":"lost","ts_ns":2500,"reason":"ring_full","count":3,"total":3}
{"type":"driver","hook":"ioctl","pid":7,"tid":9,"ts_ns":3000,"dur_ns":40,"ret":0,"escape":42,"escape_name":"NV_ESC_RM_ALLOC","rm_class":"0x80"}
{"type":"gpu_sample","ts_ns":4000}
{"type":"footer"}
"#;
        let read = lines(text, false).unwrap();
        assert_eq!(read.len(), 7);
        let Line::Header(header) = &read[0] else {
            panic!("{:?}", read[0])
        };
        assert_eq!(header.start_monotonic_ns, Some(1000));
        assert_eq!(header.command, ["./app", "-x"]);
        assert_eq!(Families::from_header(header).of("cuInit"), Some("init"));
        let Line::Process(fork) = &read[1] else {
            panic!()
        };
        assert_eq!(
            (fork.event.as_str(), fork.child_pid, fork.comm.as_deref()),
            ("fork", Some(8), Some("app"))
        );
        assert!(matches!(&read[2], Line::Call(call) if call.ts_ns == 2000));
        assert!(
            matches!(&read[3], Line::Lost(lost) if lost.count == 3 && lost.reason == "ring_full")
        );
        let Line::Driver(driver) = &read[4] else {
            panic!()
        };
        assert_eq!(
            (driver.pid, driver.tid, driver.ts_ns, driver.dur_ns),
            (7, 9, 3000, 40)
        );
        assert_eq!(driver.name, "NV_ESC_RM_ALLOC");
        assert_eq!(driver.args["rm_class"], "0x80");
        assert!(!driver.args.contains_key("ts_ns"));
        assert!(matches!(read[5], Line::Unknown));
        assert!(matches!(read[6], Line::Footer));
    }

    #[test]
    fn bad_lines_fail_or_are_counted() {
        let text = "{\"type\":\"call\",\"name\":1}\nnot json\n{\"type\":\"footer\"}\n";
        let error = lines(text, false).err().unwrap().to_string();
        assert!(error.starts_with("t.jsonl:1: "), "{error}");
        let mut reader = TraceLines::new(text.as_bytes(), "t.jsonl", true);
        assert!(matches!(reader.next_line().unwrap(), Some(Line::Footer)));
        assert_eq!(reader.skipped_lines, 2);
        assert_eq!(reader.first_skipped[1].0, 2);
    }

    #[test]
    fn families_fall_back_to_the_catalog() {
        let families = Families::default();
        assert_eq!(families.of("cuLaunchKernel_ptsz"), Some("launch"));
        assert_eq!(families.of("cuMemcpyHtoDAsync_v2"), Some("copy"));
        assert_eq!(families.of("cuMemCreate"), Some("virtual_memory"));
        assert_eq!(families.of("cuSomethingNew"), None);
    }
}
