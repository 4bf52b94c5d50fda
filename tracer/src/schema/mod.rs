//! The trace format as types: one struct per kind of line, in one file per kind, and
//! [`Line`], the one enum of them. `cudatrace run` decodes each record into a `Line` and
//! the writer (`sinks::jsonl`) writes it; every reader (`summary`, `export`, `plot`) gets
//! the same `Line`s back from [`parse`] (or from the faster reader beside it, `reader/`,
//! which gives the same lines), so what is written and what is read cannot drift apart.
//! docs/trace-format.md describes the format for people.
//!
//! | file | line | |
//! |---|---|---|
//! | `header.rs` | [`Header`] | first line: command, clock, library, probes |
//! | `call.rs` | [`CallLine`] | one driver call (nearly every line) |
//! | `process.rs` | [`ProcessLine`] | fork, exec, exit of a traced process |
//! | `lost.rs` | [`LostLine`] | events the kernel dropped |
//! | `driver.rs` | [`DriverLine`] | `--kernel`: the NVIDIA module's ioctls, mmaps, Xids |
//! | `power.rs` | [`PowerLine`] | `--power`: one NVML sample of one GPU |
//! | `gpu.rs` | [`GpuLine`] | `--gpu`: kernels, copies, memsets that ran; recording status |
//! | `library.rs` | [`LibraryLine`] | a library file the probes were attached to |
//! | `stack.rs` | [`StackLine`], [`InterpreterLine`] | `--stacks`: a Python stack, written once; a process's interpreter |
//! | `footer.rs` | [`Footer`] | last line: counts, losses, exit, memory |
//!
//! Rules of the format: keys are written in the struct's field order, `type` first;
//! optional fields are left out rather than written as `null`; pointers are
//! [`Hex`] strings. Within a [`FORMAT_VERSION`] fields may be added, never renamed,
//! removed or given another meaning; readers ignore keys they do not know and count
//! lines of a type they do not know ([`Line::Unknown`]).
//!
//! # Adding a kind of line (`gpu_kernel`, `gpu_copy`, `gpu_memset`, `power`, ...)
//!
//! 1. A file here with its struct, deriving `Serialize` and `Deserialize`:
//!    `#[serde(rename = "type")] pub tag: Tag<Self>` as the first field (`fields.rs`), optional fields
//!    `Option`s with `skip_serializing_if = "Option::is_none"`, `#[serde(default)]` on the
//!    struct so that a reader only insists on what it cannot do without. Implement
//!    [`LineType`] (its `"type"`) and [`EventLine`] (how the footer counts it).
//! 2. In `footer.rs`, its count in `EventCounts`.
//! 3. Here, a [`Line`] variant, and in [`parse`] an arm that checks the fields a reader
//!    cannot do without (with a message naming the line and field) and deserialises it.
//! 4. The consumers, each of which matches every variant (the compiler lists them): the
//!    writer (`TraceWriter::line`), the analysis (`Analysis::line`), the readers
//!    (`analysis/summarise.rs`, `export/exporter.rs`, `plot/`). docs/trace-format.md
//!    documents it.

pub mod call;
mod driver;
mod fields;
mod footer;
pub mod gpu;
mod header;
mod library;
mod lost;
mod power;
mod process;
mod stack;

#[cfg(test)]
pub mod testing;
pub use call::CallLine;
pub(crate) use call::call_fields;
pub use driver::DriverLine;
pub use fields::{Hex, LineType};
pub use footer::{
    CodeFreeProbeCounts, EventLine, Footer, FooterFigures, GpuFooter, IssuingCalls, Leak,
    LostCounts, MemoryFooter, PowerFooter, ProcessMemory, StackRecordCounts, StacklessCounts,
    StacksFooter, StopFigures, WindowFooter,
};
pub use gpu::{
    GpuCopyLine, GpuErrorLine, GpuGapLine, GpuInfoLine, GpuKernelLine, GpuLine, GpuLink,
    GpuMemsetLine,
};
pub use header::{
    AttachFailureInfo, AttachInfo, GpuHeaderInfo, Header, JOB_ID_VARIABLES, KernelHooksInfo,
    LibcudaInfo, ProbeInfo, StacksInfo, WindowInfo, check_header,
};
pub use library::LibraryLine;
pub use lost::LostLine;
pub use power::{
    ENERGY_FROM_COUNTER, ENERGY_FROM_POWER, NvmlInfo, PowerDevice, PowerInfo, PowerLine,
};
pub use process::{ProcessEvent, ProcessLine};
pub use stack::{InterpreterLine, LayoutChecked, StackFrame, StackLine};

