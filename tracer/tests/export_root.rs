//! Root test: the stand-in demo traced for real (`run --export chrome`), then exported and
//! plotted. The export has one slice per call line, one counter value per memory change,
//! and an arrow from each of the 80 launches to the cuStreamSynchronize of its batch.

mod common;

use std::process::Command;

use common::{CUDATRACE, calls, read_trace, root, scratch, standin, stderr};
use serde_json::Value;

#[test]
fn the_demo_exports_and_plots() {
    let Some(_guard) = root() else { return };
    let dir = scratch("export-root");
    let trace = dir.join("demo.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .args(["--export", "chrome"])
        .arg("--")
        .arg(&standin().demo)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let lines = read_trace(&trace);
    let call_lines = calls(&lines);
    let memory_changes = call_lines
        .iter()
        .filter(|c| c.get("live_bytes").is_some())
        .count();

    // `run --export chrome` wrote demo.json beside the trace, as `export` does.
    let json = dir.join("demo.json");
    let again = dir.join("again.json");
    let output = Command::new(CUDATRACE)
        .arg("export")
        .arg(&trace)
        .arg("-o")
        .arg(&again)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        std::fs::read(&json).unwrap(),
        std::fs::read(&again).unwrap()
    );
    let exported: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let events = exported["traceEvents"].as_array().unwrap();
    let phase = |ph: &str| events.iter().filter(|e| e["ph"] == ph).collect::<Vec<_>>();
    assert_eq!(phase("X").len(), call_lines.len());
    assert_eq!(phase("C").len(), memory_changes);
    assert_eq!(phase("s").len(), 80);
    // Every batch's four launches arrive at its synchronisation.
    let syncs: Vec<&Value> = phase("X")
        .into_iter()
        .filter(|e| e["name"] == "cuStreamSynchronize")
        .collect();
    let arrivals: Vec<usize> = syncs
        .iter()
        .map(|sync| {
            let (start, dur) = (sync["ts"].as_f64().unwrap(), sync["dur"].as_f64().unwrap());
            phase("f")
                .iter()
                .filter(|f| {
                    let ts = f["ts"].as_f64().unwrap();
                    start <= ts && ts <= start + dur
                })
                .count()
        })
        .collect();
    assert_eq!(
        arrivals.iter().filter(|n| **n == 4).count(),
        20,
        "{arrivals:?}"
    );
    assert_eq!(arrivals.iter().sum::<usize>(), 80);
    let kernels: Vec<&str> = phase("X")
        .iter()
        .filter(|e| e["cat"] == "launch")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(kernels.len(), 80);
    assert!(
        kernels.iter().all(|k| !k.starts_with("unknown@")),
        "{kernels:?}"
    );

    let svg = dir.join("demo.svg");
    let output = Command::new(CUDATRACE)
        .arg("plot")
        .arg(&trace)
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let summary = Command::new(CUDATRACE)
        .arg("summary")
        .arg(&trace)
        .output()
        .unwrap();
    let summary = String::from_utf8(summary.stdout).unwrap();
    let peak = summary
        .lines()
        .find(|l| l.contains(": peak "))
        .unwrap()
        .trim()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.contains(&format!(">{peak}</text>")), "{peak}");
    assert!(picture.contains(">Top kernels: 80 launches of 3 kernels</text>"));
}
