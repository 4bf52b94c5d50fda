//! Exports of a hand-written trace whose slices, counters and flows are known, read back
//! with serde_json (chrome) and with the writer's own prost messages (perfetto).

use prost::Message;
use serde_json::Value;

use super::*;
use crate::{
    analysis::classify,
    export::{
        exporter::call_label,
        proto::{Trace, TrackDescriptor, TrackEvent, event_type},
    },
    schema::CallLine,
};

use crate::test_traces as traces;

use traces::{
    KNOWN_BASE_NS as BASE, KNOWN_CALLS as CALLS, KNOWN_COUNTERS as COUNTERS,
    KNOWN_DRIVER as DRIVER, KNOWN_FLOWS as FLOWS, known as known_trace,
};

fn run_export(format: ExportFormat, filters: &Filters) -> (Vec<u8>, ExportStats) {
    let mut out = Vec::new();
    let stats = export(
        known_trace().as_bytes(),
        "known.jsonl",
        &mut out,
        format,
        filters,
        false,
    )
    .unwrap();
    (out, stats)
}

fn chrome_events(filters: &Filters) -> (Vec<Value>, ExportStats) {
    let (out, stats) = run_export(ExportFormat::Chrome, filters);
    let json: Value = serde_json::from_slice(&out).expect("valid JSON");
    assert_eq!(json["displayTimeUnit"], "ns");
    assert_eq!(json["otherData"]["time_base_monotonic_ns"], BASE);
    (json["traceEvents"].as_array().unwrap().clone(), stats)
}

fn with_phase<'a>(events: &'a [Value], phase: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["ph"] == phase).collect()
}

/// Microseconds as the JSON has them, from a nanosecond offset.
fn us(offset_ns: u64) -> f64 {
    offset_ns as f64 / 1000.0
}

