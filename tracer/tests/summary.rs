//! `cudatrace summary` on hand-written traces (no root needed): exit codes, malformed and
//! cut-short traces.

mod common;

use std::process::{Command, Output};

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
    // Cut in the middle of the last line, as a killed tracer leaves it.
    let last = middle.pop().unwrap();
    middle.push(last[..20].to_owned());
    let output = summary("cut", &trace(middle.clone(), false), &[]);
    assert_eq!(
        output.status.code(),
        Some(65),
        "a cut line is still malformed"
    );
    let output = summary(
        "cut-skip",
        &trace(middle, false),
        &["--skip-bad-lines", "--json"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("has no footer"),
        "{}",
        stderr(&output)
    );
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["trace"]["complete"], false);
    assert_eq!(json["calls"], 3);
}

#[test]
fn an_unreadable_trace_exits_74() {
    let folder = scratch("summary-unreadable");
    for (trace, why) in [
        (
            "/nonexistent/trace.jsonl",
            "No such file or directory (os error 2)",
        ),
        (folder.to_str().unwrap(), "Is a directory (os error 21)"),
    ] {
        let output = Command::new(CUDATRACE)
            .args(["summary", trace])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
        assert_eq!(
            stderr(&output),
            format!("cudatrace: error: cannot open the trace {trace}: {why}\n")
        );
        assert!(output.stdout.is_empty());
    }
}
