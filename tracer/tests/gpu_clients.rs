//! Root: `cudatrace run --gpu` beside the program's own CUPTI client, with stream capture
//! and graph launches, and a reused function handle (issue 24), on the stand-in libcuda and
//! libcupti (standin/README.md has their rules; `cudatrace-driver profiler|graphs|stale`
//! their calls, in standin/cudatrace_driver_gpu.h). Every launch is accounted for, with
//! exact counts.

mod common;

use std::{
    path::Path,
    process::{Command, Output},
};

use common::{gpu::cupti_standin, *};
use serde_json::{Value, json};

/// `cudatrace run --gpu -q --cupti STANDIN -- cudatrace-driver MODE` with `envs`.
fn trace_mode(name: &str, mode: &str, envs: &[(&str, &str)]) -> (Output, Vec<Value>) {
    let trace = scratch(name).join("trace.jsonl");
    let mut run = Command::new(CUDATRACE);
    run.args([
        "run",
        "--gpu",
        "-q",
        "--missing-probes",
        "ignore",
        "--cupti",
    ])
    .arg(&cupti_standin().lib)
    .arg("--libcuda")
    .arg(&standin().lib)
    .arg("-o")
    .arg(&trace)
    .arg("--")
    .arg(&standin().driver)
    .arg(mode)
    .env_remove("CUDA_INJECTION64_PATH")
    .env_remove("CUPTI_STANDIN_MULTI")
    .env_remove("CUDA_STANDIN_REUSE_FUNCTIONS");
    for (key, value) in envs {
        run.env(key, value);
    }
    let output = assert_no_probe_outlives(|| run.output().expect("running cudatrace"));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace);
    assert_complete_with_losses(&trace);
    (output, trace)
}

fn of_type<'a>(trace: &'a [Value], kind: &str) -> Vec<&'a Value> {
    trace.iter().filter(|l| l["type"] == kind).collect()
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{value} is not a u64"))
}

/// The calls named `name`, in trace order.
fn named<'a>(trace: &'a [Value], name: &str) -> Vec<&'a Value> {
    calls(trace)
        .into_iter()
        .filter(|c| c["name"] == name)
        .collect()
}

/// The work lines linked to each call, by the call's `(tid, ts_ns)`.
fn work_of(trace: &[Value], call: &Value) -> usize {
    trace
        .iter()
        .filter(|l| {
            l["type"].as_str().is_some_and(|t| t.starts_with("gpu_"))
                && l["call_tid"] == call["tid"]
                && l["call_ts_ns"] == call["ts_ns"]
        })
        .count()
}

fn issuing(trace: &[Value]) -> &Value {
    &trace.last().unwrap()["gpu"]["issuing"]
}

