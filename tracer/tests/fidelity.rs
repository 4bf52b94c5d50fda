//! Root tests of what a call line holds, to the last byte, through the real eBPF path
//! against the stand-in libcuda: names of every length, 32-bit arguments whose register
//! or stack slot carries garbage above them, and the catalog's streams, events, IPC,
//! unified-memory hints, graphs and copy batches.

mod common;

use common::*;
use serde_json::{Value, json};

/// `NAME(n, f)` of `cudatrace-driver names`: the mangled name and its demangling.
fn name(namespaces: usize, function_len: usize) -> (String, String) {
    let parts: Vec<String> = (0..namespaces)
        .map(|k| format!("ns{k:02}{}", "q".repeat(44)))
        .collect();
    let function = format!("kernel{}", "z".repeat(function_len - 6));
    let mut mangled = String::from("_ZN");
    for part in &parts {
        mangled.push_str(&format!("{}{part}", part.len()));
    }
    mangled.push_str(&format!("{function_len}{function}Ev"));
    let demangled = format!("{}::{function}()", parts.join("::"));
    (mangled, demangled)
}

fn traced_calls(mode: &str) -> Vec<Value> {
    let trace_path = scratch(&format!("fidelity-{mode}")).join("trace.jsonl");
    let output = assert_no_probe_outlives(|| {
        trace_driver(&trace_path, &["--missing-probes", "ignore"], &[mode])
    });
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    assert_eq!(trace.last().unwrap()["lost"]["total"], 0);
    calls(&trace).into_iter().cloned().collect()
}

/// Asserts each call's name and the given fields, in order.
fn assert_calls(calls: &[Value], expected: &[(&str, Value)]) {
    assert_eq!(
        names(&calls.iter().collect::<Vec<_>>()),
        expected
            .iter()
            .map(|(name, _)| name.to_string())
            .collect::<Vec<_>>()
    );
    for (call, (name, fields)) in calls.iter().zip(expected) {
        for (key, value) in fields.as_object().unwrap() {
            assert_eq!(&call[key], value, "{name}.{key} in {call}");
        }
        if fields.get("ret").is_none() {
            assert_eq!(call["ret"], 0, "{call}");
        }
    }
}

#[test]
fn names_are_whole_up_to_4_kib_and_longer_ones_are_cut_and_flagged() {
    let Some(_guard) = root() else { return };
    let calls = traced_calls("names");
    let (long, long_demangled) = name(29, 43);
    let (exact, exact_demangled) = name(80, 89);
    let (over, _) = name(80, 90);
    let (huge, _) = name(99, 60);
    assert_eq!(
        (long.len(), exact.len(), over.len(), huge.len()),
        (1500, 4096, 4097, 5017)
    );
    let path = format!("/nonexistent/{}.cubin", "p".repeat(1987));
    assert_eq!(path.len(), 2006);
    let cut = |name: &str| name[..4096].to_owned();
    let kernel = |grid: u32, handle: &str, display: &str| json!({"grid": [grid, 1, 1], "block": [32, 1, 1], "function": handle, "kernel": display});
    assert_calls(
        &calls,
        &[
            ("cuInit", json!({})),
            ("cuModuleLoadData", json!({"module": "0x1000"})),
            (
                "cuModuleGetFunction",
                json!({"function": "0x1010", "symbol": long}),
            ),
            (
                "cuModuleGetFunction",
                json!({"function": "0x1020", "symbol": exact}),
            ),
            (
                "cuModuleGetFunction",
                json!({"function": "0x1030", "symbol": cut(&over), "warnings": ["string_truncated"]}),
            ),
            ("cuLibraryLoadData", json!({"library": "0x1040"})),
            (
                "cuLibraryGetKernel",
                json!({"kernel_handle": "0x1050", "symbol": cut(&huge), "warnings": ["string_truncated"]}),
            ),
            ("cuModuleLoad", json!({"module": "0x1060", "path": path})),
            ("cuLaunchKernel", kernel(1, "0x1010", &long_demangled)),
            ("cuLaunchKernel", kernel(2, "0x1020", &exact_demangled)),
            // A cut name is shown as captured, never demangled, and the launch says so.
            ("cuLaunchKernel", kernel(3, "0x1030", &cut(&over))),
            ("cuLaunchKernel", kernel(4, "0x1050", &cut(&huge))),
        ],
    );
    assert_eq!(calls[8]["kernel_mangled"], long.as_str());
    assert_eq!(calls[9]["kernel_mangled"], exact.as_str());
    for call in &calls[10..] {
        assert_eq!(call["warnings"], json!(["kernel_name_truncated"]), "{call}");
        assert!(call.get("kernel_mangled").is_none(), "{call}");
    }
    for call in calls[..4].iter().chain(&calls[5..6]).chain(&calls[7..10]) {
        assert!(call.get("warnings").is_none(), "{call}");
    }
}