#[test]
fn chrome_export_has_every_slice_counter_and_flow() {
    let (events, stats) = chrome_events(&Filters::default());
    let slices = with_phase(&events, "X");
    let counters = with_phase(&events, "C");
    let starts = with_phase(&events, "s");
    let finishes = with_phase(&events, "f");
    assert_eq!(slices.len() as u64, CALLS + DRIVER);
    assert_eq!(counters.len() as u64, COUNTERS);
    assert_eq!((starts.len() as u64, finishes.len() as u64), (FLOWS, FLOWS));
    assert_eq!(with_phase(&events, "i").len(), 2, "exec and lost");
    assert_eq!(
        stats,
        ExportStats {
            lines: traces::KNOWN_LINES,
            slices: CALLS + DRIVER,
            driver_slices: DRIVER,
            instants: 2,
            counters: COUNTERS,
            flows: FLOWS,
            unknown_lines: 1,
            ..ExportStats::default()
        }
    );

    let init = slices.iter().find(|s| s["name"] == "cuInit").unwrap();
    assert_eq!(init["ts"].as_f64(), Some(us(1_000)));
    assert_eq!(init["dur"].as_f64(), Some(us(2_500)));
    assert_eq!(
        (init["pid"].as_u64(), init["tid"].as_u64()),
        (Some(100), Some(100))
    );
    assert_eq!(init["cat"], "init");
    assert_eq!(init["args"]["ts_ns"], BASE + 1_000);

    let copy = slices.iter().find(|s| s["cat"] == "copy").unwrap();
    assert_eq!(copy["name"], "cuMemcpyHtoDAsync_v2 HtoD 4.00 MiB");
    assert_eq!(copy["args"]["bytes"], 4194304);
    assert_eq!(copy["args"]["kind"], "HtoD");
    assert_eq!(copy["tid"], 101);

    let launches: Vec<_> = slices.iter().filter(|s| s["cat"] == "launch").collect();
    assert_eq!(launches.len(), 7);
    assert_eq!(
        launches[0]["name"],
        "vector_add(float const*, float const*, float*, int)"
    );
    assert_eq!(launches[0]["args"]["call"], "cuLaunchKernel");
    assert_eq!(launches[0]["args"]["grid"], serde_json::json!([4, 1, 1]));
    assert_eq!(launches[5]["name"], "unknown@0x99");
    assert_eq!(
        launches[6]["name"],
        "vector_add(float const*, float const*, float*, int) → CUDA_ERROR_INVALID_VALUE"
    );

    let bytes: Vec<(f64, u64)> = counters
        .iter()
        .map(|c| {
            (
                c["ts"].as_f64().unwrap(),
                c["args"]["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        bytes,
        [(us(6_000), 4194304), (us(31_000), 0)],
        "at each call's end"
    );
    assert!(
        counters
            .iter()
            .all(|c| c["name"] == "device memory" && c["pid"] == 100)
    );

    let driver = slices.iter().find(|s| s["cat"] == "driver").unwrap();
    assert_eq!(driver["name"], "NV_ESC_RM_ALLOC");
    assert_eq!(driver["tid"], 100 + chrome::DRIVER_TID_OFFSET);
    assert_eq!(driver["args"]["escape"], 43);

    let lost = events.iter().find(|e| e["cat"] == "lost").unwrap();
    assert_eq!(
        (lost["s"].as_str(), lost["name"].as_str()),
        (Some("g"), Some("lost 3 events (ring_full)"))
    );

    // Each flow leaves a launch and arrives in a synchronisation, inside both slices.
    let inside = |slice: &Value, ts: f64| {
        let start = slice["ts"].as_f64().unwrap();
        start <= ts && ts <= start + slice["dur"].as_f64().unwrap()
    };
    let mut pairs = Vec::new();
    for start in &starts {
        let finish = finishes.iter().find(|f| f["id"] == start["id"]).unwrap();
        assert_eq!(
            (finish["bp"].as_str(), finish["cat"].as_str()),
            (Some("e"), Some("flow"))
        );
        assert_eq!(start["name"], finish["name"]);
        let from = launches
            .iter()
            .position(|l| l["tid"] == start["tid"] && inside(l, start["ts"].as_f64().unwrap()))
            .expect("a launch encloses the flow's start");
        let to = slices
            .iter()
            .find(|s| {
                s["tid"] == finish["tid"]
                    && s["cat"] == "sync"
                    && inside(s, finish["ts"].as_f64().unwrap())
            })
            .expect("a sync encloses the flow's end");
        pairs.push((from, to["name"].as_str().unwrap().to_owned()));
    }
    pairs.sort();
    let expected: Vec<(usize, String)> = [
        (0, "cuStreamSynchronize"),
        (1, "cuStreamSynchronize"),
        (2, "cuStreamSynchronize"),
        (3, "cuCtxSynchronize"),
        (4, "cuCtxSynchronize"),
    ]
    .iter()
    .map(|(i, s)| (*i, (*s).to_owned()))
    .collect();
    assert_eq!(pairs, expected);
    assert_eq!(
        starts[0]["ts"].as_f64(),
        Some(us(10_500)),
        "the launch slice's middle"
    );

    // Tracks are named before their first event.
    let metadata = with_phase(&events, "M");
    let names: Vec<(&str, u64, &str)> = metadata
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["tid"].as_u64().unwrap(),
                m["args"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("process_name", 100, "./app --big"),
            ("thread_name", 100, "main thread"),
            ("thread_name", 101, "thread"),
            ("process_name", 200, "pid 200"),
            ("thread_name", 200, "main thread"),
            (
                "thread_name",
                100 + u64::from(chrome::DRIVER_TID_OFFSET),
                "NVIDIA driver, tid 100"
            ),
        ]
    );
    let first_event = events.iter().position(|e| e["ph"] != "M").unwrap();
    assert_eq!(events[first_event - 1]["name"], "thread_name");
}

#[test]
fn perfetto_export_decodes_to_the_same_timeline() {
    let (out, stats) = run_export(ExportFormat::Perfetto, &Filters::default());
    let mut trace = Trace::decode(out.as_slice()).expect("a valid Trace message");
    let inline_names = trace
        .packet
        .iter()
        .filter_map(|p| p.track_event.as_ref())
        .filter(|e| e.name.is_some() || !e.categories.is_empty())
        .count();
    assert_eq!(inline_names, 0, "names are interned");
    proto::resolve_interned(&mut trace);
    let events: Vec<(u64, &TrackEvent)> = trace
        .packet
        .iter()
        .filter_map(|p| Some((p.timestamp?, p.track_event.as_ref()?)))
        .collect();
    let of_type = |kind: i32| events.iter().filter(move |(_, e)| e.r#type == Some(kind));
    assert_eq!(
        of_type(event_type::SLICE_BEGIN).count() as u64,
        CALLS + DRIVER
    );
    assert_eq!(
        of_type(event_type::SLICE_END).count() as u64,
        CALLS + DRIVER
    );
    assert_eq!(of_type(event_type::COUNTER).count() as u64, COUNTERS);
    assert_eq!(of_type(event_type::INSTANT).count(), 2);
    let flow_ids: Vec<u64> = events
        .iter()
        .flat_map(|(_, e)| e.flow_ids.clone())
        .collect();
    let terminating: Vec<u64> = events
        .iter()
        .flat_map(|(_, e)| e.terminating_flow_ids.clone())
        .collect();
    assert_eq!(flow_ids.len(), 6, "every successful launch has an id");
    assert_eq!(terminating.len() as u64, FLOWS);
    assert!(terminating.iter().all(|id| flow_ids.contains(id)));
    assert_eq!(stats.flows, FLOWS);

    // Same timestamps as the JSON, in nanoseconds.
    let &(init_ts, init) = of_type(event_type::SLICE_BEGIN)
        .find(|(_, e)| e.name.as_deref() == Some("cuInit"))
        .unwrap();
    assert_eq!(init_ts, 1_000);
    assert_eq!(init.categories, ["init"]);
    let flags = init
        .debug_annotations
        .iter()
        .find(|a| a.name.as_deref() == Some("flags"))
        .unwrap();
    assert_eq!(flags.uint_value, Some(0));
    let counters: Vec<(u64, Option<i64>)> = of_type(event_type::COUNTER)
        .map(|(ts, e)| (*ts, e.counter_value))
        .collect();
    assert_eq!(counters, [(6_000, Some(4194304)), (31_000, Some(0))]);

    // Descriptors come before the events on their tracks.
    let descriptors: Vec<&TrackDescriptor> = trace
        .packet
        .iter()
        .filter_map(|p| p.track_descriptor.as_ref())
        .collect();
    let process = descriptors
        .iter()
        .find(|d| d.process.as_ref().is_some_and(|p| p.pid == Some(100)))
        .unwrap();
    assert_eq!(
        process.process.as_ref().unwrap().process_name.as_deref(),
        Some("./app --big")
    );
    let memory = descriptors.iter().find(|d| d.counter.is_some()).unwrap();
    assert_eq!(memory.parent_uuid, process.uuid);
    assert_eq!(
        memory.counter.as_ref().unwrap().unit,
        Some(proto::UNIT_SIZE_BYTES)
    );
    for (index, packet) in trace.packet.iter().enumerate() {
        assert_eq!(packet.trusted_packet_sequence_id, Some(1));
        let flags = match (index, &packet.track_event) {
            (0, _) => Some(proto::SEQ_INCREMENTAL_STATE_CLEARED),
            (_, Some(_)) => Some(proto::SEQ_NEEDS_INCREMENTAL_STATE),
            (_, None) => None,
        };
        assert_eq!(packet.sequence_flags, flags, "packet {index}");
        if let Some(uuid) = packet.track_event.as_ref().and_then(|e| e.track_uuid) {
            let described = trace.packet[..index].iter().any(|p| {
                p.track_descriptor
                    .as_ref()
                    .is_some_and(|d| d.uuid == Some(uuid))
            });
            assert!(
                described,
                "packet {index} uses track {uuid} before describing it"
            );
        }
    }
}

#[test]
fn filters_keep_pids_names_and_a_time_window() {
    let only = |filters: Filters| chrome_events(&filters);

    let (events, stats) = only(Filters {
        pids: vec![200],
        ..Filters::default()
    });
    assert_eq!(with_phase(&events, "X").len(), 1);
    assert!(with_phase(&events, "C").is_empty());
    assert_eq!(
        stats.filtered,
        CALLS + DRIVER - 1 + 2,
        "lost and exec markers too"
    );

    let (events, stats) = only(Filters {
        names: vec!["vector_add".into(), "Synchronize".into()],
        ..Filters::default()
    });
    let slices = with_phase(&events, "X");
    assert_eq!(
        slices.len(),
        6 + 2,
        "named launches (one failed) and the syncs"
    );
    assert_eq!(stats.flows, FLOWS);
    assert_eq!(
        with_phase(&events, "C").len() as u64,
        COUNTERS,
        "counters stay"
    );

    let (events, stats) = only(Filters {
        names: vec!["vector_add".into()],
        ..Filters::default()
    });
    assert_eq!(with_phase(&events, "X").len(), 6);
    assert_eq!(stats.flows, 0, "an arrow needs its sync");

    // 12-21 µs: launches 2-4 (launch 2 overlaps the start) and the stream sync.
    let (events, stats) = only(Filters {
        start_ns: Some(12_500),
        end_ns: Some(21_000),
        ..Filters::default()
    });
    let names: Vec<&str> = with_phase(&events, "X")
        .iter()
        .map(|s| s["args"]["call"].as_str().or(s["name"].as_str()).unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "cuLaunchKernel",
            "cuLaunchKernel",
            "cuLaunchKernel",
            "cuStreamSynchronize"
        ]
    );
    assert_eq!(stats.flows, 2, "launches 2 and 3; launch 1 is outside");
    // The device bytes held when the window opens.
    let counters = with_phase(&events, "C");
    assert_eq!(counters.len(), 1);
    assert_eq!(counters[0]["ts"].as_f64(), Some(us(12_500)));
    assert_eq!(counters[0]["args"]["bytes"], 4194304);
}

#[test]
fn empty_and_headerless_traces_export() {
    for format in [ExportFormat::Chrome, ExportFormat::Perfetto] {
        let mut out = Vec::new();
        let stats = export(
            &b""[..],
            "empty",
            &mut out,
            format,
            &Filters::default(),
            false,
        )
        .unwrap();
        assert_eq!(stats, ExportStats::default());
        if format == ExportFormat::Chrome {
            let json: Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(json["traceEvents"], serde_json::json!([]));
        } else {
            assert!(out.is_empty(), "a Trace with no packets");
        }
    }
    // No header: absolute monotonic times.
    let line =
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":5000,"dur_ns":10,"ret":0}"#;
    let mut out = Vec::new();
    export(
        line.as_bytes(),
        "t",
        &mut out,
        ExportFormat::Chrome,
        &Filters::default(),
        false,
    )
    .unwrap();
    let json: Value = serde_json::from_slice(&out).unwrap();
    let slice = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["ph"] == "X")
        .unwrap();
    assert_eq!(slice["ts"].as_f64(), Some(5.0));
    assert_eq!(slice["dur"].as_f64(), Some(0.01));
}

#[test]
fn bad_lines_stop_the_export_unless_skipped() {
    let text = format!("{}not json\n", known_trace());
    let error = export(
        text.as_bytes(),
        "t.jsonl",
        Vec::new(),
        ExportFormat::Chrome,
        &Filters::default(),
        false,
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            error,
            ExportError::Read(ReadError::BadLine { line: 21, .. })
        ),
        "{error}"
    );
    let stats = export(
        text.as_bytes(),
        "t.jsonl",
        Vec::new(),
        ExportFormat::Perfetto,
        &Filters::default(),
        true,
    )
    .unwrap();
    assert_eq!((stats.skipped_lines, stats.slices), (1, CALLS + DRIVER));
}