#[test]
fn a_programs_own_profiler_takes_recording_and_gets_every_record_meanwhile() {
    let Some(_guard) = root() else { return };
    let (output, trace) = trace_mode("gpu-clients-single", "profiler", &[]);
    // The program's profiler saw exactly its 200 launches, as without cudatrace.
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "profiler: 200 kernels, 200 api records\n"
    );
    let launches = named(&trace, "cuLaunchKernel");
    assert_eq!(launches.len(), 600);
    let with_work: Vec<usize> = launches.iter().map(|l| work_of(&trace, l)).collect();
    assert_eq!(with_work[..100], [1; 100]);
    assert_eq!(with_work[100..300], [0; 200]);
    assert_eq!(with_work[300..], [1; 300]);
    // Each launch line has its result and duration from CUPTI's record, but those it
    // recorded none of.
    let with_result = launches.iter().filter(|l| l["ret"] == 0).count();
    assert_eq!(with_result, 400);
    assert!(
        launches[100..300]
            .iter()
            .all(|l| l["ret"].is_null() && l["dur_ns"].is_null())
    );

    let gaps = of_type(&trace, "gpu_gap");
    assert_eq!(gaps.len(), 1);
    let gap = gaps[0];
    let pid = &trace[0]["pids"][0];
    // From the profiler's cuptiActivityRegisterCallbacks (the second: the first is ours)
    // to cudatrace's library having CUPTI back, before the last 300 launches.
    let registrations = named(&trace, "cuptiActivityRegisterCallbacks");
    assert_eq!(registrations.len(), 3, "ours, the profiler's, ours again");
    assert_eq!(
        (
            &gap["pid"],
            &gap["tid"],
            &gap["from_ns"],
            &gap["calls"],
            &gap["handed_over"]
        ),
        (pid, pid, &registrations[1]["ts_ns"], &json!(200), &json!(0))
    );
    let to = u(&gap["to_ns"]);
    assert!(
        u(&launches[299]["ts_ns"]) < to && to < u(&launches[300]["ts_ns"]),
        "{gap}"
    );
    assert_eq!(
        issuing(&trace),
        &json!({"calls": 600, "with_work": 400, "captured": 0, "failed": 0, "empty": 0,
                "cupti_held": 200, "no_api_record": 0, "not_flushed": 0, "not_recorded": 0,
                "missing": 0})
    );
    let footer = trace.last().unwrap();
    assert_eq!(footer["gpu"]["gaps"], 1);
    assert_eq!(
        (&footer["lost"]["gpu_cupti_held"], &footer["lost"]["total"]),
        (&json!(200), &json!(200))
    );
    let lost = of_type(&trace, "lost");
    assert_eq!(
        lost.iter()
            .map(|l| (l["reason"].as_str().unwrap(), u(&l["count"])))
            .collect::<Vec<_>>(),
        [("gpu_cupti_held", 200)]
    );
    let err = stderr(&output);
    assert!(
        err.contains("cudatrace: WARNING: 200 events lost (gpu_cupti_held 200)\n"),
        "{err}"
    );
    // The library's yielding and resuming, and the profiler's calls, are in the trace.
    assert_eq!(named(&trace, "cuptiSubscribe").len(), 1);
    let forced: Vec<&Value> = named(&trace, "cuptiActivityFlushAll")
        .into_iter()
        .filter(|c| c["flags"] == 1)
        .collect();
    assert!(!forced.is_empty());
    assert_eq!(of_type(&trace, "gpu_info")[0]["subscribers"], "single");
}

#[test]
fn launches_whose_records_cupti_no_longer_gives_after_the_profiler_are_counted() {
    let Some(_guard) = root() else { return };
    // As run J saw on CUPTI 13.0: once the profiler disabled the DRIVER kind, CUPTI gives
    // the library kernels again after it takes CUPTI back, but no record of the launches.
    let (output, trace) = trace_mode(
        "gpu-clients-no-api",
        "profiler",
        &[("CUPTI_STANDIN_NO_DRIVER_AFTER_DISABLE", "1")],
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "profiler: 200 kernels, 200 api records\n"
    );
    let launches = named(&trace, "cuLaunchKernel");
    assert_eq!(launches.len(), 600);
    let with_work: Vec<usize> = launches.iter().map(|l| work_of(&trace, l)).collect();
    assert_eq!(with_work, [[1; 100].as_slice(), &[0; 500]].concat());
    // The last 300 kernels are written, unlinked for want of their launch's record.
    let kernels = of_type(&trace, "gpu_kernel");
    let unlinked: Vec<&&Value> = kernels
        .iter()
        .filter(|k| k["unlinked"] == "no_api_record")
        .collect();
    assert_eq!((kernels.len(), unlinked.len()), (400, 300));
    assert!(
        unlinked
            .iter()
            .all(|k| u(&k["ts_ns"]) > u(&launches[300]["ts_ns"]))
    );
    assert!(launches[100..].iter().all(|l| l["ret"].is_null()));
    assert_eq!(
        issuing(&trace),
        &json!({"calls": 600, "with_work": 100, "captured": 0, "failed": 0, "empty": 0,
                "cupti_held": 200, "no_api_record": 300, "not_flushed": 0,
                "not_recorded": 0, "missing": 0})
    );
    let footer = trace.last().unwrap();
    assert_eq!(footer["gpu"]["unlinked"]["no_api_record"], 300);
    assert_eq!(
        (
            &footer["lost"]["gpu_cupti_held"],
            &footer["lost"]["gpu_no_api_record"],
            &footer["lost"]["total"]
        ),
        (&json!(200), &json!(300), &json!(500))
    );
    let err = stderr(&output);
    assert!(
        err.contains(
            "cudatrace: WARNING: 500 events lost (gpu_cupti_held 200, gpu_no_api_record 300)\n"
        ),
        "{err}"
    );
}

