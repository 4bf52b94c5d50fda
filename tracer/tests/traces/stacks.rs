//! A `--stacks --gpu` trace whose every figure is known: Python stacks of a small model
//! (`Net` → `Block` → `Linear`, an autograd `Scale` inside `Block`), a script's own line,
//! a thread without a layer or user frame, calls without stacks and kernels of each.
//!
//! | stack | innermost frame | layer | user's line | calls | time ns | launches | copied | allocated | live | GPU ns (kernels) |
//! |---|---|---|---|---|---|---|---|---|---|---|
//! | 1 | linear.py:125 | Linear | model.py:12 | 4 | 5,500 | 2 | | | | 30,000 (2) |
//! | 2 | model.py:14 | Block | model.py:14 | 2 | 2,000 | 1 | | 512 | 512 | 7,000 (1) |
//! | 3 | model.py:33 (`Scale.forward`) | Block | model.py:33 | 1 | 1,000 | 1 | | | | 5,000 (1) |
//! | 4 | run.py:3 | (no layer) | run.py:3 | 4 | 5,000 | | 4,096 | 5,120 | 1,024 | |
//! | 5 (cut) | threading.py:1012 | (no layer) | (no user frame) | 1 | 1,000 | 1 | | | | 3,000 (1) |
//! | none | | | | 3 | 4,000 | 2 | | | | 5,000 (2) |
//!
//! "none": `cuInit`, a launch of a thread without Python (tid 502) whose kernel ran 4,000
//! ns, and a launch naming stack 99, which the trace lacks; plus a kernel linked to no
//! call (1,000 ns). Totals: 15 calls, 18,500 ns, 7 launches, 4,096 B copied, 5,632 B
//! allocated, 1,536 B live, 50,000 ns of GPU time in 7 kernels.

/// Tracing started here; offsets below are from it.
pub const STACKS_BASE_NS: u64 = 1_000_000;
pub const STACKS_CALLS: u64 = 15;
pub const STACKS_GPU_NS: u64 = 50_000;

const MODULE: &str = "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py";
const LINEAR: &str = "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py";

fn frame(file: &str, qualname: &str, line: u32, first_line: u32) -> String {
    format!(
        r#"{{"file":"{file}","qualname":"{qualname}","line":{line},"first_line":{first_line}}}"#
    )
}

/// `Module.__call__`'s two frames.
fn module_call() -> [String; 2] {
    [
        frame(MODULE, "Module._call_impl", 1784, 1773),
        frame(MODULE, "Module._wrapped_call_impl", 1773, 1771),
    ]
}

/// The frames from `Block.forward` at `line` outward.
fn in_block(line: u32) -> Vec<String> {
    let mut frames = vec![frame("/w/model.py", "Block.forward", line, 10)];
    frames.extend(module_call());
    frames.push(frame("/w/model.py", "Net.forward", 22, 20));
    frames.extend(module_call());
    frames.push(frame("/w/run.py", "<module>", 5, 1));
    frames
}

