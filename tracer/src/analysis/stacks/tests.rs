//! The stacks trace of the tests (`tests/traces/stacks.rs`, whose doc has the table)
//! summed up: every figure exact, each column adding up to the trace's own totals.

use super::{
    StackFigures,
    rows::{NO_LAYER, NO_STACK, NO_USER_FRAME, StackRow},
};
use crate::{
    analysis::summarise::{Summarised, summarise},
    reader::TraceLines,
    test_traces::{STACKS_CALLS, STACKS_GPU_NS, stacks},
};

fn read(text: &str) -> Summarised {
    summarise(|| Ok(TraceLines::new(text.as_bytes(), "stacks.jsonl", false))).unwrap()
}

fn figures(
    calls: u64,
    time_ns: u64,
    launches: u64,
    [copied_bytes, allocated_bytes, live_bytes]: [u64; 3],
    live_allocations: u64,
    [gpu_ns, gpu_kernels]: [u64; 2],
) -> StackFigures {
    StackFigures {
        calls,
        time_ns,
        launches,
        copied_bytes,
        allocated_bytes,
        live_bytes,
        live_allocations,
        gpu_ns,
        gpu_kernels,
    }
}

fn named(rows: &[StackRow]) -> Vec<(&str, StackFigures)> {
    rows.iter().map(|r| (r.name.as_str(), r.figures)).collect()
}

#[test]
fn layers_lines_and_users_lines_have_the_traces_figures() {
    let summarised = read(&stacks());
    let report = &summarised.report;
    let summary = report.stacks.as_ref().unwrap().summary();
    assert!(summary.gpu);
    assert_eq!(summary.stacks, 5);
    assert_eq!(summary.counts.calls_with_stack, 12);
    assert_eq!(summary.counts.cut, 1);
    assert_eq!(summary.counts.unknown_stack, 1);
    assert_eq!(summary.counts.kernels_call_without_stack, 1);
    assert_eq!(summary.counts.kernels_without_call, 1);

    let linear = figures(4, 5_500, 2, [0, 0, 0], 0, [30_000, 2]);
    let block = figures(3, 3_000, 2, [0, 512, 512], 1, [12_000, 2]);
    let no_layer = figures(5, 6_000, 1, [4096, 5120, 1024], 1, [3_000, 1]);
    let no_stack = figures(3, 4_000, 2, [0, 0, 0], 0, [5_000, 2]);
    assert_eq!(
        named(&summary.layers),
        [
            ("Linear", linear),
            ("Block", block),
            (NO_LAYER, no_layer),
            (NO_STACK, no_stack)
        ]
    );
    let layer = &summary.layers[1];
    assert_eq!(layer.function.as_deref(), Some("Block.forward"));
    assert_eq!(
        (layer.file.as_deref(), layer.first_line),
        (Some("/w/model.py"), Some(10))
    );

    let stack_2 = figures(2, 2_000, 1, [0, 512, 512], 1, [7_000, 1]);
    let stack_3 = figures(1, 1_000, 1, [0, 0, 0], 0, [5_000, 1]);
    let stack_4 = figures(4, 5_000, 0, [4096, 5120, 1024], 1, [0, 0]);
    let stack_5 = figures(1, 1_000, 1, [0, 0, 0], 0, [3_000, 1]);
    let linear_line = "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py:125";
    assert_eq!(
        named(&summary.lines),
        [
            (linear_line, linear),
            ("/w/model.py:14", stack_2),
            ("/w/model.py:33", stack_3),
            ("/usr/lib/python3.12/threading.py:1012", stack_5),
            ("/w/run.py:3", stack_4),
            (NO_STACK, no_stack),
        ]
    );
    let scale = &summary.lines[2];
    assert_eq!(
        (scale.function.as_deref(), scale.line, scale.first_line),
        (Some("Scale.forward"), Some(33), Some(31))
    );
    assert_eq!(
        named(&summary.user_lines),
        [
            ("/w/model.py:12", linear),
            ("/w/model.py:14", stack_2),
            ("/w/model.py:33", stack_3),
            ("/w/run.py:3", stack_4),
            (NO_USER_FRAME, stack_5),
            (NO_STACK, no_stack),
        ]
    );

    // Each column adds up to the trace's own figures.
    let total = summary.total;
    assert_eq!(
        total,
        figures(15, 18_500, 7, [4096, 5632, 1536], 2, [50_000, 7])
    );
    assert_eq!(total.calls, STACKS_CALLS);
    assert_eq!(total.calls, report.summary.calls);
    assert_eq!(total.launches, report.summary.kernel_launches);
    let time: u64 = report.summary.functions.iter().map(|f| f.total_ns).sum();
    assert_eq!(total.time_ns, time);
    let copied: u64 = report.summary.copies.iter().map(|c| c.bytes).sum();
    assert_eq!(total.copied_bytes, copied);
    assert_eq!(total.live_bytes, report.memory[0].final_device_bytes);
    let gpu: u64 = report.gpu.kernel_time.iter().map(|k| k.total_ns).sum();
    assert_eq!((total.gpu_ns, gpu), (STACKS_GPU_NS, STACKS_GPU_NS));
    for rows in [&summary.layers, &summary.lines, &summary.user_lines] {
        let mut sum = StackFigures::default();
        for row in rows {
            sum.add(&row.figures);
        }
        assert_eq!(sum, total);
    }
}