#[test]
fn with_several_subscribers_cudatrace_and_the_profiler_each_get_every_record() {
    let Some(_guard) = root() else { return };
    let (output, trace) = trace_mode(
        "gpu-clients-multi",
        "profiler",
        &[("CUPTI_STANDIN_MULTI", "1")],
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "profiler: 200 kernels, 200 api records\n"
    );
    let launches = named(&trace, "cuLaunchKernel");
    assert_eq!(launches.len(), 600);
    assert!(
        launches
            .iter()
            .all(|l| work_of(&trace, l) == 1 && l["ret"] == 0)
    );
    assert!(of_type(&trace, "gpu_gap").is_empty());
    let info = of_type(&trace, "gpu_info");
    assert_eq!(
        (
            &info[0]["subscribers"],
            &info[0]["cupti_version"],
            &info[0]["clock"]
        ),
        (&json!("multiple"), &json!(130300), &json!("converted"))
    );
    assert_eq!(
        issuing(&trace),
        &json!({"calls": 600, "with_work": 600, "captured": 0, "failed": 0, "empty": 0,
                "cupti_held": 0, "no_api_record": 0, "not_flushed": 0, "not_recorded": 0, "missing": 0})
    );
    assert_eq!(trace.last().unwrap()["lost"]["total"], 0);
    // Its own subscriber: no process-wide registration of ours.
    assert_eq!(named(&trace, "cuptiSubscribe_v2").len(), 1);
    assert_eq!(
        named(&trace, "cuptiActivityRegisterCallbacks").len(),
        1,
        "the profiler's"
    );
}

