//! Layer entries: which calls join, which end them, and when they are drawn.

use super::{ExportStacks, LayerEntry};
use crate::{
    analysis::Role,
    schema::{CallLine, GpuKernelLine, GpuLink, Line, StackLine, parse},
};

const MODULE: &str = "/t/torch/nn/modules/module.py";

fn stack(id: u64, frames: &[(&str, &str, u32)]) -> StackLine {
    let frames: Vec<String> = frames
        .iter()
        .map(|(file, qualname, line)| {
            format!(r#"{{"file":"{file}","qualname":"{qualname}","line":{line},"first_line":1}}"#)
        })
        .collect();
    let text = format!(
        r#"{{"type":"stack","id":{id},"frames":[{}]}}"#,
        frames.join(",")
    );
    let Ok(Line::Stack(line)) = parse(text.as_bytes()) else {
        panic!("not a stack line")
    };
    *line
}

/// Stacks 1 and 2: `Linear` from `Net.forward` lines 5 and 6 (two instances); 3: `Net`
/// itself at line 7; 4: a line of the script, no layer.
fn stacks(gpu: bool) -> ExportStacks {
    let mut stacks = ExportStacks {
        gpu,
        ..ExportStacks::default()
    };
    let call = [(MODULE, "Module._call_impl", 10)];
    let net = |line| {
        [
            ("/w/m.py", "Net.forward", line),
            call[0],
            ("/w/m.py", "<module>", 1),
        ]
    };
    for (id, line) in [(1, 5), (2, 6)] {
        let mut frames = vec![("/t/torch/nn/modules/linear.py", "Linear.forward", 125)];
        frames.extend(call);
        frames.extend(net(line));
        stacks.stack_line(&stack(id, &frames));
    }
    stacks.stack_line(&stack(3, &net(7)));
    stacks.stack_line(&stack(4, &[("/w/m.py", "<module>", 2)]));
    stacks
}

fn call(name: &str, ts_ns: u64, stack: Option<u64>) -> CallLine {
    CallLine {
        name: name.into(),
        pid: 1,
        tid: 1,
        ts_ns,
        dur_ns: Some(10),
        ret: Some(0),
        kernel: Some("k".into()),
        stack,
        ..CallLine::default()
    }
}

fn kernel(call_ts_ns: u64, dur_ns: u64) -> GpuKernelLine {
    GpuKernelLine {
        pid: 1,
        dur_ns,
        link: GpuLink {
            call_tid: Some(1),
            call_ts_ns: Some(call_ts_ns),
            ..GpuLink::default()
        },
        ..GpuKernelLine::default()
    }
}

fn summary(entries: &[LayerEntry]) -> Vec<(&str, u64, u64, u64, u64, u64)> {
    entries
        .iter()
        .map(|e| {
            (
                e.name.as_str(),
                e.start_ns,
                e.end_ns,
                e.calls,
                e.launches,
                e.gpu_ns,
            )
        })
        .collect()
}

#[test]
fn an_entry_is_one_layer_instance_s_run_of_calls() {
    let mut stacks = stacks(false);
    let mut ready = Vec::new();
    stacks.call(
        &call("cuLaunchKernel", 100, Some(1)),
        Role::Launch,
        &mut ready,
    );
    // A call without a stack neither ends nor joins it.
    stacks.call(&call("cuCtxGetCurrent", 120, None), Role::Other, &mut ready);
    stacks.call(
        &call("cuLaunchKernel", 140, Some(1)),
        Role::Launch,
        &mut ready,
    );
    assert!(ready.is_empty());
    // Another instance (called from another line) ends it.
    stacks.call(
        &call("cuLaunchKernel", 200, Some(2)),
        Role::Launch,
        &mut ready,
    );
    // The parent layer, then a stack without a layer, end theirs.
    stacks.call(
        &call("cuMemAlloc_v2", 300, Some(3)),
        Role::DeviceAlloc,
        &mut ready,
    );
    stacks.call(
        &call("cuMemFree_v2", 400, Some(4)),
        Role::DeviceFree,
        &mut ready,
    );
    assert_eq!(
        summary(&ready),
        [
            ("Linear", 100, 150, 2, 2, 0),
            ("Linear", 200, 210, 1, 1, 0),
            ("Net", 300, 310, 1, 0, 0)
        ]
    );
    ready.clear();
    stacks.finish(&mut ready);
    assert!(ready.is_empty());
}

#[test]
fn with_gpu_an_entry_waits_for_its_launches_kernels() {
    let mut stacks = stacks(true);
    let mut ready = Vec::new();
    stacks.call(
        &call("cuLaunchKernel", 100, Some(1)),
        Role::Launch,
        &mut ready,
    );
    stacks.call(
        &call("cuGraphLaunch", 140, Some(1)),
        Role::GraphLaunch,
        &mut ready,
    );
    stacks.call(
        &call("cuLaunchKernel", 200, Some(3)),
        Role::Launch,
        &mut ready,
    );
    stacks.kernel(&kernel(140, 7), &mut ready);
    // The graph launch's second kernel still counts.
    stacks.kernel(&kernel(140, 8), &mut ready);
    assert!(ready.is_empty(), "the first launch's kernel has not come");
    stacks.kernel(&kernel(100, 5), &mut ready);
    assert_eq!(summary(&ready), [("Linear", 100, 150, 2, 1, 20)]);
    assert_eq!(ready[0].gpu_kernels, 3);
    ready.clear();
    // The open entry takes its kernel, and is drawn at the end with it.
    stacks.kernel(&kernel(200, 9), &mut ready);
    assert!(ready.is_empty());
    stacks.call(
        &call("cuLaunchKernel", 300, Some(4)),
        Role::Launch,
        &mut ready,
    );
    assert_eq!(summary(&ready), [("Net", 200, 210, 1, 1, 9)]);
    assert_eq!(ready[0].waiting, 0);
}

#[test]
fn at_the_end_entries_still_waiting_are_drawn_and_say_so() {
    let mut stacks = stacks(true);
    let mut ready = Vec::new();
    stacks.call(
        &call("cuLaunchKernel", 100, Some(1)),
        Role::Launch,
        &mut ready,
    );
    stacks.call(
        &call("cuLaunchKernel", 200, Some(2)),
        Role::Launch,
        &mut ready,
    );
    assert!(ready.is_empty());
    stacks.finish(&mut ready);
    let waiting: Vec<u64> = ready.iter().map(|e| e.waiting).collect();
    assert_eq!(waiting, [1, 1]);
    assert_eq!(stacks.launches.len(), 0, "their launches are forgotten");
}

#[test]
fn a_stack_is_written_innermost_first_each_called_from_the_next() {
    let mut stacks = stacks(false);
    assert_eq!(
        stacks.text(3),
        Some(
            "Net.forward (/w/m.py:7) ← Module._call_impl (/t/torch/nn/modules/module.py:10) ← <module> (/w/m.py:1)"
        )
    );
    assert_eq!(stacks.text(99), None);
}
