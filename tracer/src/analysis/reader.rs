//! Reading a JSONL trace back, one line at a time, into the analysis.

use std::io::{self, BufRead};

use serde_json::Value;

use super::{Analysis, Report, summary::TraceInfo};
use crate::events::CallRecord;

/// Longer lines are malformed (a footer listing 1000 leaks per process is far shorter).
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// One line of a trace, as far as the summary needs it.
#[derive(Debug, PartialEq)]
pub enum TraceLine {
    /// A `--kernel` driver line.
    Driver(super::driver::DriverLine),
    Header {
        command: Vec<String>,
    },
    Call(Box<CallRecord>),
    Process {
        pid: u32,
        event: String,
    },
    Lost {
        count: u64,
    },
    Footer {
        lost: Option<u64>,
        exit_code: Option<i32>,
    },
    /// A line type this version does not know (a newer trace).
    Unknown,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {file}: {source}")]
    Io { file: String, source: io::Error },
    #[error("{file}:{line}: {message} (--skip-bad-lines reads past malformed lines)")]
    BadLine {
        file: String,
        line: u64,
        message: String,
    },
}

/// serde_json's message with the column; every trace line is one line of text.
fn describe(error: &serde_json::Error) -> String {
    let text = error.to_string();
    if error.line() == 0 {
        return text;
    }
    let message = text
        .rsplit_once(" at line ")
        .map_or(text.as_str(), |(message, _)| message);
    format!("{message} at column {}", error.column())
}

