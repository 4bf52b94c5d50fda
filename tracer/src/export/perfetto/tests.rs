use super::{Arg, debug_annotation, debug_annotation_len, wire};

/// Every kind of value, named by iid or in full, short and long: the length is what
/// is written.
#[test]
fn annotation_lengths_are_what_is_written() {
    let long = "k".repeat(300);
    let values = [
        Arg::Bool(true),
        Arg::Unsigned(0),
        Arg::Unsigned(u64::MAX),
        Arg::Signed(-1),
        Arg::Float(1.5),
        Arg::Text(""),
        Arg::Text(&long),
        Arg::Hex(0),
        Arg::Hex(0x7f00_0000_1234),
        Arg::Hex(u64::MAX),
        Arg::Json("[1,2,3]"),
    ];
    for value in values {
        for (key, iid) in [("bytes", Some(1)), ("bytes", Some(300)), ("name", None)] {
            let mut written = Vec::new();
            debug_annotation(&mut written, key, iid, value);
            assert_eq!(
                written.len(),
                debug_annotation_len(key, iid, value),
                "{value:?}"
            );
        }
    }
}

/// A nested message's length takes the width it needs, whatever was set aside for it,
/// as prost writes it.
#[test]
fn nested_lengths_are_written_as_prost_writes_them() {
    for length in [0, 1, 127, 128, 16_383, 16_384, 300_000] {
        let body = vec![7u8; length];
        let mut expected = vec![1u8];
        prost::encoding::bytes::encode(4, &body, &mut expected);
        for guess in [1, 2, 3] {
            let mut written = vec![1u8];
            wire::message(&mut written, 4, guess, |buf| buf.extend_from_slice(&body));
            assert!(written == expected, "length {length}, guess {guess}");
        }
    }
}

