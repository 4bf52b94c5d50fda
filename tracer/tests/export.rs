//! `cudatrace export` on hand-written traces (no root needed): exact counts of slices,
//! counters and flows read back with serde_json (chrome) and with the writer's own prost
//! messages (perfetto), filters, and exit codes.

mod common;
mod traces;

#[allow(
    dead_code,
    reason = "the tests decode; only the writer uses every item"
)]
#[path = "../src/export/proto.rs"]
mod proto;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use common::{CUDATRACE, scratch, stderr};
use prost::Message;
use serde_json::Value;
use traces::{KNOWN_BASE_NS, KNOWN_CALLS, KNOWN_COUNTERS, KNOWN_DRIVER, KNOWN_FLOWS};

fn write(name: &str, text: &str) -> PathBuf {
    let path = scratch(&format!("export-{name}")).join("trace.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

fn export(trace: &Path, args: &[&str]) -> Output {
    Command::new(CUDATRACE)
        .arg("export")
        .arg(trace)
        .args(args)
        .output()
        .expect("running cudatrace export")
}

fn events(path: &Path) -> Vec<Value> {
    let json: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).expect("valid JSON");
    json["traceEvents"].as_array().unwrap().clone()
}

fn count(events: &[Value], phase: &str) -> u64 {
    events.iter().filter(|e| e["ph"] == phase).count() as u64
}

#[test]
fn chrome_export_has_exact_slices_counters_and_flows() {
    let trace = write("chrome", &traces::known());
    let output = export(&trace, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json = trace.with_extension("json");
    assert_eq!(
        stderr(&output)
            .lines()
            .last()
            .unwrap()
            .split(" in ")
            .next()
            .unwrap(),
        format!(
            "cudatrace: wrote {} (Trace Event JSON): 15 slices, 2 counter values, 5 flows, 2 markers",
            json.display()
        )
    );
    let events = events(&json);
    assert_eq!(count(&events, "X"), KNOWN_CALLS + KNOWN_DRIVER);
    assert_eq!(count(&events, "C"), KNOWN_COUNTERS);
    assert_eq!(count(&events, "s"), KNOWN_FLOWS);
    assert_eq!(count(&events, "f"), KNOWN_FLOWS);
    assert_eq!(count(&events, "i"), 2);

    // Timestamps: µs since the header's start_monotonic_ns, nanoseconds exact.
    let launches: Vec<&Value> = events.iter().filter(|e| e["cat"] == "launch").collect();
    let first = launches[0];
    assert_eq!(first["ts"].as_f64(), Some(10.0));
    assert_eq!(first["dur"].as_f64(), Some(1.0));
    assert_eq!(first["args"]["ts_ns"], KNOWN_BASE_NS + 10_000);
    assert_eq!(
        first["name"],
        "vector_add(float const*, float const*, float*, int)"
    );
    let flow_start = events.iter().find(|e| e["ph"] == "s").unwrap();
    assert_eq!(flow_start["ts"].as_f64(), Some(10.5));
    let flow_end = events
        .iter()
        .find(|e| e["ph"] == "f" && e["id"] == flow_start["id"])
        .unwrap();
    assert_eq!(
        flow_end["ts"].as_f64(),
        Some(19.5),
        "the stream sync's middle"
    );
}

#[test]
fn perfetto_export_decodes_to_the_same_counts() {
    let trace = write("perfetto", &traces::known());
    let out = trace.with_extension("pftrace");
    let output = export(&trace, &["--format", "perfetto"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let mut decoded = proto::Trace::decode(std::fs::read(&out).unwrap().as_slice()).unwrap();
    proto::resolve_interned(&mut decoded);
    let events: Vec<(u64, &proto::TrackEvent)> = decoded
        .packet
        .iter()
        .filter_map(|p| Some((p.timestamp?, p.track_event.as_ref()?)))
        .collect();
    let of_type = |kind: i32| {
        events
            .iter()
            .filter(|(_, e)| e.r#type == Some(kind))
            .count()
    };
    assert_eq!(
        of_type(proto::event_type::SLICE_BEGIN) as u64,
        KNOWN_CALLS + KNOWN_DRIVER
    );
    assert_eq!(
        of_type(proto::event_type::SLICE_END) as u64,
        KNOWN_CALLS + KNOWN_DRIVER
    );
    assert_eq!(of_type(proto::event_type::COUNTER) as u64, KNOWN_COUNTERS);
    let terminating: usize = events
        .iter()
        .map(|(_, e)| e.terminating_flow_ids.len())
        .sum();
    assert_eq!(terminating as u64, KNOWN_FLOWS);
    let (ts, _) = events
        .iter()
        .find(|(_, e)| e.name.as_deref() == Some("cuInit"))
        .unwrap();
    assert_eq!(*ts, 1_000, "ns since the header's start");
    let descriptors = decoded
        .packet
        .iter()
        .filter(|p| p.track_descriptor.is_some())
        .count();
    // Processes 100 and 200, threads 100, 101 and 200, the driver track, device memory,
    // the global track of the lost marker.
    assert_eq!(descriptors, 8);
}

#[test]
fn filters_select_pids_names_and_a_window() {
    let trace = write("filters", &traces::known());
    let out = trace.with_extension("json");
    let run = |args: &[&str]| {
        let output = export(&trace, args);
        assert!(output.status.success(), "{}", stderr(&output));
        events(&out)
    };
    let events = run(&["--pid", "200"]);
    assert_eq!((count(&events, "X"), count(&events, "C")), (1, 0));

    let events = run(&["--name", "Synchronize", "--name", "vector_add"]);
    assert_eq!(count(&events, "X"), 8);
    assert_eq!(count(&events, "s"), KNOWN_FLOWS);

    let events = run(&["--start-ms", "0.0125", "--end-ms", "0.021"]);
    assert_eq!(count(&events, "X"), 4);
    assert_eq!(count(&events, "s"), 2);
    let counter = events.iter().find(|e| e["ph"] == "C").unwrap();
    assert_eq!(
        counter["ts"].as_f64(),
        Some(12.5),
        "the bytes held at the window's start"
    );
}

#[test]
fn output_goes_to_stdout_with_a_dash() {
    let trace = write("stdout", &traces::known());
    let output = export(&trace, &["-o", "-"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(count(json["traceEvents"].as_array().unwrap(), "X"), 15);
    assert!(stderr(&output).contains("cudatrace: wrote stdout"));
}

#[test]
fn errors_have_their_exit_codes() {
    let dir = scratch("export-errors");
    let missing = dir.join("none.jsonl");
    let output = export(&missing, &[]);
    assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        format!(
            "cudatrace: error: cannot open the trace {}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );
    // A folder opens, but cannot be read.
    let folder = dir.join("folder.jsonl");
    std::fs::create_dir(&folder).unwrap();
    let output = export(&folder, &["-o", "-"]);
    assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
    assert_eq!(stderr(&output), common::folder_refused(folder.display()));

    let bad = write("bad", &format!("{}{{\"type\":\n", traces::known()));
    let output = export(&bad, &[]);
    assert_eq!(output.status.code(), Some(65));
    assert!(
        stderr(&output).contains("trace.jsonl:21: EOF while parsing"),
        "{}",
        stderr(&output)
    );
    let output = export(&bad, &["--skip-bad-lines"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains("skipped 1 malformed lines"));

    let window = export(&bad, &["--start-ms", "5", "--end-ms", "1"]);
    assert_eq!(window.status.code(), Some(2));
    let same = export(&bad, &["-o", bad.to_str().unwrap()]);
    assert_eq!(same.status.code(), Some(2), "{}", stderr(&same));
    let unwritable = export(&bad, &["--skip-bad-lines", "-o", "/proc/none/x.json"]);
    assert_eq!(unwritable.status.code(), Some(73));
}

#[test]
fn a_large_trace_streams_in_both_formats() {
    let iterations = 20_000;
    let trace = write(
        "large",
        &traces::with_header(&traces::inference(iterations)),
    );
    let calls = traces::inference_calls(iterations);
    let output = export(&trace, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = std::fs::read_to_string(trace.with_extension("json")).unwrap();
    assert_eq!(text.matches(r#""ph":"X""#).count() as u64, calls);
    assert_eq!(text.matches(r#""ph":"s""#).count() as u64, 3 * iterations);
    assert_eq!(
        text.matches(r#""ph":"C""#).count(),
        8,
        "4 allocations, 4 frees"
    );

    let output = export(&trace, &["--format", "perfetto"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let bytes = std::fs::read(trace.with_extension("pftrace")).unwrap();
    let decoded = proto::Trace::decode(bytes.as_slice()).unwrap();
    let begins = decoded
        .packet
        .iter()
        .filter(|p| {
            p.track_event
                .as_ref()
                .is_some_and(|e| e.r#type == Some(proto::event_type::SLICE_BEGIN))
        })
        .count() as u64;
    assert_eq!(begins, calls);
    assert!(
        bytes.len() < text.len(),
        "protobuf {} B, JSON {} B",
        bytes.len(),
        text.len()
    );
}
