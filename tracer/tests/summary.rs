//! `cudatrace summary` on hand-written traces (no root needed): exit codes, malformed and
//! cut-short traces.

mod common;

use std::{
    path::Path,
    process::{Command, Output, Stdio},
};

use common::{CUDATRACE, scratch, stderr};
use serde_json::Value;

const HEADER: &str =
    r#"{"type":"header","format":"cudatrace","version":1,"command":["./app"],"pids":[42]}"#;
const FOOTER: &str = r#"{"type":"footer","events":{"call":4},"lost":{"total":0},"exit_code":0}"#;

fn calls() -> Vec<String> {
    let call = |name: &str, ts: u64, extra: &str| {
        format!(
            r#"{{"type":"call","name":"{name}","pid":42,"tid":42,"ts_ns":{ts},"dur_ns":100,"ret":0{extra}}}"#
        )
    };
    vec![
        call("cuInit", 1000, r#","flags":0"#),
        call(
            "cuMemAlloc_v2",
            2000,
            r#","bytes":4096,"dptr":"0x7f0000000000""#,
        ),
        call(
            "cuModuleGetFunction",
            3000,
            r#","function":"0x10","symbol":"_Z3addPfi""#,
        ),
        call(
            "cuLaunchKernel",
            4000,
            r#","function":"0x10","grid":[1,1,1],"block":[64,1,1]"#,
        ),
    ]
}

/// Writes `lines` to `NAME/trace.jsonl` in a fresh directory and summarises it.
fn summary(name: &str, lines: &[String], extra: &[&str]) -> Output {
    let path = scratch(&format!("summary-{name}")).join("trace.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    Command::new(CUDATRACE)
        .arg("summary")
        .args(extra)
        .arg(&path)
        .output()
        .expect("running cudatrace summary")
}

fn trace(middle: Vec<String>, footer: bool) -> Vec<String> {
    let mut lines = vec![HEADER.to_owned()];
    lines.extend(middle);
    if footer {
        lines.push(FOOTER.to_owned());
    }
    lines
}

#[test]
fn a_complete_trace_is_summarised_as_text_and_json() {
    let output = summary("text", &trace(calls(), true), &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stderr(&output), "");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("4 calls (0 errors) in 1 process"), "{text}");
    assert!(text.contains("add(float*, int)"), "{text}");
    assert!(
        text.contains("4096 B device 0x7f0000000000 from cuMemAlloc_v2"),
        "{text}"
    );

    let output = summary("json", &trace(calls(), true), &["--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["trace"]["complete"], true);
    assert_eq!(json["trace"]["command"][0], "./app");
    assert_eq!(json["kernels"][0]["kernel"], "add(float*, int)");
    assert_eq!(json["kernels"][0]["kernel_mangled"], "_Z3addPfi");
    assert_eq!(json["memory"][0]["leaks"][0]["bytes"], 4096);
}

#[test]
fn a_malformed_line_exits_65_naming_file_and_line() {
    let mut middle = calls();
    middle.insert(2, r#"{"type":"call","name":}"#.to_owned());
    let lines = trace(middle, true);
    let output = summary("bad", &lines, &[]);
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("trace.jsonl:4: expected value at column 23"),
        "{err}"
    );
    assert!(err.contains("--skip-bad-lines"), "{err}");
    assert!(output.stdout.is_empty());

    let output = summary("skip", &lines, &["--skip-bad-lines", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("skipped ") && stderr(&output).contains("trace.jsonl:4: "),
        "{}",
        stderr(&output)
    );
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["trace"]["skipped_lines"], 1);
    assert_eq!(json["calls"], 4);
}

#[test]
fn a_trace_without_footer_is_summarised_with_a_warning() {
    let mut middle = calls();
    // Cut in the middle of the last line, as a killed tracer leaves it (no newline).
    let last = middle.pop().unwrap();
    let lines = trace(middle, false);
    let path = scratch("summary-cut").join("trace.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n" + &last[..20]).unwrap();
    for extra in [&[][..], &["--skip-bad-lines"]] {
        let output = Command::new(CUDATRACE)
            .args(["summary", "--json"])
            .args(extra)
            .arg(&path)
            .output()
            .unwrap();
        // The cut is where the trace ends, not a malformed line: the same either way.
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(
            stderr(&output),
            format!(
                "cudatrace: warning: {0} has no footer (the trace was cut short); summarising \
                 the 4 lines it has\ncudatrace: warning: {0}:5: the trace was cut in this line \
                 (its tracer was killed?): read up to the line before\n",
                path.display()
            )
        );
        let json: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(json["trace"]["complete"], false);
        assert_eq!(json["trace"]["cut_line"], 5);
        assert_eq!(json["trace"]["skipped_lines"], 0);
        assert_eq!(json["calls"], 3);
    }
    // A trace cut while its header was written, and an empty one: nothing, said.
    for (name, text) in [("header", &HEADER[..30]), ("empty", "")] {
        let path = scratch(&format!("summary-nothing-{name}")).join("trace.jsonl");
        std::fs::write(&path, text).unwrap();
        let output = Command::new(CUDATRACE)
            .args(["summary", "--json"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let json: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(
            (&json["trace"]["lines"], &json["calls"]),
            (&0.into(), &0.into())
        );
        assert!(
            stderr(&output).contains(
                "trace.jsonl is empty (its tracer wrote nothing, or was killed before its \
                 header was whole)"
            ),
            "{}",
            stderr(&output)
        );
    }
}

/// `cudatrace ARGS` with a deadline: a reader that hangs fails the test instead.
fn within_10_s(args: &[&str], stdin: Stdio) -> Output {
    Command::new("timeout")
        .arg("10")
        .arg(CUDATRACE)
        .args(args)
        .stdin(stdin)
        .output()
        .unwrap()
}

#[test]
fn devices_fifos_and_endless_input_are_refused_at_once() {
    let dir = scratch("summary-endless");
    let job = dir.join("job");
    std::fs::create_dir(&job).unwrap();
    std::fs::write(job.join("r0.jsonl"), trace(calls(), true).join("\n") + "\n").unwrap();
    let link = job.join("zz.jsonl");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let job = job.to_str().unwrap();
    let devices = format!(
        "{} is a character device, not a trace: a trace is a regular file, or a pipe named \
         on the command line",
        link.display()
    );
    for args in [
        &["summary", "--job", job][..],
        &["merge", "--job", job, "-o", "/dev/null"],
        &["summary", link.to_str().unwrap()],
        &["export", link.to_str().unwrap(), "-o", "-"],
    ] {
        let output = within_10_s(args, Stdio::null());
        assert_eq!(
            output.status.code(),
            Some(74),
            "{args:?}: {}",
            stderr(&output)
        );
        assert_eq!(stderr(&output), format!("cudatrace: error: {devices}\n"));
    }
    std::fs::remove_file(&link).unwrap();
    // A FIFO in a job's folder would wait for a writer.
    let fifo = Path::new(job).join("ff.jsonl");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    for args in [
        &["summary", "--job", job][..],
        &["merge", "--job", job, "-o", "/dev/null"],
    ] {
        let output = within_10_s(args, Stdio::null());
        assert_eq!(
            output.status.code(),
            Some(74),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(&format!("{} is a FIFO, not a trace", fifo.display())),
            "{}",
            stderr(&output)
        );
    }
    // A pipe named on the command line is read, but an endless one that is no trace is
    // refused by its first byte, not copied whole.
    let mut zeros = Command::new("head")
        .args(["-c", "2000000000", "/dev/zero"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pipe = zeros.stdout.take().unwrap();
    let output = within_10_s(&["summary", "/dev/stdin"], pipe.into());
    // Its pipe closed: it ends (SIGPIPE).
    zeros.wait().unwrap();
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        "cudatrace: error: /dev/stdin:1: not a trace this cudatrace reads: its first line is \
         not a cudatrace header (it does not start with `{`)\n"
    );
}

#[test]
fn every_reader_refuses_a_version_it_does_not_read_naming_it() {
    let dir = scratch("summary-versions");
    for (version, found, why) in [
        ("5", "5", "(a newer cudatrace wrote it?)"),
        ("-1", "-1", "(that is no version number)"),
        ("\"5\"", "\"5\"", "(that is no version number)"),
        ("1e20", "1e+20", "(that is no version number)"),
        ("0", "0", "(that is no version number)"),
    ] {
        let path = dir.join("trace.jsonl");
        let header = HEADER.replace("\"version\":1", &format!("\"version\":{version}"));
        let mut lines = trace(calls(), true);
        lines[0] = header;
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let trace = path.to_str().unwrap();
        let out = dir.join("out");
        let out = out.to_str().unwrap();
        for args in [
            &["summary", trace][..],
            &["summary", "--skip-bad-lines", trace],
            &["export", trace, "-o", out],
            &["export", "--format", "parquet", trace, "-o", out],
            &["flame", trace, "-o", out],
            &["plot", trace, "-o", out],
        ] {
            let output = within_10_s(args, Stdio::null());
            assert_eq!(
                output.status.code(),
                Some(65),
                "{args:?}: {}",
                stderr(&output)
            );
            assert_eq!(
                stderr(&output),
                format!(
                    "cudatrace: error: {trace}:1: not a trace this cudatrace reads: trace format \
                     version {found}: this cudatrace reads versions 1 to 4 {why}\n"
                ),
                "{args:?}"
            );
        }
    }
}

#[test]
fn an_unreadable_trace_exits_74() {
    let folder = scratch("summary-unreadable");
    for (trace, why) in [
        (
            "/nonexistent/trace.jsonl",
            "No such file or directory (os error 2)",
        ),
        (folder.to_str().unwrap(), "folder"),
    ] {
        let output = Command::new(CUDATRACE)
            .args(["summary", trace])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
        assert_eq!(
            stderr(&output),
            if why == "folder" {
                common::folder_refused(trace)
            } else {
                format!("cudatrace: error: cannot open the trace {trace}: {why}\n")
            }
        );
        assert!(output.stdout.is_empty());
    }
}