use serde_json::Value;

/// Bumped on any incompatible change of the line schema.
pub const FORMAT_VERSION: u32 = 4;

/// One line of a trace, as read back.
#[derive(Debug, PartialEq)]
pub enum Line {
    Header(Box<Header>),
    Call(Box<CallLine>),
    Process(ProcessLine),
    Lost(LostLine),
    Driver(Box<DriverLine>),
    Power(Box<PowerLine>),
    /// `--gpu`: a kernel, copy or memset that ran, or a recording status line.
    Gpu(Box<GpuLine>),
    Library(Box<LibraryLine>),
    /// `--stacks`: a Python stack, and a process's interpreter.
    Stack(Box<StackLine>),
    Interpreter(Box<InterpreterLine>),
    /// Boxed: read once a trace, and the largest of the lines' figures.
    Footer(Box<FooterFigures>),
    /// A type this version does not know (a newer trace).
    Unknown,
}

/// Parses one line (without its newline); the error says what is wrong, and where when
/// the JSON itself is. Never panics. (The readers read most lines faster, to the same
/// result: `reader/parse.rs`.)
pub fn parse(bytes: &[u8]) -> Result<Line, String> {
    // The tracer writes `type` first: call lines (nearly all of them) parse in one pass.
    if bytes.starts_with(call::FAST_PREFIX) {
        return CallLine::read_fast(bytes).map(|call| Line::Call(Box::new(call)));
    }
    for (prefix, kind) in gpu::FAST_PREFIXES {
        if bytes.starts_with(prefix) {
            return read_gpu(kind, bytes);
        }
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| fields::describe(&e))?;
    let Some(kind) = value.get("type").and_then(Value::as_str) else {
        return Err("not a trace line: no \"type\" string".into());
    };
    Ok(match kind {
        CallLine::TYPE => Line::Call(Box::new(CallLine::read_value(value)?)),
        Header::TYPE => Line::Header(Box::new(Header::read(bytes)?)),
        ProcessLine::TYPE => Line::Process(ProcessLine::read(&value, bytes)?),
        LostLine::TYPE => Line::Lost(LostLine::read(&value, bytes)?),
        DriverLine::TYPE => Line::Driver(Box::new(DriverLine::read(&value, bytes)?)),
        PowerLine::TYPE => Line::Power(Box::new(PowerLine::read(&value, bytes)?)),
        LibraryLine::TYPE => Line::Library(Box::new(LibraryLine::read(&value, bytes)?)),
        StackLine::TYPE => Line::Stack(Box::new(StackLine::read(&value, bytes)?)),
        InterpreterLine::TYPE => Line::Interpreter(Box::new(InterpreterLine::read(&value, bytes)?)),
        Footer::TYPE => Line::Footer(Box::new(FooterFigures::read(&value))),
        other => match GpuLine::read(other, bytes) {
            Some(line) => Line::Gpu(Box::new(line?)),
            None => Line::Unknown,
        },
    })
}

