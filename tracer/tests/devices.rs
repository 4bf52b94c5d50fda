//! Root test of device attribution: the stand-in libcuda (two devices) driven by
//! `cudatrace-driver devices`, which makes each device's context current through
//! `cuCtxSetCurrent`, `cuCtxPushCurrent_v2`/`cuCtxPopCurrent_v2` and `cuCtxCreate_v2`
//! and launches, copies, sets and allocates on each. Every line's `device`, the summary's
//! per-device figures and the export's arguments, exactly.

mod common;

use std::process::Command;

use common::*;
use serde_json::{Value, json};

#[test]
fn each_launch_copy_memset_and_allocation_says_its_device() {
    let Some(_guard) = root() else { return };
    let dir = scratch("devices");
    let trace = dir.join("t.jsonl");
    let output = trace_driver(&trace, &[], &["devices"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let lines = read_trace(&trace);
    assert_complete(&lines);

    let got: Vec<(String, Value)> = calls(&lines)
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_owned(), c["device"].clone()))
        .collect();
    let none = Value::Null;
    let expected: Vec<(&str, Value)> = vec![
        ("cuInit", none.clone()),
        ("cuDevicePrimaryCtxRetain", json!(0)),
        ("cuDevicePrimaryCtxRetain", json!(1)),
        // No context is current yet.
        ("cuMemAlloc_v2", none.clone()),
        ("cuCtxSetCurrent", none.clone()),
        ("cuMemAlloc_v2", json!(0)),
        ("cuMemcpyHtoD_v2", json!(0)),
        ("cuModuleLoadData", none.clone()),
        ("cuModuleGetFunction", none.clone()),
        ("cuLaunchKernel", json!(0)),
        ("cuCtxPushCurrent_v2", none.clone()),
        ("cuMemAlloc_v2", json!(1)),
        ("cuMemsetD8_v2", json!(1)),
        ("cuLaunchKernel", json!(1)),
        ("cuLaunchKernel", json!(1)),
        ("cuMemcpyDtoD_v2", json!(1)),
        ("cuCtxPopCurrent_v2", none.clone()),
        ("cuLaunchKernel", json!(0)),
        ("cuMemFree_v2", json!(0)),
        // The created context is current until destroyed.
        ("cuCtxCreate_v2", json!(1)),
        ("cuMemAlloc_v2", json!(1)),
        ("cuCtxDestroy_v2", none.clone()),
        ("cuMemAlloc_v2", json!(0)),
    ];
    let expected: Vec<(String, Value)> = expected
        .into_iter()
        .map(|(name, device)| (name.to_owned(), device))
        .collect();
    assert_eq!(got, expected);
    // The contexts the calls name: c0 and c1 retained, c1 pushed and popped.
    let context = |index: usize| calls(&lines)[index]["context"].clone();
    assert_eq!(context(10), context(2), "the push names device 1's context");
    assert_eq!(context(16), context(2), "the pop returns it");
    assert_eq!(context(4), context(1));

    let output = Command::new(CUDATRACE)
        .args(["summary", "--json"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        summary["devices"],
        json!({
            "rows": [
                {"device": 0, "launches": 2, "copies": 1, "copy_bytes": 4096, "memsets": 0,
                 "memset_bytes": 0, "allocations": 2, "allocated_bytes": 4296, "frees": 1,
                 "peak_live_bytes": 4096, "live_bytes": 200},
                {"device": 1, "launches": 2, "copies": 1, "copy_bytes": 1024, "memsets": 1,
                 "memset_bytes": 8192, "allocations": 2, "allocated_bytes": 8292, "frees": 0,
                 "peak_live_bytes": 8292, "live_bytes": 8292},
            ],
            "unattributed": 1,
        })
    );
    let text = Command::new(CUDATRACE)
        .arg("summary")
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let section: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("By device"))
        .take(5)
        .map(str::trim)
        .collect();
    assert_eq!(
        section[0], "By device (the thread's current context)",
        "{text}"
    );
    let words = |line: &str| line.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(
        words(section[2]),
        "0 2 1 4.00 KiB 0 0 B 2 4.20 KiB 4.00 KiB 200 B"
    );
    assert_eq!(
        words(section[3]),
        "1 2 1 1.00 KiB 1 8.00 KiB 2 8.10 KiB 8.10 KiB 8.10 KiB"
    );
    assert_eq!(
        section[4],
        "1 call (launches, copies, memsets, allocations) on no known device"
    );

    // The export carries each call's device as an argument.
    let json_out = dir.join("t.json");
    let output = Command::new(CUDATRACE)
        .arg("export")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let export: Value = serde_json::from_slice(&std::fs::read(json_out).unwrap()).unwrap();
    let mut by_device = [0u64; 2];
    for event in export["traceEvents"].as_array().unwrap() {
        if event["ph"] == "X"
            && let Some(device) = event["args"]["device"].as_u64()
        {
            by_device[device as usize] += 1;
        }
    }
    // Device 0: the retain and 6 calls; device 1: the retain, the create and 6 calls.
    assert_eq!(by_device, [7, 8]);
}