#[test]
fn narrow_arguments_are_exact_whatever_their_slot_holds_above_them() {
    let Some(_guard) = root() else { return };
    let calls = traced_calls("dirty");
    let d = "0x7f0000000000";
    assert_calls(
        &calls,
        &[
            ("cuInit", json!({"flags": 0})),
            ("cuDeviceGet", json!({"device": 0})),
            ("cuStreamCreate", json!({"stream": "0x1000", "flags": 1})),
            (
                "cuStreamCreateWithPriority",
                json!({"stream": "0x1010", "flags": 1, "priority": -3}),
            ),
            ("cuModuleLoadData", json!({"module": "0x1020"})),
            ("cuModuleGetFunction", json!({"function": "0x1030"})),
            (
                "cuLaunchKernel",
                json!({"grid": [4096, 2, 1], "block": [256, 1, 3], "shared_mem": 1024,
                       "stream": "0x1000", "function": "0x1030"}),
            ),
            (
                "cuLaunchCooperativeKernel",
                json!({"grid": [8, 4, 2], "block": [64, 2, 1], "shared_mem": 48,
                       "stream": "0x1000", "function": "0x1030"}),
            ),
            (
                "cuLibraryLoadData",
                json!({"library": "0x1040", "count": 3, "library_option_count": 2}),
            ),
            (
                "cuModuleLoadDataEx",
                json!({"module": "0x1050", "count": 5}),
            ),
            ("cuMemAlloc_v2", json!({"dptr": d, "bytes": 4096})),
            (
                "cuMemsetD8_v2",
                json!({"dptr": d, "value": 0xab, "count": 16, "bytes": 16}),
            ),
            (
                "cuMemsetD16_v2",
                json!({"dptr": d, "value": 0x1234, "count": 16, "bytes": 32}),
            ),
            (
                "cuMemsetD32Async",
                json!({"dptr": d, "value": 0x89ab_cdefu32, "count": 16, "bytes": 64, "stream": "0x1000"}),
            ),
            ("cuEventCreate", json!({"event": "0x1060", "flags": 2})),
            (
                "cuEventRecordWithFlags",
                json!({"event": "0x1060", "stream": "0x1000", "flags": 1}),
            ),
            (
                "cuStreamWaitEvent",
                json!({"event": "0x1060", "stream": "0x1000", "flags": 0}),
            ),
            ("cuMemHostAlloc", json!({"bytes": 64, "flags": 4})),
            ("cuMemFreeHost", json!({})),
        ],
    );
    // Before masking, the library's `numLibraryOptions` was also read as `flags`.
    assert!(calls[8].get("flags").is_none(), "{}", calls[8]);
}