fn stack(id: u64, frames: &[String], cut: bool) -> String {
    format!(
        r#"{{"type":"stack","id":{id},"frames":[{}]{}}}"#,
        frames.join(","),
        if cut { r#","cut":true"# } else { "" }
    )
}

/// The trace (see the module's table).
pub fn stacks() -> String {
    let base = STACKS_BASE_NS;
    let call = |name: &str, tid: u32, offset: u64, dur: u64, extra: &str| {
        format!(
            r#"{{"type":"call","name":"{name}","pid":500,"tid":{tid},"ts_ns":{},"dur_ns":{dur},"ret":0{extra}}}"#,
            base + offset
        )
    };
    let launch = |tid: u32, offset: u64, stack: &str| {
        call(
            "cuLaunchKernel",
            tid,
            offset,
            1_000,
            &format!(
                r#","grid":[4,1,1],"block":[128,1,1],"stream":"0x0","function":"0x30"{stack}"#
            ),
        )
    };
    let kernel = |offset: u64, dur: u64, link: &str| {
        format!(
            r#"{{"type":"gpu_kernel","pid":500,"device":0,"context":1,"stream":7,"ts_ns":{},"dur_ns":{dur},"kernel":"gemm()","kernel_mangled":"_Z4gemmv","grid":[4,1,1],"block":[128,1,1],"static_shared_mem":0,"dynamic_shared_mem":0,"registers_per_thread":32,{link}}}"#,
            base + offset
        )
    };
    let link = |tid: u32, call_offset: u64| {
        format!(
            r#""correlation_id":1,"call_tid":{tid},"call_ts_ns":{}"#,
            base + call_offset
        )
    };
    let mut linear = vec![frame(LINEAR, "Linear.forward", 125, 124)];
    linear.extend(module_call());
    linear.extend(in_block(12));
    let mut scale = vec![frame("/w/model.py", "Scale.forward", 33, 31)];
    scale.extend(in_block(13));
    [
        format!(
            r#"{{"type":"header","format":"cudatrace","version":2,"command":["python3","run.py"],"pids":[500],"start_monotonic_ns":{base},"probes":[],"gpu":{{"library":"/tmp/x/libcudatrace_inject.so","libcupti":"/x/libcupti.so.13","libcupti_from":"--cupti"}},"stacks":{{"families":["all"],"depth":64}}}}"#
        ),
        format!(
            r#"{{"type":"interpreter","pid":500,"ts_ns":{},"path":"/usr/bin/python3.12","python":"3.12.3","stacks":true}}"#,
            base + 100
        ),
        call("cuInit", 500, 1_000, 2_000, r#","flags":0"#),
        stack(4, &[frame("/w/run.py", "<module>", 3, 1)], false),
        call("cuMemAlloc_v2", 500, 4_000, 1_000, r#","bytes":4096,"dptr":"0xa000","stack":4"#),
        call("cuMemAlloc_v2", 500, 6_000, 1_000, r#","bytes":1024,"dptr":"0xb000","stack":4"#),
        call(
            "cuMemcpyHtoDAsync_v2",
            500,
            8_000,
            2_000,
            r#","kind":"HtoD","bytes":4096,"src":"0x5000","dst":"0xa000","stream":"0x0","stack":4"#,
        ),
        stack(1, &linear, false),
        launch(500, 11_000, r#","stack":1"#),
        launch(500, 13_000, r#","stack":1"#),
        stack(3, &scale, false),
        launch(500, 15_000, r#","stack":3"#),
        stack(2, &in_block(14), false),
        launch(500, 17_000, r#","stack":2"#),
        call("cuMemAlloc_v2", 500, 19_000, 1_000, r#","bytes":512,"dptr":"0xc000","stack":2"#),
        format!(
            r#"{{"type":"call","name":"cuLaunchKernel","pid":500,"tid":500,"ts_ns":{},"dur_ns":500,"ret":1,"ret_name":"CUDA_ERROR_INVALID_VALUE","stream":"0x0","function":"0x30","stack":1}}"#,
            base + 21_000
        ),
        stack(
            5,
            &[frame("/usr/lib/python3.12/threading.py", "Thread.run", 1012, 999)],
            true,
        ),
        launch(501, 22_000, r#","stack":5"#),
        launch(502, 24_000, ""),
        call("cuStreamSynchronize", 500, 26_000, 3_000, r#","stream":"0x0","stack":1"#),
        kernel(12_000, 10_000, &link(500, 11_000)),
        kernel(22_000, 20_000, &link(500, 13_000)),
        kernel(42_000, 5_000, &link(500, 15_000)),
        kernel(47_000, 7_000, &link(500, 17_000)),
        kernel(54_000, 3_000, &link(501, 22_000)),
        kernel(57_000, 4_000, &link(502, 24_000)),
        kernel(61_000, 1_000, r#""correlation_id":9,"unlinked":"no_api_record""#),
        call("cuMemFree_v2", 500, 30_000, 1_000, r#","dptr":"0xa000","stack":4"#),
        launch(500, 32_000, r#","stack":99"#),
        r#"{"type":"footer"}"#.to_owned(),
    ]
    .join("\n")
        + "\n"
}

/// A `--stacks` trace (no `--gpu`) whose frames have the names Python gives code that is
/// no function of its own, a cuMemAlloc of its own duration under each stack:
///
/// | stack | frames, innermost first | ns |
/// |---|---|---|
/// | 1 | `<listcomp>` run.py:8, `<module>` run.py:8 | 1,000 |
/// | 2 | `<genexpr>` data.py:4, `<module>` data.py:4, `<module>` run.py:2 | 2,000 |
/// | 3 | `<lambda>` run.py:6, `<module>` run.py:6 | 3,000 |
/// | 4 | `Trainer.fit.<locals>.<lambda>` train.py:20, `Trainer.fit` train.py:21, `<module>` run.py:10 | 4,000 |
/// | 5 | `aot_module_simplified.<locals>.forward` aot_autograd.py:1100, `<module>` run.py:12 | 5,000 |
/// | 6 | `<dictcomp>` run.py:14, `<module>` run.py:14 | 6,000 |
/// | 7 | `<module>` run.py:3 | 7,000 |
pub fn python_names() -> String {
    let base = STACKS_BASE_NS;
    let run = |line: u32| frame("/w/run.py", "<module>", line, 1);
    let aot = "/venv/lib/python3.12/site-packages/torch/_functorch/aot_autograd.py";
    let stacks: [Vec<String>; 7] = [
        vec![frame("/w/run.py", "<listcomp>", 8, 8), run(8)],
        vec![
            frame("/w/data.py", "<genexpr>", 4, 4),
            frame("/w/data.py", "<module>", 4, 1),
            run(2),
        ],
        vec![frame("/w/run.py", "<lambda>", 6, 6), run(6)],
        vec![
            frame("/w/train.py", "Trainer.fit.<locals>.<lambda>", 20, 20),
            frame("/w/train.py", "Trainer.fit", 21, 18),
            run(10),
        ],
        vec![
            frame(aot, "aot_module_simplified.<locals>.forward", 1100, 1090),
            run(12),
        ],
        vec![frame("/w/run.py", "<dictcomp>", 14, 14), run(14)],
        vec![run(3)],
    ];
    let mut lines = vec![
        format!(
            r#"{{"type":"header","format":"cudatrace","version":2,"command":["python3","run.py"],"pids":[500],"start_monotonic_ns":{base},"probes":[],"stacks":{{"families":["all"],"depth":64}}}}"#
        ),
        format!(
            r#"{{"type":"interpreter","pid":500,"ts_ns":{},"path":"/usr/bin/python3.12","python":"3.12.3","stacks":true}}"#,
            base + 100
        ),
    ];
    for (index, frames) in stacks.iter().enumerate() {
        let id = index as u64 + 1;
        lines.push(stack(id, frames, false));
        lines.push(format!(
            r#"{{"type":"call","name":"cuMemAlloc_v2","pid":500,"tid":500,"ts_ns":{},"dur_ns":{},"ret":0,"bytes":256,"dptr":"0x{:x}","stack":{id}}}"#,
            base + id * 10_000,
            id * 1_000,
            0xa000 + id * 0x1000
        ));
    }
    lines.push(r#"{"type":"footer"}"#.to_owned());
    lines.join("\n") + "\n"
}
