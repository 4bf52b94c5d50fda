//! `summary`, `export` and `plot` of a `--gpu` trace (no root needed): the hand-written
//! `traces::gpu()`, whose every figure is known (its doc has the table).

mod common;
mod traces;

use std::process::{Command, Output};

use common::{CUDATRACE, scratch, stderr};
use serde_json::{Value, json};
use traces::{GPU_BASE_NS, GPU_CALLS, GPU_LINKED, GPU_WORK};

fn write(name: &str) -> std::path::PathBuf {
    let path = scratch(&format!("gpu-readers-{name}")).join("trace.jsonl");
    std::fs::write(&path, traces::gpu()).unwrap();
    path
}

fn cudatrace(args: &[&str]) -> Output {
    Command::new(CUDATRACE)
        .args(args)
        .output()
        .expect("running cudatrace")
}

#[test]
fn the_summary_gives_gpu_time_busy_gaps_queueing_and_bandwidth_exactly() {
    let trace = write("summary-json");
    let output = cudatrace(&["summary", "--json", trace.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let gpu = &json["gpu"];
    assert_eq!(
        (
            &gpu["work"],
            &gpu["kernels"],
            &gpu["copies"],
            &gpu["memsets"]
        ),
        (&json!(GPU_WORK), &json!(4), &json!(2), &json!(1))
    );
    assert_eq!(
        (&gpu["linked"], &gpu["unlinked"]),
        (&json!(GPU_LINKED), &json!(1))
    );
    assert_eq!(json["calls"], GPU_CALLS);
    // The run: the first call (1,000) to the last end (71,000).
    assert_eq!(gpu["run_start_ns"], GPU_BASE_NS + 1_000);
    assert_eq!(
        (&gpu["run_ns"], &gpu["busy_ns"]),
        (&json!(70_000), &json!(11_900))
    );
    let device = &gpu["devices"][0];
    assert_eq!(device["device"], 0);
    assert_eq!(device["work"], GPU_WORK);
    assert_eq!(device["busy_ns"], 11_900);
    assert_eq!(device["share_of_run"], 0.17);
    assert_eq!(device["first_ns"], GPU_BASE_NS + 7_500);
    assert_eq!(device["last_end_ns"], GPU_BASE_NS + 64_500);
    let gaps: Vec<(u64, u64)> = device["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["start_ns"].as_u64().unwrap() - GPU_BASE_NS,
                g["duration_ns"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        gaps,
        [
            (19_500, 42_500),
            (10_000, 1_500),
            (63_000, 1_000),
            (9_500, 100)
        ]
    );
    // What the CPU did in the largest gap: the sync and the copy call, in inference.
    assert_eq!(
        device["gaps"][0]["cpu"],
        json!({
            "calls": 2,
            "in_calls_ns": 31_000,
            "functions": [
                {"name": "cuStreamSynchronize", "calls": 1, "in_gap_ns": 30_000},
                {"name": "cuMemcpyDtoHAsync_v2", "calls": 1, "in_gap_ns": 1_000},
            ],
            "stages": ["pid 300: inference"],
        })
    );
    // 10,000-11,500: the first launch's call (10,000-11,000).
    assert_eq!(device["gaps"][1]["cpu"]["in_calls_ns"], 1_000);
    assert_eq!(
        device["gaps"][1]["cpu"]["functions"][0],
        json!({"name": "cuLaunchKernel", "calls": 1, "in_gap_ns": 1_000})
    );

    let kernels = gpu["kernel_time"].as_array().unwrap();
    // Percentiles come from a histogram of 3 significant digits: 3,000 reads as 3,001.
    let mut vector_add = kernels[0].clone();
    let p50 = vector_add["p50_ns"].as_u64().unwrap();
    assert!((3_000..=3_003).contains(&p50), "p50 {p50}");
    vector_add["p50_ns"] = json!(3_000);
    assert_eq!(
        vector_add,
        json!({
            "kernel": "vector_add(float const*, float const*, float*, int)",
            "kernel_mangled": "_Z10vector_addPKfS0_Pfi",
            "count": 3, "total_ns": 8_500, "mean_ns": 2_833, "p50_ns": 3_000,
            "p99_ns": 5_000, "max_ns": 5_000, "share_of_busy": 8_500.0 / 11_900.0,
        })
    );
    assert_eq!(
        (
            &kernels[1]["kernel"],
            &kernels[1]["total_ns"],
            &kernels[1]["count"]
        ),
        (&json!("gemm()"), &json!(2_000), &json!(1))
    );
    assert_eq!(
        gpu["copy_time"],
        json!([
            {"kind": "DtoH", "count": 1, "bytes": 4096, "gpu_ns": 1_000, "bandwidth_gb_s": 4.096},
            {"kind": "HtoD", "count": 1, "bytes": 1_048_576, "gpu_ns": 2_000,
             "bandwidth_gb_s": 524.288},
        ])
    );
    assert_eq!(
        gpu["memset_time"],
        json!({"kind": "memset", "count": 1, "bytes": 4000, "gpu_ns": 400, "bandwidth_gb_s": 10.0})
    );
    assert_eq!(
        gpu["queued"],
        json!({"count": 6, "p50_ns": 500, "p99_ns": 3_500, "max_ns": 3_500,
               "started_before_return": 1})
    );
    assert_eq!(gpu["processes"][0]["cupti_version"], 130001);

    // GPU busy per stage: the union clipped to each stage of pid 300.
    let stages: Vec<(String, u64, u64)> = json["stages"][0]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["duration_ns"].as_u64().unwrap(),
                s["gpu_busy_ns"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected = [
        ("initialisation", 2_000, 0),
        ("weight loading", 1_000, 0),
        ("input preparation", 6_000, 2_400),
        ("inference", 40_000, 8_000),
        ("output retrieval", 11_000, 0),
        ("cleanup", 10_000, 1_500),
    ];
    let expected: Vec<(String, u64, u64)> = expected
        .iter()
        .map(|(name, duration, busy)| (name.to_string(), *duration, *busy))
        .collect();
    assert_eq!(stages, expected);
}

#[test]
fn the_text_summary_has_a_gpu_section() {
    let trace = write("summary-text");
    let output = cudatrace(&["summary", trace.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    for expected in [
        "GPU (--gpu): 4 kernels, 2 copies, 1 memset; 6 linked to their call, 1 not",
        "  pid 300: CUPTI 130001 (/x/libcupti.so.13), times monotonic",
        "  device 0: busy 11.9 µs of the run's 70.0 µs (17.0%), 7 pieces of work from +6.5 µs to +63.5 µs",
        "       42.5 µs at    +18.5 µs: 31.0 µs in driver calls (72.9%): cuStreamSynchronize 30.0 µs ×1, cuMemcpyDtoHAsync_v2 1.0 µs ×1; pid 300: inference",
        "  launch to GPU start: p50 500 ns, p99 3.5 µs, max 3.5 µs (1 started before their call returned)",
        "         3     8.5 µs     2.8 µs     3.0 µs     5.0 µs     5.0 µs   71.4%  vector_add(float const*, float const*, float*, int)",
        "  HtoD            1    1.00 MiB in     2.0 µs  524.29 GB/s",
        "  inference              +9.0 µs     40.0 µs       4        3         0 B         0 B       20.0%",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
}

#[test]
fn the_export_draws_gpu_tracks_and_call_to_gpu_arrows() {
    let trace = write("export");
    let out = trace.with_extension("json");
    let output = cudatrace(&[
        "export",
        trace.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let export: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let events = export["traceEvents"].as_array().unwrap();
    let gpu_pid = 1u64 << 30;
    let names: Vec<(String, u64, String)> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["pid"] == gpu_pid)
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("process_name".into(), 0, "GPU 0".into()),
            (
                "thread_name".into(),
                1,
                "stream 13, pid 300 (python3 train.py)".into()
            ),
            (
                "thread_name".into(),
                2,
                "stream 14, pid 300 (python3 train.py)".into()
            ),
        ]
    );
    // (name, tid, ts µs, dur µs) of the GPU slices, in file order.
    let slices: Vec<(String, u64, f64, f64)> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "gpu")
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["tid"].as_u64().unwrap(),
                e["ts"].as_f64().unwrap(),
                e["dur"].as_f64().unwrap(),
            )
        })
        .collect();
    let vector_add = "vector_add(float const*, float const*, float*, int)".to_owned();
    assert_eq!(
        slices,
        [
            ("HtoD 1.00 MiB".into(), 1, 7.5, 2.0),
            ("memset 3.91 KiB".into(), 1, 9.6, 0.4),
            (vector_add.clone(), 1, 11.5, 5.0),
            ("gemm()".into(), 2, 15.5, 2.0),
            (vector_add.clone(), 1, 16.5, 3.0),
            ("DtoH 4.00 KiB".into(), 1, 62.0, 1.0),
            (vector_add, 1, 64.0, 0.5),
        ]
    );
    // One arrow per linked piece of work, from the middle of its call to its slice.
    let arrows: Vec<(u64, f64, u64, f64)> = events
        .iter()
        .filter(|e| e["name"] == "call → GPU" && e["ph"] == "s")
        .map(|start| {
            let end = events
                .iter()
                .find(|e| e["name"] == "call → GPU" && e["ph"] == "f" && e["id"] == start["id"])
                .unwrap();
            (
                start["tid"].as_u64().unwrap(),
                start["ts"].as_f64().unwrap(),
                end["tid"].as_u64().unwrap(),
                end["ts"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        arrows,
        [
            (300, 6.5, 1, 8.5),
            (300, 9.25, 1, 9.8),
            (300, 10.5, 1, 14.0),
            (301, 14.5, 2, 16.5),
            (300, 12.5, 1, 18.0),
            (300, 60.5, 1, 62.5),
        ]
    );
    assert_eq!(GPU_LINKED, arrows.len() as u64);
}

#[test]
fn the_plot_has_a_gpu_lane_with_its_busy_share() {
    let trace = write("plot");
    let out = trace.with_extension("svg");
    let output = cudatrace(&["plot", trace.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let svg = std::fs::read_to_string(&out).unwrap();
    assert!(svg.contains(">GPU 0</text>"), "no GPU lane");
    assert!(svg.contains(">busy 17.0%</text>"), "no busy share");
    assert!(svg.contains("GPU busy 17.0% (4 kernels)"), "no GPU fact");
}