#[test]
fn streams_events_ipc_hints_graphs_and_batches_are_decoded() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("fidelity-extras").join("trace.jsonl");
    let output = trace_driver(&trace_path, &["--missing-probes", "ignore"], &["extras"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let calls: Vec<Value> = calls(&trace).into_iter().cloned().collect();
    let d = "0x7f0000000000";
    let peer = "0x7e0000000000";
    let s = "0x1000";
    // The stand-in's handle: d's 8 bytes little-endian, then 0xc8 ... 0xff.
    let tail: String = (0xc8..=0xffu32).map(|b| format!("{b:02x}")).collect();
    let handle = format!("00000000007f0000{tail}");
    assert_eq!(handle.len(), 128);
    assert_calls(
        &calls,
        &[
            ("cuInit", json!({})),
            (
                "cuStreamCreateWithPriority",
                json!({"stream": s, "flags": 1, "priority": -2}),
            ),
            ("cuStreamQuery", json!({"stream": s})),
            ("cuEventCreate", json!({"event": "0x1010", "flags": 2})),
            ("cuEventQuery", json!({"event": "0x1010"})),
            ("cuMemAlloc_v2", json!({"dptr": d, "bytes": 1048576})),
            (
                "cuIpcGetMemHandle",
                json!({"dptr": d, "ipc_handle": handle}),
            ),
            // The handle by value: its first 32 bytes, the four stack words read.
            (
                "cuIpcOpenMemHandle_v2",
                json!({"dptr": peer, "flags": 1, "ipc_handle": handle[..64]}),
            ),
            (
                "cuMemPrefetchAsync_v2",
                json!({"dptr": d, "bytes": 65536, "location": "device", "location_id": 0,
                       "flags": 0, "stream": s}),
            ),
            (
                "cuMemPrefetchAsync_v2",
                json!({"dptr": d, "bytes": 4096, "location": "host_numa", "location_id": 7,
                       "flags": 0, "stream": s}),
            ),
            (
                "cuMemAdvise_v2",
                json!({"dptr": d, "bytes": 1048576, "advice": 1,
                       "advice_name": "CU_MEM_ADVISE_SET_READ_MOSTLY",
                       "location": "device", "location_id": 0}),
            ),
            (
                "cuMemAdvise_v2",
                json!({"dptr": d, "bytes": 1048576, "advice": 3,
                       "advice_name": "CU_MEM_ADVISE_SET_PREFERRED_LOCATION",
                       "location": "host", "location_id": 0}),
            ),
            (
                "cuGraphInstantiateWithFlags",
                json!({"graph": "0x1020", "source_graph": "0x5000", "flags": 1}),
            ),
            (
                "cuGraphInstantiateWithParams",
                json!({"graph": "0x1030", "source_graph": "0x6000", "flags": 4, "stream": s,
                       "graph_result": 0}),
            ),
            (
                "cuGraphInstantiateWithParams",
                json!({"ret": 400, "ret_name": "CUDA_ERROR_INVALID_HANDLE", "graph": "0x0",
                       "source_graph": "0x0", "graph_result": 1}),
            ),
            (
                "cuGraphExecUpdate_v2",
                json!({"graph": "0x1020", "source_graph": "0x5000", "graph_result": 0}),
            ),
            (
                "cuGraphExecUpdate_v2",
                json!({"ret": 910, "ret_name": "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
                       "graph": "0x1020", "source_graph": "0x0", "graph_result": 1}),
            ),
            ("cuGraphLaunch", json!({"graph": "0x1020", "stream": s})),
            (
                "cuMemcpyBatchAsync_v2",
                json!({"kind": "Default", "count": 3, "bytes": 4096 + 512 + 100, "stream": s}),
            ),
            (
                "cuMemcpyBatchAsync_v2",
                json!({"kind": "Default", "count": 40, "stream": s,
                       "warnings": ["batch_sizes_cut"]}),
            ),
            ("cuStreamSynchronize", json!({"stream": s})),
            ("cuIpcCloseMemHandle", json!({"dptr": peer})),
            ("cuEventDestroy_v2", json!({"event": "0x1010"})),
            ("cuMemFree_v2", json!({"dptr": d})),
        ],
    );
    assert!(calls[19].get("bytes").is_none(), "{}", calls[19]);
    // IPC-opened memory is the exporter's: a mapping here, not this process's bytes.
    assert!(calls[7].get("live_bytes").is_none());
    let memory = &trace.last().unwrap()["memory"]["processes"][0];
    assert_eq!(memory["peak_device_bytes"], 1048576);
    assert_eq!(memory["final_device_bytes"], 0);
    assert_eq!(memory["ipc_opens"], 1);
    assert!(memory.get("final_ipc_open").is_none(), "closed: {memory}");
    assert_eq!(memory["unmatched_frees"], 0);
}