#[test]
fn captured_calls_are_marked_and_graph_work_links_to_its_launch_and_its_capture_call() {
    let Some(_guard) = root() else { return };
    let (_, trace) = trace_mode("gpu-clients-graphs", "graphs", &[]);
    let captured: Vec<(&str, u64)> = calls(&trace)
        .iter()
        .filter_map(|c| Some((c["name"].as_str()?, c["captured"].as_u64()?)))
        .collect();
    assert_eq!(
        captured,
        [
            ("cuLaunchKernel", 1),
            ("cuMemsetD32Async", 1),
            ("cuLaunchKernel", 1)
        ]
    );
    let begin = named(&trace, "cuStreamBeginCapture_v2");
    let end = named(&trace, "cuStreamEndCapture");
    assert_eq!(
        (&begin[0]["capture"], &end[0]["capture"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(end[0]["graph"], "0x1050");
    let captured_calls: Vec<&Value> = calls(&trace)
        .into_iter()
        .filter(|c| c["captured"] == 1)
        .collect();
    let replays = named(&trace, "cuGraphLaunch");
    assert_eq!(replays.len(), 3);
    // Each replay ran kernel a (grid 2), the memset, kernel b (grid 3): node ids 4, 5, 6
    // (the capture made 1, 2, 3), each linked to its replay and to the call of its node.
    let graph_work: Vec<&Value> = trace.iter().filter(|l| l["graph_id"] == 1).collect();
    assert_eq!(graph_work.len(), 9);
    for (index, line) in graph_work.iter().enumerate() {
        let (replay, node) = (index / 3, index % 3);
        assert_eq!(
            (
                &line["call_ts_ns"],
                &line["graph_node_id"],
                &line["capture_call_tid"],
                &line["capture_call_ts_ns"]
            ),
            (
                &replays[replay]["ts_ns"],
                &json!(4 + node),
                &captured_calls[node]["tid"],
                &captured_calls[node]["ts_ns"]
            ),
            "{line}"
        );
    }
    let kernels: Vec<(&Value, &Value)> = graph_work
        .iter()
        .filter(|l| l["type"] == "gpu_kernel")
        .map(|l| (&l["kernel"], &l["grid"]))
        .collect();
    assert_eq!(
        kernels[..2],
        [
            (&json!("kernela()"), &json!([2, 1, 1])),
            (&json!("kernelb()"), &json!([3, 1, 1]))
        ]
    );
    let footer = trace.last().unwrap();
    assert_eq!(
        issuing(&trace),
        &json!({"calls": 7, "with_work": 4, "captured": 3, "failed": 0, "empty": 0,
                "cupti_held": 0, "no_api_record": 0, "not_flushed": 0, "not_recorded": 0, "missing": 0})
    );
    assert_eq!(
        footer["gpu"]["graph_nodes"],
        json!({"linked": 9, "unlinked": 0})
    );
    assert_eq!(footer["lost"]["total"], 0);

    // The summary's graphs: 3 launches of 2 kernels and 1 memset, as run said.
    let summary = Command::new(CUDATRACE)
        .args(["summary", "--json"])
        .arg(scratch_path("gpu-clients-graphs"))
        .output()
        .unwrap();
    let summary: Value = serde_json::from_slice(&summary.stdout).unwrap();
    let graph = &summary["gpu"]["graphs"][0];
    assert_eq!(
        (
            &graph["replays"],
            &graph["kernels"],
            &graph["memsets"],
            &graph["kernels_per_replay"],
            &graph["linked_to_capture"]
        ),
        (&json!(3), &json!(6), &json!(3), &json!(2.0), &json!(9))
    );
    assert_eq!(summary["gpu"]["captured_calls"], 3);
    assert_eq!(summary["gpu"]["issuing"]["captured"], 3);
}

/// The trace path [`trace_mode`] writes for `name`.
fn scratch_path(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}", std::process::id()))
        .join("trace.jsonl")
}

#[test]
fn a_kernel_keeps_its_launchs_name_where_cuptis_record_is_stale() {
    let Some(_guard) = root() else { return };
    let (_, trace) = trace_mode(
        "gpu-clients-stale",
        "stale",
        &[("CUDA_STANDIN_REUSE_FUNCTIONS", "1")],
    );
    let launches = named(&trace, "cuLaunchKernel");
    assert_eq!(
        launches
            .iter()
            .map(|l| (&l["function"], &l["kernel"]))
            .collect::<Vec<_>>(),
        [
            (&json!("0x1020"), &json!("gemm_fusion_dot_3")),
            (&json!("0x1020"), &json!("gemm_fusion_dot_6"))
        ]
    );
    let kernels: Vec<(&Value, &Value)> = of_type(&trace, "gpu_kernel")
        .iter()
        .map(|k| (&k["kernel"], &k["cupti_kernel"]))
        .collect();
    assert_eq!(
        kernels,
        [
            (&json!("gemm_fusion_dot_3"), &Value::Null),
            (&json!("gemm_fusion_dot_6"), &json!("gemm_fusion_dot_3"))
        ]
    );
    assert_eq!(trace.last().unwrap()["gpu"]["name_mismatches"], 1);
}

#[test]
fn a_users_own_injection_library_is_started_after_cudatraces() {
    let Some(_guard) = root() else { return };
    let dir = scratch("gpu-clients-chain");
    let chained = common::gpu::chained_library(&dir);
    let marker = dir.join("marker");
    let (output, trace) = trace_mode(
        "gpu-clients-chain-run",
        "gpu",
        &[
            ("CUDA_INJECTION64_PATH", chained.to_str().unwrap()),
            ("CHAINED_MARKER", marker.to_str().unwrap()),
        ],
    );
    let pid = u(&trace[0]["pids"][0]);
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        format!("chained {pid}")
    );
    assert_eq!(trace[0]["gpu"]["chained"], chained.display().to_string());
    // cudatrace's own library still records: the driver's 4 kernels.
    assert_eq!(of_type(&trace, "gpu_kernel").len(), 4);
    assert!(stderr(&output).ends_with("(command exited with 0)\n"));
}
