//! Root: `cudatrace run --launch-entry-only` on a loop of launches, and what the readers
//! make of its trace: every launch once, decoded, without `ret` and `dur_ns`; the summary
//! counts them and has no durations for them; the export draws each as a zero-length slice.

mod common;

use std::process::Command;

use common::*;
use serde_json::{Value, json};

/// Launches the loop times (after its 1000 warm-up ones: `WARMUP` in standin/bench_loop.c).
const TIMED: u64 = 5000;
const LAUNCHES: u64 = TIMED + 1000;

#[test]
fn every_launch_of_a_loop_is_there_once_and_the_readers_count_them() {
    let Some(_guard) = root() else { return };
    let dir = scratch("entry-only-loop");
    let trace_path = dir.join("trace.jsonl");
    let standin = standin();
    let output = assert_no_probe_outlives(|| {
        Command::new(CUDATRACE)
            .args(["run", "-q", "--launch-entry-only", "--libcuda"])
            .arg(&standin.lib)
            .arg("-o")
            .arg(&trace_path)
            .arg("--")
            .arg(&standin.bench_loop)
            .args([&TIMED.to_string(), "0", "1", "cuLaunchKernel"])
            .output()
            .expect("running cudatrace")
    });
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let calls = calls(&trace);
    assert_eq!(calls.len() as u64, LAUNCHES);
    let pid = &trace[0]["pids"][0];
    for call in &calls {
        // Everything but the call's result and duration (bench_loop.c's one launch).
        let mut fields = call.as_object().unwrap().clone();
        assert!(fields.remove("ts_ns").unwrap().is_u64());
        assert_eq!(fields.remove("tid").as_ref(), Some(pid));
        assert_eq!(
            Value::Object(fields),
            json!({"type": "call", "name": "cuLaunchKernel", "pid": pid, "lib": 0,
                   "grid": [64, 1, 1], "block": [128, 1, 1], "shared_mem": 0,
                   "stream": "0x0", "function": "0x1000", "kernel": "unknown@0x1000"}),
        );
    }
    let footer = trace.last().unwrap();
    assert_eq!(footer["calls_by_name"]["cuLaunchKernel"], LAUNCHES);
    assert_eq!(footer["entries_seen"], LAUNCHES);
    assert_eq!(footer["lost"]["total"], 0);

    // The summary counts every launch, as a success, and gives no duration for them.
    let summary = Command::new(CUDATRACE)
        .args(["summary", "--json"])
        .arg(&trace_path)
        .output()
        .unwrap();
    assert_eq!(summary.status.code(), Some(0), "{}", stderr(&summary));
    let summary: Value = serde_json::from_slice(&summary.stdout).unwrap();
    let functions = summary["functions"].as_array().unwrap();
    assert_eq!(
        functions,
        &[
            json!({"name": "cuLaunchKernel", "count": LAUNCHES, "untimed": LAUNCHES,
                 "errors": 0, "total_ns": 0})
        ]
    );
    assert_eq!(
        (
            &summary["calls"],
            &summary["errors"],
            &summary["kernel_launches"]
        ),
        (&json!(LAUNCHES), &json!(0), &json!(LAUNCHES))
    );
    let text = Command::new(CUDATRACE)
        .arg("summary")
        .arg(&trace_path)
        .output()
        .unwrap();
    assert_eq!(text.status.code(), Some(0), "{}", stderr(&text));
    let text = String::from_utf8(text.stdout).unwrap();
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("cuLaunchKernel "))
        .unwrap_or_else(|| panic!("no cuLaunchKernel row in\n{text}"));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        [
            "cuLaunchKernel",
            "6000",
            "n/a",
            "n/a",
            "n/a",
            "n/a",
            "n/a",
            "n/a"
        ],
        "{text}"
    );
    assert!(
        text.contains("n/a: probed at entry only (--launch-entry-only)"),
        "{text}"
    );

    // The export: one zero-length slice per launch.
    let exported = dir.join("trace.json");
    let export = Command::new(CUDATRACE)
        .arg("export")
        .arg(&trace_path)
        .arg("-o")
        .arg(&exported)
        .output()
        .unwrap();
    assert!(export.status.success(), "{}", stderr(&export));
    let export: Value = serde_json::from_slice(&std::fs::read(&exported).unwrap()).unwrap();
    let slices: Vec<&Value> = export["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "launch")
        .collect();
    assert_eq!(slices.len() as u64, LAUNCHES);
    assert!(
        slices.iter().all(|s| s["dur"].as_f64() == Some(0.0)),
        "{:?}",
        slices[0]
    );
}
