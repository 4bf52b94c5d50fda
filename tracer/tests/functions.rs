//! Root tests of `--functions`: every exported function or the ones a pattern names,
//! those outside the catalog recorded generically; and why uprobe_multi was not used
//! when its attach fails.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

fn trace_queries(functions: &str) -> (Vec<Value>, String) {
    let trace_path = scratch("functions").join("trace.jsonl");
    let output = trace_driver(
        &trace_path,
        &["--missing-probes", "ignore", "--functions", functions],
        &["queries"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    (trace, stderr(&output))
}

#[test]
fn all_records_every_call_the_catalog_ones_decoded_the_others_raw() {
    let Some(_guard) = root() else { return };
    let (trace, _) = trace_queries("all");
    let header = &trace[0];
    assert_eq!(header["functions"], "all");
    let probes = header["probes"].as_array().unwrap();
    let generic: Vec<&str> = probes
        .iter()
        .filter(|p| p["family"] == "other")
        .map(|p| p["symbol"].as_str().unwrap())
        .collect();
    // The stand-in's exports outside the catalog; not its cudatrace_* hook.
    assert_eq!(generic, ["cuDeviceGetCount", "cuGetProcAddress_v2"]);
    for probe in probes.iter().filter(|p| p["family"] == "other") {
        assert_eq!(probe["function"], probe["symbol"]);
    }
    let calls = calls(&trace);
    assert_eq!(
        names(&calls),
        [
            "cuInit",
            "cuDeviceGetCount",
            "cuDeviceGetCount",
            "cuDeviceGetCount",
            "cuGetProcAddress_v2",
            "cuDriverGetVersion",
            "cuDeviceGetCount"
        ]
    );
    assert_eq!(calls[0]["flags"], 0, "decoded by the catalog");
    assert!(calls[0].get("args").is_none());
    assert_eq!(calls[5]["version"], 13000);
    // cuGetProcAddress_v2("cuMemAlloc", &pfn, 12080, 2, &status): the registers as they
    // were, the upper half of the int included.
    let args = calls[4]["args"].as_array().unwrap();
    assert_eq!(args.len(), 6);
    assert_eq!(
        u64::from_str_radix(args[2].as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
            & 0xffff_ffff,
        12080
    );
    assert_eq!(args[3], "0x2");
    for call in &calls[1..5] {
        assert_eq!(call["ret"], 0);
        assert!(call.get("args").is_some(), "{call}");
    }
    let footer = trace.last().unwrap();
    assert_eq!(footer["calls_by_name"]["cuDeviceGetCount"], 4);
    assert_eq!(footer["calls_by_name"]["cuGetProcAddress_v2"], 1);
    assert_eq!(footer["entries_seen"], 7);
}

#[test]
fn patterns_probe_only_what_they_name_and_say_when_they_name_nothing() {
    let Some(_guard) = root() else { return };
    let (trace, _) = trace_queries("cuDevice*,cuDriver?etVersion");
    let calls = calls(&trace);
    assert_eq!(
        names(&calls),
        [
            "cuDeviceGetCount",
            "cuDeviceGetCount",
            "cuDeviceGetCount",
            "cuDriverGetVersion",
            "cuDeviceGetCount"
        ]
    );
    assert_eq!(calls[3]["version"], 13000, "still decoded");
    assert!(trace[0]["missing_functions"].as_array().unwrap().is_empty());
    let symbols: Vec<&str> = trace[0]["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["symbol"].as_str().unwrap())
        .collect();
    assert!(
        symbols
            .iter()
            .all(|s| s.starts_with("cuDevice") || *s == "cuDriverGetVersion")
    );

    let trace_path = scratch("functions-none").join("trace.jsonl");
    let output = trace_driver(
        &trace_path,
        &["--functions", "catalog,cuNoSuch*"],
        &["exit", "0"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output)
            .contains("cudatrace: 1 patterns of --functions match no libcuda export: cuNoSuch*"),
        "{}",
        stderr(&output)
    );
    let output = trace_driver(
        &trace_path,
        &["--functions", "cuNoSuch*", "--missing-probes", "error"],
        &["exit", "0"],
    );
    assert_eq!(output.status.code(), Some(78), "{}", stderr(&output));
    let output = Command::new(CUDATRACE)
        .args(["run", "--functions", "cuA,,cuB", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("an empty item"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_failed_uprobe_multi_attach_says_why_and_falls_back() {
    let Some(_guard) = root() else { return };
    let dir = scratch("unprobeable");
    let lib = dir.join("libcuda.so.1");
    gcc(&[
        "-shared",
        "-fPIC",
        "-O2",
        "-o",
        lib.to_str().unwrap(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/unprobeable.c"),
    ]);
    // No process maps the library (`true` never loads it): cudatrace maps it itself to
    // find the functions the kernel refuses, which it would otherwise only refuse in a
    // process mapping the file when its link is made.
    let trace_path = dir.join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args([
            "run",
            "-q",
            "--missing-probes",
            "ignore",
            "--functions",
            "all",
        ])
        .arg("--libcuda")
        .arg(&lib)
        .arg("-o")
        .arg(&trace_path)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let header = &read_trace(&trace_path)[0];
    assert_eq!(
        header["attach_failures"][0]["symbol"], "cuLocked",
        "{header}"
    );
    let probes: Vec<&Value> = header["probes"].as_array().unwrap().iter().collect();
    assert_eq!(probes.len(), 1);
    assert_eq!(probes[0]["symbol"], "cuInit");
    let doctor = Command::new(CUDATRACE)
        .args(["doctor", "--json", "--libcuda"])
        .arg(&lib)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let multi = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "uprobe_multi")
        .unwrap();
    if multi["ok"] != true {
        // Linux before 6.6: per-symbol links from the start, nothing fell back.
        assert_eq!(header["attach"]["mechanism"], "perf_event");
        assert!(header["attach"].get("refused").is_none(), "{header}");
        return;
    }
    // Split around the refused function: cuInit keeps a uprobe_multi link of its own.
    let real = lib.canonicalize().unwrap();
    assert_eq!(header["attach"]["mechanism"], "uprobe_multi");
    let why = header["attach"]["refused"].as_str().unwrap();
    assert!(
        why.starts_with(&format!(
            "creating a uprobe_multi link for call_return on 2 offsets of {} (mapped by \
             cudatrace itself): ",
            real.display()
        )),
        "{why}"
    );
    assert!(why.contains("os error 524"), "ENOTSUPP: {why}");
    let err = stderr(&output);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("uprobe_multi attach failed"))
        .collect();
    assert_eq!(
        lines,
        [format!(
            "cudatrace: uprobe_multi attach failed (attached the other functions with \
             smaller uprobe_multi links): {why}"
        )]
    );
    assert_eq!(
        header["attach_failures"][0]["error"],
        format!(
            "creating a uprobe_multi link for call_return on 1 offsets of {} (mapped by \
             cudatrace itself): Unknown error 524 (os error 524)",
            real.display()
        )
    );
}