fn read_gpu(kind: &str, bytes: &[u8]) -> Result<Line, String> {
    match GpuLine::read(kind, bytes) {
        Some(line) => line.map(|line| Line::Gpu(Box::new(line))),
        None => Ok(Line::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `line`, checks the exact text, reads it back.
    fn round_trip<L: serde::Serialize>(line: &L, text: &str) -> Line {
        assert_eq!(serde_json::to_string(line).unwrap(), text);
        parse(text.as_bytes()).unwrap()
    }

    #[test]
    fn event_lines_are_written_type_first_and_read_back_equal() {
        let fork = ProcessLine {
            event: "fork".into(),
            pid: 7,
            tid: 8,
            ts_ns: 9,
            child_pid: Some(10),
            comm: Some("app".into()),
            ..ProcessLine::default()
        };
        let read = round_trip(
            &fork,
            r#"{"type":"process","event":"fork","pid":7,"tid":8,"ts_ns":9,"child_pid":10,"comm":"app"}"#,
        );
        assert_eq!(read, Line::Process(fork));

        let lost = LostLine {
            ts_ns: 5,
            reason: "ring_full".into(),
            count: 2,
            total: 3,
            ..LostLine::default()
        };
        let read = round_trip(
            &lost,
            r#"{"type":"lost","ts_ns":5,"reason":"ring_full","count":2,"total":3}"#,
        );
        // `total` is written for people; readers add up the counts.
        assert_eq!(read, Line::Lost(LostLine { total: 0, ..lost }));

        let mmap = DriverLine {
            hook: "mmap".into(),
            pid: 1,
            tid: 2,
            ts_ns: 3,
            dur_ns: 4,
            ret: 5,
            device: Some("nvidia0".into()),
            fd: Some(9),
            length: Some(4096),
            ..DriverLine::default()
        };
        let read = round_trip(
            &mmap,
            r#"{"type":"driver","hook":"mmap","pid":1,"tid":2,"ts_ns":3,"dur_ns":4,"ret":5,"device":"nvidia0","fd":9,"length":4096}"#,
        );
        assert_eq!(read, Line::Driver(Box::new(mmap)));

        let call = CallLine {
            name: "cuMemAlloc_v2".into(),
            pid: 1,
            tid: 1,
            ts_ns: 2,
            dur_ns: Some(3),
            ret: Some(0),
            bytes: Some(64),
            dptr: Some(Hex(0x7f00)),
            ..CallLine::default()
        };
        let read = round_trip(
            &call,
            r#"{"type":"call","name":"cuMemAlloc_v2","pid":1,"tid":1,"ts_ns":2,"dur_ns":3,"ret":0,"bytes":64,"dptr":"0x7f00"}"#,
        );
        assert_eq!(read, Line::Call(Box::new(call)));
    }

    #[test]
    fn a_call_without_its_return_has_no_ret_nor_dur_either_way_it_is_read() {
        let launch = CallLine {
            name: "cuLaunchKernel".into(),
            pid: 1,
            tid: 2,
            ts_ns: 3,
            grid: Some([4, 1, 1]),
            ..CallLine::default()
        };
        let text =
            r#"{"type":"call","name":"cuLaunchKernel","pid":1,"tid":2,"ts_ns":3,"grid":[4,1,1]}"#;
        assert_eq!(
            round_trip(&launch, text),
            Line::Call(Box::new(launch.clone()))
        );
        // The compact reader and serde_json (keys in another order) agree.
        let reordered =
            r#"{"name":"cuLaunchKernel","type":"call","pid":1,"tid":2,"ts_ns":3,"grid":[4,1,1]}"#;
        assert_eq!(
            parse(reordered.as_bytes()),
            Ok(Line::Call(Box::new(launch.clone())))
        );
        assert!(launch.ok(), "an unknown result counts as a success");
        assert_eq!((launch.dur_or_zero(), launch.end_ns()), (0, None));
        let failed = CallLine {
            ret: Some(1),
            dur_ns: Some(5),
            ..launch
        };
        assert!(!failed.ok());
        assert_eq!((failed.dur_or_zero(), failed.end_ns()), (5, Some(8)));
    }

    #[test]
    fn the_header_is_written_whole_and_read_for_what_viewers_use() {
        let header = Header {
            format: "cudatrace".into(),
            version: FORMAT_VERSION,
            mode: "command".into(),
            command: vec!["./app".into()],
            pids: vec![7],
            start_monotonic_ns: Some(100),
            probes: vec![ProbeInfo {
                id: 0,
                lib: 0,
                symbol: "cuInit".into(),
                function: "cuInit".into(),
                family: "init".into(),
                entry_only: false,
            }],
            missing_functions: vec!["cuMemAlloc".into()],
            ..Header::default()
        };
        let text = serde_json::to_string(&header).unwrap();
        assert!(
            text.starts_with(r#"{"type":"header","format":"cudatrace","version":4,"#),
            "{text}"
        );
        assert!(!text.contains("kernel_hooks"), "absent unless --kernel");
        assert!(
            !text.contains("entry_only"),
            "absent without --launch-entry-only"
        );
        let lean = Header {
            launch_entry_only: true,
            probes: vec![ProbeInfo {
                id: 0,
                lib: 0,
                symbol: "cuLaunchKernel".into(),
                function: "cuLaunchKernel".into(),
                family: "launch".into(),
                entry_only: true,
            }],
            ..Header::default()
        };
        let lean_text = serde_json::to_string(&lean).unwrap();
        assert!(
            lean_text.contains(r#""launch_entry_only":true"#),
            "{lean_text}"
        );
        assert!(
            lean_text.contains(r#""family":"launch","entry_only":true}"#),
            "{lean_text}"
        );
        let Line::Header(lean_read) = parse(lean_text.as_bytes()).unwrap() else {
            panic!("not a header")
        };
        assert!(lean_read.launch_entry_only && lean_read.probes[0].entry_only);
        let Line::Header(read) = parse(text.as_bytes()).unwrap() else {
            panic!("not a header")
        };
        assert_eq!(
            (&read.command, &read.pids, read.start_monotonic_ns),
            (&header.command, &header.pids, Some(100))
        );
        assert_eq!(read.probes[0].family, "init");
        // Written for people and other tools, skipped when read.
        assert_eq!((read.version, read.missing_functions.len()), (0, 0));
    }

    #[test]
    fn a_library_line_is_written_type_first_and_read_back() {
        let library = LibraryLine {
            id: 1,
            set: "libcuda".into(),
            path: "/w/libcuda.so.1".into(),
            device: 2049,
            inode: 77,
            found: "opened".into(),
            pid: Some(9),
            ts_ns: Some(5),
            probes: vec![ProbeInfo {
                id: 111,
                lib: 1,
                symbol: "cuInit".into(),
                function: "cuInit".into(),
                family: "init".into(),
                entry_only: false,
            }],
            ..LibraryLine::default()
        };
        let text = serde_json::to_string(&library).unwrap();
        assert_eq!(
            text,
            r#"{"type":"library","id":1,"set":"libcuda","path":"/w/libcuda.so.1","device":2049,"inode":77,"standin":false,"found":"opened","pid":9,"ts_ns":5,"probes":[{"id":111,"lib":1,"symbol":"cuInit","function":"cuInit","family":"init"}],"missing_functions":[]}"#
        );
        let Ok(Line::Library(read)) = parse(text.as_bytes()) else {
            panic!("not a library line")
        };
        assert_eq!((read.id, read.probes[0].lib), (1, 1));
        assert_eq!(read.probes[0].symbol, "cuInit");
        assert_eq!(
            parse(br#"{"type":"library","path":"/x"}"#),
            Err(r#"library line: no valid "id""#.to_owned())
        );
    }

    #[test]
    fn the_footer_gives_its_figures_leniently() {
        let footer = Footer {
            exit_code: Some(3),
            lost: LostCounts {
                total: 4,
                ..Default::default()
            },
            ..Footer::default()
        };
        let text = serde_json::to_string(&footer).unwrap();
        assert!(
            text.starts_with(r#"{"type":"footer","end_wall":"#),
            "{text}"
        );
        assert_eq!(
            parse(text.as_bytes()),
            Ok(Line::Footer(Box::new(FooterFigures {
                lost_total: Some(4),
                exit_code: Some(3),
                gpu_issuing: None,
                stacks_without: None,
                stack_records: None,
            })))
        );
        assert_eq!(
            parse(br#"{"type":"footer","exit_code":"x","lost":5}"#),
            Ok(Line::Footer(Box::default()))
        );
    }

    #[test]
    fn missing_fields_are_named() {
        for (line, message) in [
            (r#"{"x":1}"#, r#"not a trace line: no "type" string"#),
            (
                r#"{"type":"process","event":"exec"}"#,
                r#"process line: no valid "pid""#,
            ),
            (
                r#"{"type":"process","pid":1}"#,
                r#"process line: no "event" string"#,
            ),
            (
                r#"{"type":"lost","ts_ns":1}"#,
                r#"lost line: no "count" number"#,
            ),
            (
                r#"{"type":"driver","pid":1,"ts_ns":1}"#,
                r#"driver line: no "hook" string"#,
            ),
            (
                r#"{"type":"driver","hook":"ioctl","ts_ns":1}"#,
                r#"driver line: no "pid" number"#,
            ),
            (
                r#"{"type":"driver","hook":"ioctl","pid":1}"#,
                r#"driver line: no "ts_ns" number"#,
            ),
            (
                r#"{"type":"driver","hook":"ioctl","pid":5000000000,"ts_ns":1}"#,
                "driver line: pid out of range",
            ),
            (
                r#"{"type":"header","pids":"x"}"#,
                r#"header line: invalid type: string "x", expected a sequence at line 1 column 27"#,
            ),
            (
                r#"{"name":"cuInit","type":"call","pid":"x"}"#,
                r#"call line: invalid type: string "x", expected u32"#,
            ),
        ] {
            assert_eq!(parse(line.as_bytes()), Err(message.to_owned()), "{line}");
        }
    }

    #[test]
    fn a_driver_line_without_a_thread_is_its_main_thread() {
        let Ok(Line::Driver(line)) = parse(br#"{"type":"driver","hook":"xid","pid":4,"ts_ns":1}"#)
        else {
            panic!("not a driver line")
        };
        assert_eq!((line.pid, line.tid), (4, 4));
    }
}