#[test]
fn leaks_name_their_allocating_stack() {
    let summarised = read(&stacks());
    let memory = &summarised.report.memory[0];
    let leaks: Vec<(u64, Option<u64>)> = memory.leaks.iter().map(|l| (l.bytes, l.stack)).collect();
    assert_eq!(leaks, [(1024, Some(4)), (512, Some(2))]);
    let json = serde_json::to_string(&memory.leaks[0]).unwrap();
    assert!(json.ends_with(r#","stack":4}"#), "{json}");
}

#[test]
fn a_trace_without_stacks_has_no_stacks_section() {
    let trace: String = stacks()
        .lines()
        .filter(|line| !line.contains(r#""type":"stack""#))
        .map(|line| {
            let line = line.replace(r#","stacks":{"families":["all"],"depth":64}"#, "");
            match line.find(r#","stack":"#) {
                Some(at) => format!("{}}}\n", &line[..at]),
                None => line + "\n",
            }
        })
        .collect();
    let summarised = read(&trace);
    assert!(summarised.report.stacks.is_none());
    assert!(summarised.report.live_by_stack.is_empty());
    assert!(
        summarised.report.memory[0]
            .leaks
            .iter()
            .all(|l| l.stack.is_none())
    );
}

/// A graph's kernels count where the launches captured into its nodes were made (their
/// stack), not where the graph was launched.
#[test]
fn graph_kernels_go_to_their_capture_sites_stack() {
    const MODULE: &str = "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py";
    let frame = |file: &str, qualname: &str, line: u32| {
        format!(r#"{{"file":"{file}","qualname":"{qualname}","line":{line},"first_line":1}}"#)
    };
    let call = |name: &str, ts: u64, extra: &str| {
        format!(
            r#"{{"type":"call","name":"{name}","pid":7,"tid":7,"ts_ns":{ts},"dur_ns":100,"ret":0{extra}}}"#
        )
    };
    let kernel = |ts: u64, dur: u64| {
        format!(
            r#"{{"type":"gpu_kernel","pid":7,"device":0,"context":1,"stream":7,"ts_ns":{ts},"dur_ns":{dur},"kernel":"k","grid":[1,1,1],"block":[1,1,1],"static_shared_mem":0,"dynamic_shared_mem":0,"registers_per_thread":8,"correlation_id":9,"graph_id":1,"graph_node_id":2,"call_tid":7,"call_ts_ns":3000,"capture_call_tid":7,"capture_call_ts_ns":2000}}"#
        )
    };
    let trace = [
        r#"{"type":"header","format":"cudatrace","version":4,"command":["python3","run.py"],"pids":[7],"start_monotonic_ns":1000,"probes":[],"gpu":{"library":"/tmp/x/l.so","libcupti":"/x/libcupti.so","libcupti_from":"--cupti"},"stacks":{"families":["all"],"depth":64}}"#.to_owned(),
        format!(
            r#"{{"type":"stack","id":1,"frames":[{},{},{},{}]}}"#,
            frame("/w/model.py", "Block.forward", 14),
            frame(MODULE, "Module._call_impl", 1784),
            frame(MODULE, "Module._wrapped_call_impl", 1773),
            frame("/w/run.py", "<module>", 5)
        ),
        format!(r#"{{"type":"stack","id":2,"frames":[{}]}}"#, frame("/w/run.py", "<module>", 9)),
        call("cuStreamBeginCapture_v2", 1500, r#","stream":"0x5","mode":0,"capture":1"#),
        call(
            "cuLaunchKernel",
            2000,
            r#","grid":[1,1,1],"block":[1,1,1],"stream":"0x5","function":"0x30","captured":1,"stack":1"#,
        ),
        call("cuGraphLaunch", 3000, r#","stream":"0x0","stack":2"#),
        kernel(4000, 4_000),
        kernel(9000, 6_000),
    ]
    .join("\n");
    let summarised = read(&trace);
    let summary = summarised.report.stacks.as_ref().unwrap().summary();
    let gpu: Vec<(&str, u64, u64)> = summary
        .layers
        .iter()
        .map(|row| {
            (
                row.name.as_str(),
                row.figures.gpu_ns,
                row.figures.gpu_kernels,
            )
        })
        .collect();
    assert_eq!(
        gpu,
        [("Block", 10_000, 2), (NO_LAYER, 0, 0), (NO_STACK, 0, 0)]
    );
    assert_eq!(summary.counts.kernels_without_call, 0);
}

#[test]
fn a_repeated_stack_id_is_counted_and_the_first_line_kept() {
    let text = stacks();
    let first_stack = text
        .lines()
        .find(|line| line.contains(r#""type":"stack""#))
        .unwrap();
    // The same id again, with other frames: ignored, counted.
    let repeated = first_stack.replace(r#""line":"#, r#""line":1000"#);
    let doubled = text.replacen(first_stack, &format!("{first_stack}\n{repeated}"), 1);
    let once = read(&text);
    let twice = read(&doubled);
    let (once, twice) = (
        once.report.stacks.as_ref().unwrap(),
        twice.report.stacks.as_ref().unwrap(),
    );
    assert_eq!(once.counts.duplicate_stack_ids, 0);
    assert_eq!(twice.counts.duplicate_stack_ids, 1);
    assert_eq!(twice.per_stack, once.per_stack);
    assert_eq!(twice.no_stack, once.no_stack);
}