/// Parses one line (without its newline). Never panics.
pub fn parse_line(line: &[u8]) -> Result<TraceLine, String> {
    // The tracer writes `type` first: call lines (nearly all of them) parse in one pass.
    if line.starts_with(br#"{"type":"call","#) {
        return serde_json::from_slice::<CallRecord>(line)
            .map(|record| TraceLine::Call(Box::new(record)))
            .map_err(|e| describe(&e));
    }
    let value: Value = serde_json::from_slice(line).map_err(|e| describe(&e))?;
    let Some(kind) = value.get("type").and_then(Value::as_str) else {
        return Err("not a trace line: no \"type\" string".into());
    };
    let number = |key: &str| value.get(key).and_then(Value::as_u64);
    match kind {
        "call" => serde_json::from_value::<CallRecord>(value)
            .map(|record| TraceLine::Call(Box::new(record)))
            .map_err(|e| format!("call line: {}", describe(&e))),
        "header" => Ok(TraceLine::Header {
            command: value
                .get("command")
                .and_then(Value::as_array)
                .map(|args| {
                    args.iter()
                        .filter_map(|a| a.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
        }),
        "process" => {
            let pid = number("pid")
                .and_then(|pid| u32::try_from(pid).ok())
                .ok_or("process line: no valid \"pid\"")?;
            let event = value
                .get("event")
                .and_then(Value::as_str)
                .ok_or("process line: no \"event\" string")?;
            Ok(TraceLine::Process {
                pid,
                event: event.to_owned(),
            })
        }
        "driver" => super::driver::DriverLine::from_value(&value).map(TraceLine::Driver),
        "lost" => Ok(TraceLine::Lost {
            count: number("count").ok_or("lost line: no \"count\" number")?,
        }),
        "footer" => Ok(TraceLine::Footer {
            lost: value
                .get("lost")
                .and_then(|lost| lost.get("total"))
                .and_then(Value::as_u64),
            exit_code: value
                .get("exit_code")
                .and_then(Value::as_i64)
                .and_then(|code| i32::try_from(code).ok()),
        }),
        _ => Ok(TraceLine::Unknown),
    }
}

/// Reads one line into `buf` (newline and a trailing CR removed). `Ok(None)` at the end;
/// `Ok(Some(false))` for a line over `max` bytes, which is consumed but not kept.
pub fn read_line(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<Option<bool>> {
    buf.clear();
    let mut read_any = false;
    let mut too_long = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            break;
        }
        read_any = true;
        let (chunk, done) = match available.iter().position(|b| *b == b'\n') {
            Some(at) => (&available[..at], Some(at + 1)),
            None => (available, None),
        };
        if !too_long {
            if buf.len() + chunk.len() > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = done.unwrap_or(available.len());
        reader.consume(used);
        if done.is_some() {
            break;
        }
    }
    if !read_any {
        return Ok(None);
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(Some(!too_long))
}

/// What reading a trace gave.
pub struct Summarised {
    pub info: TraceInfo,
    pub report: Report,
    /// The first few lines passed over with `skip_bad_lines`: (line number, message).
    pub skipped: Vec<(u64, String)>,
}

/// Streams a trace through the analysis. A malformed line is an error naming `file` and
/// the line, unless `skip_bad_lines`.
pub fn summarise(
    mut reader: impl BufRead,
    file: &str,
    skip_bad_lines: bool,
) -> Result<Summarised, ReadError> {
    let mut analysis = Analysis::default();
    let mut info = TraceInfo {
        file: file.to_owned(),
        ..TraceInfo::default()
    };
    let mut skipped = Vec::new();
    let mut lost_lines: u64 = 0;
    let mut footer_lost = None;
    let mut buf = Vec::new();
    loop {
        let kept =
            read_line(&mut reader, &mut buf, MAX_LINE_BYTES).map_err(|source| ReadError::Io {
                file: file.to_owned(),
                source,
            })?;
        let Some(kept) = kept else { break };
        info.lines += 1;
        let parsed = if kept {
            parse_line(&buf)
        } else {
            Err(format!("line longer than {} MiB", MAX_LINE_BYTES >> 20))
        };
        match parsed {
            Ok(TraceLine::Call(mut record)) => analysis.observe(&mut record),
            Ok(TraceLine::Process { pid, event }) => analysis.process_event(pid, &event),
            Ok(TraceLine::Driver(line)) => analysis.driver(&line),
            Ok(TraceLine::Header { command }) => info.command = command,
            Ok(TraceLine::Lost { count }) => lost_lines = lost_lines.saturating_add(count),
            Ok(TraceLine::Footer { lost, exit_code }) => {
                info.complete = true;
                footer_lost = lost;
                info.exit_code = exit_code;
            }
            Ok(TraceLine::Unknown) => info.unknown_lines += 1,
            Err(message) if skip_bad_lines => {
                info.skipped_lines += 1;
                if skipped.len() < 5 {
                    skipped.push((info.lines, message));
                }
            }
            Err(message) => {
                return Err(ReadError::BadLine {
                    file: file.to_owned(),
                    line: info.lines,
                    message,
                });
            }
        }
    }
    info.lost_events = footer_lost.unwrap_or(lost_lines);
    Ok(Summarised {
        info,
        report: analysis.finish(),
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        summarise(text, "trace.jsonl", skip)
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
            let TraceLine::Call(record) = parse_line(line.as_bytes()).unwrap() else {
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
            assert_eq!(parse_line(text.as_bytes()), Ok(TraceLine::Call(record)));
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
        let wrong_type = r#"{"type":"call","name":"cuInit","pid":"x"}"#;
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
        assert_eq!(result.info.skipped_lines, 2);
        assert_eq!(result.skipped[0].0, 1);
        assert_eq!(result.skipped[1].0, 13);
        assert_eq!(result.info.lost_events, 3, "from the lost lines");
        assert_eq!(result.report.summary.calls, 8);
        assert_eq!(result.report.memory[0].final_device_bytes, 1 << 20);
    }

    #[test]
    fn overlong_lines_are_malformed_not_kept() {
        let mut reader: &[u8] = b"abcdef\nxy\r\nlast";
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut reader, &mut buf, 4).unwrap(), Some(false));
        assert_eq!(read_line(&mut reader, &mut buf, 4).unwrap(), Some(true));
        assert_eq!(buf, b"xy");
        assert_eq!(read_line(&mut reader, &mut buf, 4).unwrap(), Some(true));
        assert_eq!(buf, b"last");
        assert_eq!(read_line(&mut reader, &mut buf, 4).unwrap(), None);
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
            let _ = parse_line(&mutated);
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