/// A `--stacks --gpu` trace, its stacks sampled (`every`), of two threads: two stacks
/// sharing their outer frame, one cut, one without frames, a call naming a stack the
/// trace lacks, a call without a stack, kernels of each.
fn sampled_stacks_trace() -> String {
    let frame = |file: &str, qualname: &str, line: u32| {
        format!(r#"{{"file":"{file}","qualname":"{qualname}","line":{line},"first_line":1}}"#)
    };
    let main = frame("/w/run.py", "<module>", 9);
    let lines = [
        r#"{"type":"header","format":"cudatrace","version":2,"command":["python3","run.py"],"pids":[7],"start_monotonic_ns":1000000,"probes":[],"gpu":{"library":"/x/inject.so","libcupti":"/x/libcupti.so","libcupti_from":"--cupti"},"stacks":{"families":["launch"],"depth":8,"every":3}}"#.to_owned(),
        format!(r#"{{"type":"stack","id":1,"frames":[{},{main}]}}"#, frame("/w/a.py", "f", 3)),
        format!(r#"{{"type":"stack","id":2,"frames":[{},{main}]}}"#, frame("/w/a.py", "g", 5)),
        format!(r#"{{"type":"stack","id":3,"frames":[{}],"cut":true}}"#, frame("/w/a.py", "h", 7)),
        r#"{"type":"stack","id":4,"frames":[]}"#.to_owned(),
        r#"{"type":"call","name":"cuLaunchKernel","pid":7,"tid":7,"ts_ns":1005000,"dur_ns":100,"ret":0,"stream":"0x0","function":"0x1","stack":4}"#.to_owned(),
        r#"{"type":"call","name":"cuLaunchKernel","pid":7,"tid":7,"ts_ns":1010000,"dur_ns":100,"ret":0,"stream":"0x0","function":"0x1","stack":1}"#.to_owned(),
        r#"{"type":"call","name":"cuLaunchKernel","pid":7,"tid":7,"ts_ns":1020000,"dur_ns":100,"ret":0,"stream":"0x0","function":"0x1","stack":2}"#.to_owned(),
        r#"{"type":"call","name":"cuLaunchKernel","pid":7,"tid":8,"ts_ns":1030000,"dur_ns":100,"ret":0,"stream":"0x0","function":"0x1","stack":3}"#.to_owned(),
        r#"{"type":"call","name":"cuLaunchKernel","pid":7,"tid":7,"ts_ns":1040000,"dur_ns":100,"ret":0,"stream":"0x0","function":"0x1","stack":1}"#.to_owned(),
        r#"{"type":"call","name":"cuLaunchKernel","pid":7,"tid":7,"ts_ns":1050000,"dur_ns":100,"ret":0,"stream":"0x0","function":"0x1","stack":99}"#.to_owned(),
        r#"{"type":"call","name":"cuLaunchKernel","pid":7,"tid":7,"ts_ns":1060000,"dur_ns":100,"ret":0,"stream":"0x0","function":"0x1"}"#.to_owned(),
        r#"{"type":"gpu_kernel","pid":7,"device":0,"context":1,"stream":7,"ts_ns":1100000,"dur_ns":2500,"kernel":"k","correlation_id":1,"call_tid":7,"call_ts_ns":1010000}"#.to_owned(),
        r#"{"type":"gpu_kernel","pid":7,"device":0,"context":1,"stream":7,"ts_ns":1110000,"dur_ns":600,"kernel":"k","correlation_id":2,"call_tid":7,"call_ts_ns":1040000}"#.to_owned(),
        r#"{"type":"gpu_kernel","pid":7,"device":0,"context":1,"stream":7,"ts_ns":1120000,"dur_ns":1500,"kernel":"k","correlation_id":3,"call_tid":8,"call_ts_ns":1030000}"#.to_owned(),
        r#"{"type":"gpu_kernel","pid":7,"device":0,"context":1,"stream":7,"ts_ns":1130000,"dur_ns":5000,"kernel":"k","correlation_id":4,"call_tid":7,"call_ts_ns":1060000}"#.to_owned(),
        r#"{"type":"footer"}"#.to_owned(),
    ];
    lines.join("\n") + "\n"
}

/// Stacks are interned once each on the one sequence, before (or in) the first packet
/// that names them; samples need the incremental state; the defaults naming the
/// timebase come before the first sample; calls without a stack are no samples.
#[test]
fn stack_samples_are_interned_once_on_one_sequence() {
    use std::collections::{BTreeMap, HashSet};

    use prost::Message;

    use crate::export::{
        ExportFormat, Filters, export,
        proto::{SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE, Trace},
    };

    let mut out = Vec::new();
    let stats = export(
        sampled_stacks_trace().as_bytes(),
        "stacks.jsonl",
        &mut out,
        ExportFormat::Perfetto,
        &Filters::default(),
        false,
    )
    .unwrap();
    // Calls with a stack: 4 (stack 4 has no frame, stack 99 is not in the trace, one call
    // has none). GPU time:
    // stack 1 on tid 7, 2,500 + 600 ns: 3 samples (at 1,000, 2,000 and 3,000 ns of it), 100
    // ns left; stack 3 on tid 8, 1,500 ns: 1 sample, 500 left; the stackless call's kernel
    // none.
    assert_eq!(
        (
            stats.call_samples,
            stats.gpu_samples,
            stats.gpu_ns_unsampled
        ),
        (4, 4, 600)
    );
    let trace = Trace::decode(out.as_slice()).unwrap();
    let mut defined: [HashSet<u64>; 5] = Default::default();
    let mut defaults_at = None;
    let mut samples = Vec::new();
    for (index, packet) in trace.packet.iter().enumerate() {
        assert_eq!(packet.trusted_packet_sequence_id, Some(1));
        if index == 0 {
            assert_eq!(packet.sequence_flags, Some(SEQ_INCREMENTAL_STATE_CLEARED));
        }
        if let Some(data) = &packet.interned_data {
            let tables = [
                data.mappings.iter().map(|m| m.iid).collect::<Vec<_>>(),
                data.mapping_paths.iter().map(|p| p.iid).collect(),
                data.function_names.iter().map(|f| f.iid).collect(),
                data.frames.iter().map(|f| f.iid).collect(),
                data.callstacks.iter().map(|c| c.iid).collect(),
            ];
            for (table, iids) in defined.iter_mut().zip(tables) {
                for iid in iids {
                    assert!(table.insert(iid.unwrap()), "iid {iid:?} interned twice");
                }
            }
            for frame in &data.frames {
                assert!(defined[0].contains(&frame.mapping_id.unwrap()));
                assert!(defined[2].contains(&frame.function_name_id.unwrap()));
            }
            for callstack in &data.callstacks {
                assert!(callstack.frame_ids.iter().all(|id| defined[3].contains(id)));
            }
        }
        if let Some(defaults) = &packet.trace_packet_defaults {
            defaults_at = Some(index);
            let name = defaults
                .perf_sample_defaults
                .as_ref()
                .and_then(|d| d.timebase.as_ref())
                .and_then(|t| t.name.as_deref());
            assert_eq!(
                name,
                Some("Python stacks: 1 call in 3 sampled at random (--stack-every 3)")
            );
        }
        if let Some(sample) = &packet.perf_sample {
            assert!(defaults_at.is_some_and(|at| at < index));
            assert_eq!(packet.sequence_flags, Some(SEQ_NEEDS_INCREMENTAL_STATE));
            let callstack = sample.callstack_iid.unwrap();
            assert!(
                defined[4].contains(&callstack),
                "callstack {callstack} not interned"
            );
            let gpu_time = sample.tid.unwrap() >= 1 << 30;
            let pid = if gpu_time {
                (1 << 30) + (1 << 24) + 7
            } else {
                7
            };
            assert_eq!(sample.pid, Some(pid));
            samples.push((packet.timestamp.unwrap(), sample.tid.unwrap(), callstack));
        }
    }
    // Files a.py, run.py and the cut marker's; frames f, g, h, <module> and the marker;
    // three stacks.
    let counts: Vec<usize> = defined.iter().map(HashSet::len).collect();
    assert_eq!(counts, [3, 2, 5, 5, 3]);
    let gpu = |tid: u32| (1 << 30) + tid;
    let mut by_thread: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for (ts, tid, callstack) in samples {
        by_thread.entry(tid).or_default().push((ts, callstack));
    }
    let expected = BTreeMap::from([
        (7, vec![(10_000, 1), (20_000, 2), (40_000, 1)]),
        (8, vec![(30_000, 3)]),
        (gpu(7), vec![(101_000, 1), (102_000, 1), (110_500, 1)]),
        (gpu(8), vec![(121_000, 3)]),
    ]);
    assert_eq!(by_thread, expected);
}
