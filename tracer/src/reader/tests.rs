use super::*;
use crate::analysis::families::Families;

fn lines(text: &str, skip: bool) -> Result<Vec<Line>, ReadError> {
    let mut reader = TraceLines::new(text.as_bytes(), "t.jsonl", skip);
    let mut out = Vec::new();
    while let Some(line) = reader.next_line()? {
        out.push(std::mem::replace(line, Line::Unknown));
    }
    Ok(out)
}

/// Everything a reader gives: each line (as text), then how it ended, and the counts.
fn outcome<R: BufRead>(mut reader: TraceLines<R>) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        match reader.next_line() {
            Ok(Some(line)) => seen.push(format!("{line:?}")),
            Ok(None) => {
                seen.push("end".into());
                break;
            }
            Err(e) => {
                seen.push(e.to_string());
                break;
            }
        }
    }
    seen.push(format!(
        "{} lines, {} skipped, first {:?}, cut {:?}",
        reader.lines, reader.skipped_lines, reader.first_skipped, reader.cut
    ));
    seen
}

/// A file with `text`, removed when dropped.
struct TempTrace(std::path::PathBuf);

impl TempTrace {
    fn new(name: &str, text: &[u8]) -> TempTrace {
        let path = std::env::temp_dir().join(format!(
            "cudatrace-reader-{}-{name}.jsonl",
            std::process::id()
        ));
        std::fs::write(&path, text).unwrap();
        TempTrace(path)
    }

    fn open(&self, skip: bool) -> TraceLines<io::Empty> {
        TraceLines::from_file(File::open(&self.0).unwrap(), "t.jsonl", skip)
    }
}

impl Drop for TempTrace {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Several blocks of lines, with CRLF, empty and malformed lines among them and no
/// newline at the end: the workers give what this thread gives, in order.
#[test]
fn the_workers_read_what_this_thread_reads() {
    let mut text = String::new();
    for index in 0..6000u64 {
        match index % 997 {
            13 => text.push_str("not json\n"),
            14 => text.push('\n'),
            15 => text.push_str("{\"type\":\"footer\"}\r\n"),
            _ => text.push_str(&format!(
                "{{\"type\":\"call\",\"name\":\"cuInit\",\"pid\":1,\"tid\":1,\"ts_ns\":{index},\"dur_ns\":1,\"ret\":0,\"kernel\":\"{}\"}}\n",
                "k".repeat(index as usize % 200)
            )),
        }
    }
    text.push_str("{\"type\":\"footer\"}");
    assert!(text.len() > 3 * (256 << 10), "several blocks");
    let file = TempTrace::new("blocks", text.as_bytes());
    for skip in [false, true] {
        let here = outcome(TraceLines::new(text.as_bytes(), "t.jsonl", skip));
        let workers = outcome(file.open(skip));
        assert_eq!(here.len(), workers.len(), "skip {skip}");
        assert!(here == workers, "skip {skip}");
    }
    let all = outcome(file.open(true));
    assert_eq!(all.len(), 6000 - 2 * 7 + 1 + 2);
    assert_eq!(
        all.last().unwrap(),
        "6001 lines, 14 skipped, first [(14, \"expected ident at column 2\"), \
         (15, \"EOF while parsing a value at column 0\"), \
         (1011, \"expected ident at column 2\"), \
         (1012, \"EOF while parsing a value at column 0\"), \
         (2008, \"expected ident at column 2\")], cut None"
    );
}

#[test]
fn the_workers_skip_overlong_lines_and_report_missing_files() {
    let mut text = vec![b'x'; MAX_LINE_BYTES + 1];
    text.extend_from_slice(b"\n{\"type\":\"footer\"}\n");
    let file = TempTrace::new("long", &text);
    let here = outcome(TraceLines::new(&text[..], "t.jsonl", true));
    let workers = outcome(file.open(true));
    assert_eq!(here, workers);
    assert_eq!(
        workers,
        [
            "Footer(FooterFigures { lost_total: None, exit_code: None, gpu_issuing: None, \
             stacks_without: None, stack_records: None })",
            "end",
            "2 lines, 1 skipped, first [(1, \"line longer than 64 MiB\")], cut None"
        ]
    );
    assert_eq!(
        outcome(file.open(false))[0],
        "t.jsonl:1: line longer than 64 MiB (--skip-bad-lines reads past malformed lines)"
    );
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
    assert!(matches!(&read[3], Line::Lost(lost) if lost.count == 3 && lost.reason == "ring_full"));
    let Line::Driver(driver) = &read[4] else {
        panic!()
    };
    assert_eq!(
        (driver.pid, driver.tid, driver.ts_ns, driver.dur_ns),
        (7, 9, 3000, 40)
    );
    assert_eq!(driver.what(), "NV_ESC_RM_ALLOC");
    assert_eq!(driver.details()["rm_class"], "0x80");
    assert!(!driver.details().contains_key("ts_ns"));
    assert!(matches!(read[5], Line::Unknown));
    assert!(matches!(read[6], Line::Footer(_)));
}

#[test]
fn bad_lines_fail_or_are_counted() {
    let text = "{\"type\":\"call\",\"name\":1}\nnot json\n{\"type\":\"footer\"}\n";
    let error = lines(text, false).err().unwrap().to_string();
    assert!(error.starts_with("t.jsonl:1: "), "{error}");
    let mut reader = TraceLines::new(text.as_bytes(), "t.jsonl", true);
    assert!(matches!(reader.next_line().unwrap(), Some(Line::Footer(_))));
    assert_eq!(reader.skipped_lines, 2);
    assert_eq!(reader.first_skipped[1].0, 2);
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
fn a_partial_last_line_without_footer_is_the_cut_on_both_readers() {
    let call = r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":5,"ret":0}"#;
    // (text, skip, what every reader gives): the cut ends the lines, skipping or not; a
    // partial line after a footer, or a whole malformed line, is malformed.
    let cases: [(String, bool, &str); 4] = [
        (
            format!("{call}\n{{\"type\":\"ca"),
            false,
            "1 lines, 0 skipped, first [], cut Some(2)",
        ),
        (
            format!("x\n{call}\n{{\"type"),
            true,
            "2 lines, 1 skipped, first [(1, \"expected value at column 1\")], cut Some(3)",
        ),
        (
            format!("{call}\n{{\"type\":\"footer\"}}\n{{\"ty"),
            false,
            "t.jsonl:3: EOF while parsing a string at column 4 (--skip-bad-lines reads past malformed lines)",
        ),
        (
            format!("{call}\n{{\"type\":\n"),
            false,
            "t.jsonl:2: EOF while parsing a value at column 8 (--skip-bad-lines reads past malformed lines)",
        ),
    ];
    for (text, skip, expected) in cases {
        let file = TempTrace::new("cut", text.as_bytes());
        let here = outcome(TraceLines::new(text.as_bytes(), "t.jsonl", skip));
        assert_eq!(outcome(file.open(skip)), here, "{text}");
        // The counts come last; an error just before them.
        let said = match expected.contains("lines, ") {
            true => &here[here.len() - 1],
            false => &here[here.len() - 2],
        };
        assert_eq!(said, expected, "{text}: {here:?}");
    }
}