#[test]
fn labels_name_kernels_copies_and_errors() {
    let record = |name: &str, fill: &dyn Fn(&mut CallLine)| {
        let mut record = CallLine {
            name: name.into(),
            ..CallLine::default()
        };
        fill(&mut record);
        let role = classify(name).0;
        call_label(&record, role).into_owned()
    };
    assert_eq!(
        record("cuLaunchKernel", &|r| r.function =
            Some(crate::schema::Hex(0xab))),
        "function 0xab"
    );
    assert_eq!(record("cuLaunchKernel", &|_| {}), "cuLaunchKernel");
    assert_eq!(
        record("cuMemcpyDtoH_v2", &|r| {
            r.kind = Some("DtoH".into());
            r.bytes = Some(1536);
        }),
        "cuMemcpyDtoH_v2 DtoH 1.50 KiB"
    );
    assert_eq!(
        record("cuMemsetD32_v2", &|r| r.bytes = Some(64)),
        "cuMemsetD32_v2 64 B"
    );
    assert_eq!(
        record("cuInit", &|r| r.ret = Some(999)),
        "cuInit → error 999"
    );
}

/// A shell's forked child execs another program: both formats rename it, the protobuf
/// through a process tree (the trace processor keeps a process descriptor's first name).
#[test]
fn an_exec_renames_the_process_in_both_formats() {
    let text = r#"{"type":"header","start_monotonic_ns":1000,"command":["/bin/sh","-c","x"],"pids":[7]}
{"type":"call","name":"cuInit","pid":7,"tid":7,"ts_ns":2000,"dur_ns":10,"ret":0}
{"type":"process","event":"fork","pid":7,"tid":7,"ts_ns":3000,"child_pid":8,"comm":"sh"}
{"type":"call","name":"cuInit","pid":8,"tid":8,"ts_ns":4000,"dur_ns":10,"ret":0}
{"type":"process","event":"exec","pid":8,"tid":8,"ts_ns":5000,"filename":"/usr/bin/fake nvidia"}
{"type":"call","name":"cuInit","pid":8,"tid":8,"ts_ns":6000,"dur_ns":10,"ret":0}
{"type":"process","event":"exec","pid":9,"tid":9,"ts_ns":7000,"filename":"/bin/other"}
{"type":"call","name":"cuInit","pid":9,"tid":9,"ts_ns":8000,"dur_ns":10,"ret":0}
"#;
    let exported = |format| {
        let mut out = Vec::new();
        export(
            text.as_bytes(),
            "t",
            &mut out,
            format,
            &Filters::default(),
            false,
        )
        .unwrap();
        out
    };

    let json: Value = serde_json::from_slice(&exported(ExportFormat::Chrome)).unwrap();
    let names: Vec<(u64, &str)> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| {
            (
                e["pid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            (7, "/bin/sh -c x"),
            (8, "sh"),
            (8, "fake nvidia"),
            // Its exec's marker is its first event, drawn before the new name.
            (9, "pid 9"),
            (9, "other")
        ]
    );

    let trace = Trace::decode(exported(ExportFormat::Perfetto).as_slice()).unwrap();
    let described: Vec<(i32, &str)> = trace
        .packet
        .iter()
        .filter_map(|p| p.track_descriptor.as_ref()?.process.as_ref())
        .map(|p| (p.pid.unwrap(), p.process_name.as_deref().unwrap()))
        .collect();
    assert_eq!(described, [(7, "/bin/sh -c x"), (8, "sh"), (9, "pid 9")]);
    let renamed: Vec<(u64, &proto::ProcessTreeProcess)> = trace
        .packet
        .iter()
        .filter_map(|p| Some((p.timestamp?, p.process_tree.as_ref()?.processes.first()?)))
        .collect();
    assert_eq!(renamed.len(), 2, "pids 8 and 9 are named twice");
    let (ts, process) = renamed[0];
    assert_eq!(
        ts, 4_000,
        "after the events written so far (the exec's marker)"
    );
    assert_eq!((process.pid, process.ppid), (Some(8), Some(7)));
    // Not cut at its space.
    assert_eq!(process.cmdline, ["fake nvidia", ""]);
    let (ts, process) = renamed[1];
    assert_eq!(ts, 6_000);
    // Its fork was not traced.
    assert_eq!((process.pid, process.ppid), (Some(9), Some(0)));
    assert_eq!(process.cmdline, ["other"]);
}

/// A GPU counter value: (pid, track, ts since the base, value).
type GpuValue = (u32, String, u64, f64);

/// The `--power` trace's GPU counter values and the GPU groups (pid, name), both formats.
fn power_counters(format: ExportFormat) -> (Vec<GpuValue>, Vec<(u32, String)>) {
    let mut out = Vec::new();
    let stats = export(
        traces::power().as_bytes(),
        "power.jsonl",
        &mut out,
        format,
        &Filters::default(),
        false,
    )
    .unwrap();
    // The device-memory values (4 allocations, 4 frees), then the GPUs'.
    let memory = stats.counters - traces::POWER_COUNTERS;
    assert_eq!(memory, 8, "{stats:?}");
    let mut counters = Vec::new();
    let mut groups = Vec::new();
    match format {
        ExportFormat::Chrome => {
            let json: Value = serde_json::from_slice(&out).unwrap();
            for event in json["traceEvents"].as_array().unwrap() {
                let pid = event["pid"].as_u64().unwrap() as u32;
                match event["ph"].as_str().unwrap() {
                    "C" if event["cat"] == "power" => {
                        let (unit, value) =
                            event["args"].as_object().unwrap().iter().next().unwrap();
                        let ts = (event["ts"].as_f64().unwrap() * 1000.0).round() as u64;
                        let track = format!("{} {unit}", event["name"].as_str().unwrap());
                        counters.push((pid, track, ts, value.as_f64().unwrap()));
                    }
                    "M" if pid >= timeline::GPU_PID_BASE => {
                        groups.push((pid, event["args"]["name"].as_str().unwrap().to_owned()));
                    }
                    _ => {}
                }
            }
        }
        ExportFormat::Perfetto => {
            let trace = Trace::decode(out.as_slice()).unwrap();
            let mut tracks = std::collections::HashMap::new();
            let mut pids = std::collections::HashMap::new();
            for packet in &trace.packet {
                if let Some(d) = &packet.track_descriptor {
                    if let Some(process) = &d.process {
                        let pid = process.pid.unwrap() as u32;
                        pids.insert(d.uuid.unwrap(), pid);
                        if pid >= timeline::GPU_PID_BASE {
                            groups.push((pid, process.process_name.clone().unwrap()));
                        }
                    } else if let Some(parent) = d.parent_uuid {
                        tracks.insert(
                            d.uuid.unwrap(),
                            (parent, d.name.clone().unwrap_or_default()),
                        );
                    }
                }
                if let (Some(ts), Some(event)) = (packet.timestamp, &packet.track_event)
                    && let Some(value) = event.double_counter_value
                {
                    let (parent, name) = &tracks[&event.track_uuid.unwrap()];
                    counters.push((pids[parent], name.clone(), ts, value));
                }
            }
        }
        ExportFormat::Parquet => unreachable!("a timeline format"),
    }
    (counters, groups)
}

#[test]
fn power_lines_become_each_gpus_counter_tracks() {
    for format in [ExportFormat::Chrome, ExportFormat::Perfetto] {
        let (counters, groups) = power_counters(format);
        let gpu0 = timeline::GPU_PID_BASE;
        assert_eq!(
            groups,
            [
                (gpu0, "GPU 0: test GPU A".to_owned()),
                (gpu0 + 1, "GPU 1: test GPU B".to_owned())
            ],
            "{format:?}"
        );
        assert_eq!(counters.len() as u64, traces::POWER_COUNTERS, "{format:?}");
        let track = |pid: u32, name: &str| -> Vec<(u64, f64)> {
            counters
                .iter()
                .filter(|(p, n, _, _)| *p == pid && n == name)
                .map(|(_, _, ts, value)| (*ts, *value))
                .collect()
        };
        // Times from the header's start (1000): the samples every 100 µs from 0.
        let times: Vec<u64> = (0..traces::POWER_SAMPLES).map(|k| k * 100_000).collect();
        let values = |track: &[(u64, f64)]| track.iter().map(|p| p.1).collect::<Vec<_>>();
        let power0 = track(gpu0, "power W");
        assert_eq!(
            power0.iter().map(|p| p.0).collect::<Vec<_>>(),
            times,
            "{format:?}"
        );
        assert!(values(&power0).iter().all(|w| *w == 100.0));
        assert!(
            values(&track(gpu0, "instant power W"))
                .iter()
                .all(|w| *w == 100.0)
        );
        assert!(track(gpu0 + 1, "instant power W").is_empty());
        // Energy: GPU 0's counter less its first reading, GPU 1's integrated power.
        let energy0 = values(&track(gpu0, "energy J"));
        let energy1 = values(&track(gpu0 + 1, "energy J"));
        for k in 0..traces::POWER_SAMPLES as usize {
            assert_eq!(energy0[k], k as f64 * 10.0 / 1e3, "{format:?} sample {k}");
            assert!(
                (energy1[k] - k as f64 * 25.0 / 1e3).abs() < 1e-12,
                "{format:?} {k}"
            );
        }
        let utilization = values(&track(gpu0, "GPU utilisation %"));
        assert_eq!(
            utilization,
            (0..21).map(|k| f64::from(k * 5)).collect::<Vec<_>>()
        );
        for (pid, name, value) in [
            (gpu0, "SM clock MHz", 1980.0),
            (gpu0, "memory clock MHz", 2619.0),
            (gpu0, "memory utilisation %", 17.0),
            (gpu0, "temperature C", 60.0),
            (gpu0, "memory used bytes", 1048576.0),
            (gpu0 + 1, "power W", 250.0),
            (gpu0 + 1, "SM clock MHz", 1410.0),
        ] {
            let track = track(pid, name);
            assert_eq!(
                track.len() as u64,
                traces::POWER_SAMPLES,
                "{format:?} {name}"
            );
            assert!(
                track.iter().all(|p| p.1 == value),
                "{format:?} {name}: {track:?}"
            );
        }
    }
}

#[test]
fn the_time_window_applies_to_power_samples() {
    let mut out = Vec::new();
    let filters = Filters {
        start_ns: Some(1_000_000),
        end_ns: Some(1_500_000),
        pids: vec![7],
        ..Filters::default()
    };
    let stats = export(
        traces::power().as_bytes(),
        "power.jsonl",
        &mut out,
        ExportFormat::Chrome,
        &filters,
        false,
    )
    .unwrap();
    // Samples 10 to 15 of both GPUs; --pid keeps GPU tracks (they are no process's).
    assert_eq!(stats.counters, 6 * (9 + 8));
}

/// Two ranks of one communicator (pids 7 and 8, the same unique id) and a collective on a
/// communicator whose creation was not traced.
fn nccl_trace() -> String {
    let id = "aabbccddeeff00112233445566778899aabbccddeeff00112233445566778899";
    let call = |name: &str, pid: u32, ts: u64, extra: &str| {
        format!(
            r#"{{"type":"call","name":"{name}","pid":{pid},"tid":{pid},"ts_ns":{ts},"dur_ns":100,"ret":0{extra}}}"#
        )
    };
    let all_reduce = r#","comm":"0x10","count":256,"datatype":"float32","datatype_size":4,"bytes":1024,"op":"sum","stream":"0x5""#;
    [
        r#"{"type":"header","format":"cudatrace","version":1,"command":["torchrun"],"pids":[7,8],"start_monotonic_ns":0}"#.to_owned(),
        call("ncclCommInitRank", 7, 1_000, &format!(r#","comm":"0x10","rank":0,"nranks":2,"unique_id":"{id}""#)),
        call("ncclCommInitRank", 8, 1_100, &format!(r#","comm":"0x10","rank":1,"nranks":2,"unique_id":"{id}""#)),
        call("ncclAllReduce", 7, 2_000, all_reduce),
        call("ncclAllReduce", 8, 2_050, all_reduce),
        call("ncclAllReduce", 7, 3_000, all_reduce),
        call("ncclBroadcast", 7, 4_000, r#","comm":"0x10","count":8,"datatype":"int8","datatype_size":1,"bytes":8,"root":1,"stream":"0x5""#),
        call("ncclAllReduce", 7, 5_000, &all_reduce.replace("0x10", "0x99")),
        // ncclBcast runs as ncclBroadcast: the inner call returns first.
        r#"{"type":"call","name":"ncclBroadcast","pid":7,"tid":7,"ts_ns":6010,"dur_ns":80,"ret":0,"comm":"0x10","count":4,"datatype":"int8","datatype_size":1,"bytes":4,"root":0,"stream":"0x5"}"#.to_owned(),
        r#"{"type":"call","name":"ncclBcast","pid":7,"tid":7,"ts_ns":6000,"dur_ns":100,"ret":0,"comm":"0x10","count":4,"datatype":"int8","datatype_size":1,"bytes":4,"root":0,"stream":"0x5"}"#.to_owned(),
    ]
    .join("\n")
}

#[test]
fn nccl_collectives_get_a_track_per_communicator_and_rank() {
    const RANK_0: &str = "NCCL rank 0/2 (comm aabbccddeeff0011…)";
    const RANK_1: &str = "NCCL rank 1/2 (comm aabbccddeeff0011…)";
    const UNKNOWN: &str = "NCCL rank ?/? (comm 0x99)";
    let export_nccl = |format| {
        let mut out = Vec::new();
        let stats = export(
            nccl_trace().as_bytes(),
            "nccl.jsonl",
            &mut out,
            format,
            &Filters::default(),
            false,
        )
        .unwrap();
        (out, stats)
    };

    let (out, stats) = export_nccl(ExportFormat::Chrome);
    assert_eq!((stats.slices, stats.nccl_slices), (9 + 6, 6));
    let json: Value = serde_json::from_slice(&out).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let base = chrome::NCCL_TID_BASE;
    let mut tracks: Vec<(u64, u64, &str)> = events
        .iter()
        .filter(|e| e["name"] == "thread_name" && e["tid"].as_u64().unwrap() > base as u64)
        .map(|e| {
            let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            (pid, tid - base as u64, e["args"]["name"].as_str().unwrap())
        })
        .collect();
    tracks.sort();
    assert_eq!(tracks, [(7, 1, RANK_0), (7, 3, UNKNOWN), (8, 2, RANK_1)]);
    // (µs, pid, track, name, rank, bytes, root, ran_as)
    type RankSlice<'a> = (
        u64,
        u64,
        u64,
        &'a str,
        &'a Value,
        &'a Value,
        &'a Value,
        &'a Value,
    );
    let mut rank_slices: Vec<RankSlice> = with_phase(events, "X")
        .into_iter()
        .filter(|e| e["cat"] == "nccl_rank")
        .map(|e| {
            (
                e["ts"].as_f64().unwrap() as u64,
                e["pid"].as_u64().unwrap(),
                e["tid"].as_u64().unwrap() - base as u64,
                e["name"].as_str().unwrap(),
                &e["args"]["rank"],
                &e["args"]["bytes"],
                &e["args"]["root"],
                &e["args"]["ran_as"],
            )
        })
        .collect();
    rank_slices.sort_by_key(|slice| (slice.0, slice.1));
    let null = Value::Null;
    let (r0, r1, kib, eight, four) = (
        Value::from(0),
        Value::from(1),
        Value::from(1024),
        Value::from(8),
        Value::from(4),
    );
    let inner = Value::from("ncclBroadcast");
    // Chrome's ts is in µs from the header's start; the inner ncclBroadcast has no slice.
    assert_eq!(
        rank_slices,
        [
            (2, 7, 1, "AllReduce 1.00 KiB", &r0, &kib, &null, &null),
            (2, 8, 2, "AllReduce 1.00 KiB", &r1, &kib, &null, &null),
            (3, 7, 1, "AllReduce 1.00 KiB", &r0, &kib, &null, &null),
            (4, 7, 1, "Broadcast 8 B", &r0, &eight, &r1, &null),
            (5, 7, 3, "AllReduce 1.00 KiB", &null, &kib, &null, &null),
            (6, 7, 1, "Bcast 4 B", &r0, &four, &r0, &inner),
        ]
    );
    // The call's own slice stays on its thread.
    assert_eq!(
        with_phase(events, "X")
            .iter()
            .filter(|e| e["name"] == "ncclAllReduce" && e["tid"] == 7)
            .count(),
        3
    );

    let (out, stats) = export_nccl(ExportFormat::Perfetto);
    assert_eq!((stats.slices, stats.nccl_slices), (15, 6));
    let mut trace = Trace::decode(out.as_slice()).unwrap();
    proto::resolve_interned(&mut trace);
    let descriptors: Vec<&TrackDescriptor> = trace
        .packet
        .iter()
        .filter_map(|p| p.track_descriptor.as_ref())
        .collect();
    let process_uuid = |pid: i32| {
        descriptors
            .iter()
            .find(|d| d.process.as_ref().is_some_and(|p| p.pid == Some(pid)))
            .unwrap()
            .uuid
    };
    for (name, pid, slices) in [(RANK_0, 7, 4), (RANK_1, 8, 1), (UNKNOWN, 7, 1)] {
        let track = descriptors
            .iter()
            .find(|d| d.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no track {name}"));
        assert_eq!(track.parent_uuid, process_uuid(pid), "{name}");
        let begins = trace
            .packet
            .iter()
            .filter_map(|p| p.track_event.as_ref())
            .filter(|e| e.track_uuid == track.uuid && e.r#type == Some(event_type::SLICE_BEGIN))
            .count();
        assert_eq!(begins, slices, "{name}");
    }
}

/// Lines without a backslash are written without the escape check: a kernel name the
/// analysis takes from an escaped line, and lines with escapes of their own, are still
/// escaped; the whole output is valid JSON with the exact strings.
#[test]
fn strings_are_escaped_where_a_line_had_escapes() {
    let trace = r#"{"type":"header","format":"cudatrace","version":2,"command":["./app"],"pids":[7],"start_monotonic_ns":1000}
{"type":"call","name":"cuModuleGetFunction","pid":7,"tid":7,"ts_ns":2000,"dur_ns":10,"ret":0,"function":"0x30","symbol":"k\"q\\z\u0001","module":"0x20"}
{"type":"call","name":"cuLaunchKernel","pid":7,"tid":7,"ts_ns":3000,"dur_ns":10,"ret":0,"stream":"0x10","function":"0x30"}
{"type":"call","name":"cuLaunchKernel","pid":7,"tid":7,"ts_ns":4000,"dur_ns":10,"ret":0,"stream":"0x10","function":"0x31","kernel":"plain é"}
{"type":"call","name":"cuLaunchKernel","pid":7,"tid":7,"ts_ns":5000,"dur_ns":10,"ret":0,"stream":"0x10","function":"0x32","kernel":"a\\b","warnings":["x\ty"]}
"#;
    let mut out = Vec::new();
    export(
        trace.as_bytes(),
        "escapes.jsonl",
        &mut out,
        ExportFormat::Chrome,
        &Filters::default(),
        false,
    )
    .unwrap();
    let json: Value = serde_json::from_slice(&out).expect("valid JSON");
    let events = json["traceEvents"].as_array().unwrap();
    let slices = with_phase(events, "X");
    let launches: Vec<(&str, &str)> = slices
        .iter()
        .filter(|slice| slice["args"]["call"] == "cuLaunchKernel")
        .map(|slice| {
            (
                slice["name"].as_str().unwrap(),
                slice["args"]["kernel"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        launches,
        [
            ("k\"q\\z\u{1}", "k\"q\\z\u{1}"),
            ("plain é", "plain é"),
            ("a\\b", "a\\b")
        ]
    );
    assert_eq!(slices[3]["args"]["warnings"], serde_json::json!(["x\ty"]));
    assert_eq!(slices[0]["args"]["symbol"], "k\"q\\z\u{1}");
}
