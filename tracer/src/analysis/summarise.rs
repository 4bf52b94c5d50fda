//! A whole trace read back through the analysis: what `cudatrace summary` prints and
//! `cudatrace plot` draws. Memory holds the analysis, never the trace.

use std::io::BufRead;

use serde::Serialize;

use super::{Analysis, Report, gpu_context::GpuContext, stacks::StackAccumulator};
use crate::{
    reader::{ReadError, TraceLines},
    schema::{GpuLine, Line},
};

/// Where the figures came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TraceInfo {
    pub file: String,
    /// The trace ends with its footer (false: cut short, e.g. the tracer was killed).
    pub complete: bool,
    pub lines: u64,
    /// Malformed lines passed over with --skip-bad-lines.
    pub skipped_lines: u64,
    /// The last line, cut mid-line by a killed tracer (its number; not among `lines`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cut_line: Option<u64>,
    /// Lines of a type this version does not know.
    pub unknown_lines: u64,
    /// Events the tracer lost (from the footer, else the `lost` lines).
    pub lost_events: u64,
    pub command: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The header's `start_monotonic_ns`: where times count from in a trace without calls.
    #[serde(skip)]
    pub start_monotonic_ns: Option<u64>,
    /// Libraries a process could not be given its probes on (`library_not_attached` lost
    /// lines): their calls are missing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub libraries_not_attached: Vec<NotAttached>,
}

/// A library a process did not get its probes on, from its `lost` line.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NotAttached {
    pub library: String,
    pub pid: Option<u32>,
    pub error: Option<String>,
}

/// What reading a trace gave.
pub struct Summarised {
    pub info: TraceInfo,
    pub report: Report,
    /// The first few lines passed over with `skip_bad_lines`: (line number, message).
    pub skipped: Vec<(u64, String)>,
}

/// Streams a trace through the analysis; `open` gives its lines from the start (twice for
/// a `--gpu` trace: the second pass finds what the CPU did in the GPU's idle gaps and the
/// GPU's busy time per stage, `gpu_context.rs`, and, with `--power`, shares the sampled
/// energy over the kernels, `power::GpuTimeEnergy`; both need the whole first pass). A
/// malformed line is an error naming the file and the line, unless the lines skip them.
pub fn summarise<R: BufRead>(
    mut open: impl FnMut() -> Result<TraceLines<R>, ReadError>,
) -> Result<Summarised, ReadError> {
    let mut summarised = first_pass(open()?)?;
    let report = &mut summarised.report;
    let mut context =
        GpuContext::wanted(&report.gpu).then(|| GpuContext::new(&report.gpu, &report.stages));
    let mut energy = report.kernel_energy.take();
    if context.is_some() || (energy.is_some() && report.gpu.kernels > 0) {
        let mut lines = open()?;
        while let Some(line) = lines.next_line()? {
            match (line, &mut context) {
                (Line::Call(call), Some(context)) => context.call(call),
                (Line::Gpu(gpu), context) => {
                    if let Some(context) = context {
                        context.gpu(gpu);
                    }
                    if let (GpuLine::Kernel(kernel), Some(energy)) = (&**gpu, &mut energy) {
                        energy.kernel(kernel);
                    }
                }
                _ => {}
            }
        }
    }
    if let Some(context) = context {
        context.finish(&mut report.gpu, &mut report.stages);
    }
    if let (Some(energy), Some(power)) = (energy, &mut report.power) {
        energy.finish(power);
    }
    Ok(summarised)
}

fn first_pass(mut lines: TraceLines<impl BufRead>) -> Result<Summarised, ReadError> {
    let mut analysis = Analysis::default();
    let mut info = TraceInfo {
        file: lines.label().to_owned(),
        ..TraceInfo::default()
    };
    let mut lost_lines: u64 = 0;
    let mut footer_lost = None;
    // `--stacks` traces: from the header that says so, or the first stack line.
    let mut stacks: Option<StackAccumulator> = None;
    let mut gpu_header = false;
    let mut issuing = None;
    while let Some(line) = lines.next_line()? {
        analysis.line(line);
        if matches!(line, Line::Stack(_)) && stacks.is_none() {
            stacks = Some(StackAccumulator::new(gpu_header, 1));
        }
        if let Some(stacks) = &mut stacks {
            stacks.line(line);
        }
        match line {
            Line::Header(header) => {
                info.command = std::mem::take(&mut header.command);
                info.start_monotonic_ns = header.start_monotonic_ns;
                gpu_header = header.gpu.is_some();
                if let Some(info) = &header.stacks {
                    stacks = Some(StackAccumulator::new(gpu_header, info.every()));
                }
            }
            Line::Lost(lost) => {
                lost_lines = lost_lines.saturating_add(lost.count);
                if let Some(library) = &lost.library {
                    info.libraries_not_attached.push(NotAttached {
                        library: library.clone(),
                        pid: lost.pid,
                        error: lost.error.clone(),
                    });
                }
            }
            Line::Footer(figures) => {
                info.complete = true;
                footer_lost = figures.lost_total;
                info.exit_code = figures.exit_code;
                issuing = figures.gpu_issuing;
            }
            Line::Unknown => info.unknown_lines += 1,
            Line::Call(_)
            | Line::Process(_)
            | Line::Driver(_)
            | Line::Power(_)
            | Line::Gpu(_)
            | Line::Library(_)
            | Line::Stack(_)
            | Line::Interpreter(_) => {}
        }
    }
    info.lines = lines.lines;
    info.skipped_lines = lines.skipped_lines;
    info.cut_line = lines.cut;
    info.lost_events = footer_lost.unwrap_or(lost_lines);
    let mut report = analysis.finish();
    let gpu = gpu_header || report.gpu.work > 0;
    report.stacks = stacks.map(|stacks| stacks.finish(&report.live_by_stack, gpu));
    report.gpu.issuing = issuing;
    Ok(Summarised {
        info,
        report,
        skipped: lines.first_skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{self, Line};
    use proptest::prelude::*;
    use serde_json::Value;

    /// Real lines of `cudatrace-driver sequence` under `cudatrace run`.
    const SAMPLE: &str = r#"{"type":"header","format":"cudatrace","version":1,"cudatrace_version":"0.1.0","mode":"command","command":["/tmp/so/cudatrace-driver","sequence"],"pids":[14859],"start_wall":"2026-11-21T12:53:09.680318868Z","start_wall_ns":1795265589680318868,"clock":"CLOCK_MONOTONIC","start_monotonic_ns":510681023498,"host":"vm","kernel":"Linux 6.18.44","libcuda":{"path":"/tmp/so/libcuda.so.1","version":null,"standin":true},"ring_bytes":16777216,"probes":[],"missing_functions":[],"aliases":[],"attach_failures":[]}
{"type":"process","event":"exec","pid":14859,"tid":14859,"ts_ns":510824561098,"filename":"/tmp/so/cudatrace-driver"}
{"type":"call","name":"cuInit","pid":14859,"tid":14859,"ts_ns":510825460997,"dur_ns":64145,"ret":0,"flags":0}
{"type":"call","name":"cuDevicePrimaryCtxRetain","pid":14859,"tid":14859,"ts_ns":510825541437,"dur_ns":10205,"ret":0,"context":"0x1000","device":0}
{"type":"call","name":"cuMemAlloc_v2","pid":14859,"tid":14859,"ts_ns":510825600000,"dur_ns":12000,"ret":0,"bytes":1048576,"dptr":"0x7f0000000000"}
{"type":"call","name":"cuMemAlloc_v2","pid":14859,"tid":14859,"ts_ns":510825700000,"dur_ns":9000,"ret":1,"ret_name":"CUDA_ERROR_INVALID_VALUE","bytes":0,"dptr":"0x0"}
{"type":"call","name":"cuMemcpyHtoD_v2","pid":14859,"tid":14859,"ts_ns":510825800000,"dur_ns":50000,"ret":0,"kind":"HtoD","bytes":1048576,"src":"0x55d0c0","dst":"0x7f0000000000"}
{"type":"call","name":"cuModuleGetFunction","pid":14859,"tid":14859,"ts_ns":510825900000,"dur_ns":11000,"ret":0,"function":"0x1030","symbol":"_Z10vector_addPKfS0_Pfi","module":"0x1020"}
{"type":"call","name":"cuLaunchKernel","pid":14859,"tid":14859,"ts_ns":510826000000,"dur_ns":10000,"ret":0,"grid":[4096,2,1],"block":[256,1,3],"shared_mem":1024,"stream":"0x1010","function":"0x1030"}
{"type":"call","name":"cuMemcpyDtoH_v2","pid":14859,"tid":14859,"ts_ns":510826100000,"dur_ns":20000,"ret":0,"kind":"DtoH","bytes":4096,"src":"0x7f0000000000","dst":"0x55d0c0","warnings":["entry_read_failed"]}
{"type":"lost","ts_ns":510826150000,"reason":"ring_full","count":3,"total":3}
{"type":"call","name":"cuMemFree_v2","pid":14859,"tid":14859,"ts_ns":510826200000,"dur_ns":9785,"ret":0,"dptr":"0x7f0000000000"}
{"type":"process","event":"exit","pid":14859,"tid":14859,"ts_ns":510826532361,"comm":"cudatrace-drive"}
{"type":"footer","end_wall":"2026-11-21T12:53:32.692849638Z","duration_ns":23012538191,"events":{"call":9,"process":2,"lost":1},"calls_by_name":{},"lost":{"ring_full":3,"too_deep":0,"frames_full":0,"total":3},"entries_seen":12,"unmatched_returns":0,"undecodable":0,"exit_code":0}
"#;

    fn read(text: &[u8], skip: bool) -> Result<Summarised, ReadError> {
        summarise(|| Ok(TraceLines::new(text, "trace.jsonl", skip)))
    }

    #[test]
    fn a_real_trace_is_read_whole() {
        let result = read(SAMPLE.as_bytes(), false).unwrap();
        assert!(result.info.complete);
        assert_eq!(result.info.lines, 14);
        assert_eq!(result.info.lost_events, 3);
        assert_eq!(result.info.exit_code, Some(0));
        assert_eq!(
            result.info.command,
            ["/tmp/so/cudatrace-driver", "sequence"]
        );
        let summary = &result.report.summary;
        assert_eq!((summary.calls, summary.errors), (9, 1));
        assert_eq!(
            summary.kernels[0].kernel,
            "vector_add(float const*, float const*, float*, int)"
        );
        let memory = &result.report.memory[0];
        assert_eq!(memory.peak_device_bytes, 1 << 20);
        assert_eq!(memory.final_device_bytes, 0);
    }

    #[test]
    fn calls_read_back_equal_what_was_written() {
        for line in SAMPLE.lines().filter(|l| l.contains(r#""type":"call""#)) {
            let Line::Call(record) = schema::parse(line.as_bytes()).unwrap() else {
                panic!("not a call: {line}");
            };
            assert_eq!(serde_json::to_string(&record).unwrap(), line);
            // Key order does not matter (the slow path).
            let value: Value = serde_json::from_str(line).unwrap();
            let mut reordered = serde_json::Map::new();
            for (key, field) in value.as_object().unwrap().iter().rev() {
                reordered.insert(key.clone(), field.clone());
            }
            let text = serde_json::to_string(&reordered).unwrap();
            assert_eq!(schema::parse(text.as_bytes()), Ok(Line::Call(record)));
        }
    }

    #[test]
    fn a_malformed_line_names_file_line_and_column() {
        let mut text = SAMPLE.lines().take(16).collect::<Vec<_>>().join("\n");
        text = text.replacen(
            r#"{"type":"call","name":"cuInit""#,
            r#"{"type":"call","name":cuInit"#,
            1,
        );
        let error = read(text.as_bytes(), false).err().unwrap();
        assert_eq!(
            error.to_string(),
            "trace.jsonl:3: expected value at column 23 (--skip-bad-lines reads past malformed lines)"
        );
        let garbage = "{\"type\":\"header\"}\n\n";
        let error = read(garbage.as_bytes(), false).err().unwrap();
        assert!(
            error
                .to_string()
                .starts_with("trace.jsonl:2: EOF while parsing a value at column 0"),
            "{error}"
        );
        // With its newline: a last line without one in a trace without footer is the cut.
        let wrong_type = "{\"type\":\"call\",\"name\":\"cuInit\",\"pid\":\"x\"}\n";
        assert_eq!(
            read(wrong_type.as_bytes(), false)
                .err()
                .unwrap()
                .to_string(),
            "trace.jsonl:1: invalid type: string \"x\", expected u32 at column 40 \
             (--skip-bad-lines reads past malformed lines)"
        );
    }

    #[test]
    fn skipping_bad_lines_counts_them_and_a_cut_trace_is_still_read() {
        // Cut in the middle of the free's line: no footer, a partial last line.
        let cut = SAMPLE
            .find(
                r#""dptr":"0x7f0000000000"}
{"type":"process","event":"exit""#,
            )
            .unwrap();
        let text = format!("not json\n{}", &SAMPLE[..cut]);
        let result = read(text.as_bytes(), true).unwrap();
        assert!(!result.info.complete);
        // The partial last line is the cut, not a malformed line; read alike without
        // skipping.
        assert_eq!(result.info.skipped_lines, 1);
        assert_eq!(result.skipped[0].0, 1);
        assert_eq!((result.info.cut_line, result.info.lines), (Some(13), 12));
        let whole = read(&text.as_bytes()["not json\n".len()..], false).unwrap();
        assert_eq!((whole.info.cut_line, whole.info.lines), (Some(12), 11));
        assert_eq!(whole.report.summary.calls, 8);
        assert_eq!(result.info.lost_events, 3, "from the lost lines");
        assert_eq!(result.report.summary.calls, 8);
        assert_eq!(result.report.memory[0].final_device_bytes, 1 << 20);
    }

    #[test]
    fn unknown_line_types_are_counted() {
        let result = read(b"{\"type\":\"counter\",\"x\":1}\n", false).unwrap();
        assert_eq!(result.info.unknown_lines, 1);
        assert!(read(b"[1,2]\n", false).is_err());
    }

    /// A mutation of one byte position: replace, delete, insert or cut.
    fn mutate(line: &str, ops: &[(u8, usize, u8)]) -> Vec<u8> {
        let mut bytes = line.as_bytes().to_vec();
        for &(op, at, byte) in ops {
            if bytes.is_empty() {
                break;
            }
            let at = at % bytes.len();
            match op % 4 {
                0 => bytes[at] = byte,
                1 => {
                    bytes.remove(at);
                }
                2 => bytes.insert(at, byte),
                _ => bytes.truncate(at),
            }
        }
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = read(&bytes, false);
            let _ = read(&bytes, true);
        }

        #[test]
        fn mutated_real_lines_never_panic(
            index in 0usize..14,
            ops in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<u8>()), 1..6),
        ) {
            let lines: Vec<&str> = SAMPLE.lines().collect();
            let mutated = mutate(lines[index], &ops);
            let _ = schema::parse(&mutated);
            let mut text = lines.join("\n").into_bytes();
            text.push(b'\n');
            text.extend_from_slice(&mutated);
            // Inserted newlines may split the mutated line in several.
            let pieces = 1 + mutated.iter().filter(|b| **b == b'\n').count() as u64;
            if let Ok(result) = read(&text, true) {
                prop_assert!(result.info.skipped_lines <= pieces);
                prop_assert!(result.report.summary.calls <= 9 + pieces);
            }
        }

        #[test]
        fn extreme_values_never_panic(
            ts in any::<u64>(), dur in any::<u64>(), bytes in any::<u64>(),
            pitch in any::<u64>(), handle in any::<u64>(), ret in any::<u32>(),
            name in proptest::sample::select(vec![
                "cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemFree_v2", "cuMemCreate",
                "cuMemMap", "cuMemUnmap", "cuMemRelease", "cuMemAddressReserve",
                "cuLaunchKernel", "cuMemcpyHtoD_v2", "cuModuleGetFunction", "cuSomething",
            ]),
        ) {
            let line = format!(
                r#"{{"type":"call","name":"{name}","pid":1,"tid":1,"ts_ns":{ts},"dur_ns":{dur},"ret":{ret},"bytes":{bytes},"pitch":{pitch},"height":{bytes},"dptr":"{handle:#x}","handle":"{handle:#x}","function":"{handle:#x}","symbol":"_Z{bytes}"}}"#
            );
            let text = format!("{line}\n{line}\n{line}\n");
            let result = read(text.as_bytes(), false);
            prop_assert!(result.is_ok(), "{:?}", result.err());
        }
    }
}
