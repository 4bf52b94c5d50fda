//! Hand-written traces for the export and plot tests (no root needed). Also included by
//! the unit tests of `src/export` and `src/plot`, so both test the same traces.
#![allow(dead_code)]

use std::fmt::Write as _;

mod stacks;
#[allow(unused_imports, reason = "each test binary uses some of the traces")]
pub use stacks::*;

/// Tracing started at 1 ms on the monotonic clock; times in [`known`] are offsets from it.
pub const KNOWN_BASE_NS: u64 = 1_000_000;
/// Call lines of [`known`] (each becomes a slice), its driver lines, counter values
/// (the allocation and the free) and flows.
pub const KNOWN_CALLS: u64 = 14;
pub const KNOWN_DRIVER: u64 = 1;
pub const KNOWN_COUNTERS: u64 = 2;
pub const KNOWN_FLOWS: u64 = 5;
pub const KNOWN_LINES: u64 = 20;

/// pid 100 (threads 100 and 101) and pid 200. Launches 1, 2 and 3 on stream 0x10 flow to
/// the cuStreamSynchronize of 0x10; launch 4 on 0x20 is not synchronised by it: it and
/// launch 5 flow to cuCtxSynchronize; launch 6 (pid 200) is never synchronised; the failed
/// launch 7 starts no flow. A driver line, a lost line and a line of an unknown type too.
pub fn known() -> String {
    let base = KNOWN_BASE_NS;
    let call = |name: &str, pid: u32, tid: u32, offset: u64, dur: u64, extra: &str| {
        format!(
            r#"{{"type":"call","name":"{name}","pid":{pid},"tid":{tid},"ts_ns":{},"dur_ns":{dur},"ret":0{extra}}}"#,
            base + offset
        )
    };
    let launch = |offset: u64, stream: &str| {
        call(
            "cuLaunchKernel",
            100,
            100,
            offset,
            1_000,
            &format!(r#","grid":[4,1,1],"block":[128,1,1],"stream":"{stream}","function":"0x30""#),
        )
    };
    [
        format!(
            r#"{{"type":"header","format":"cudatrace","version":1,"command":["./app","--big"],"pids":[100],"start_monotonic_ns":{base},"probes":[{{"id":0,"symbol":"cuInit","function":"cuInit","family":"init"}}]}}"#
        ),
        format!(
            r#"{{"type":"process","event":"exec","pid":100,"tid":100,"ts_ns":{},"filename":"/bin/app"}}"#,
            base + 500
        ),
        call("cuInit", 100, 100, 1_000, 2_500, r#","flags":0"#),
        call(
            "cuMemAlloc_v2",
            100,
            100,
            5_000,
            1_000,
            r#","bytes":4194304,"dptr":"0x7f0000000000""#,
        ),
        call(
            "cuMemcpyHtoDAsync_v2",
            100,
            101,
            7_000,
            2_000,
            r#","kind":"HtoD","bytes":4194304,"src":"0x5000","dst":"0x7f0000000000","stream":"0x10""#,
        ),
        call(
            "cuModuleGetFunction",
            100,
            100,
            9_500,
            500,
            r#","function":"0x30","symbol":"_Z10vector_addPKfS0_Pfi","module":"0x20""#,
        ),
        launch(10_000, "0x10"),
        launch(12_000, "0x10"),
        launch(14_000, "0x10"),
        launch(16_000, "0x20"),
        call(
            "cuStreamSynchronize",
            100,
            100,
            18_000,
            3_000,
            r#","stream":"0x10""#,
        ),
        launch(22_000, "0x20"),
        call("cuCtxSynchronize", 100, 100, 24_000, 4_000, ""),
        call(
            "cuLaunchKernel",
            200,
            200,
            25_000,
            1_000,
            r#","stream":"0x0","function":"0x99""#,
        ),
        format!(
            r#"{{"type":"call","name":"cuLaunchKernel","pid":100,"tid":100,"ts_ns":{},"dur_ns":700,"ret":1,"ret_name":"CUDA_ERROR_INVALID_VALUE","stream":"0x10","function":"0x30"}}"#,
            base + 29_000
        ),
        format!(
            r#"{{"type":"lost","ts_ns":{},"reason":"ring_full","count":3,"total":3}}"#,
            base + 29_500
        ),
        call(
            "cuMemFree_v2",
            100,
            100,
            30_000,
            1_000,
            r#","dptr":"0x7f0000000000""#,
        ),
        format!(
            r#"{{"type":"driver","hook":"ioctl","pid":100,"tid":100,"ts_ns":{},"dur_ns":300,"ret":0,"escape":43,"escape_name":"NV_ESC_RM_ALLOC"}}"#,
            base + 5_200
        ),
        r#"{"type":"gpu_metrics","ts_ns":1}"#.to_owned(),
        r#"{"type":"footer"}"#.to_owned(),
    ]
    .join("\n")
        + "\n"
}

/// A header for [`inference`]: pid 42 running `python3 infer.py`.
pub const INFERENCE_HEADER: &str = r#"{"type":"header","format":"cudatrace","version":1,"command":["python3","infer.py"],"pids":[42],"start_monotonic_ns":1000}"#;
pub const FOOTER: &str = r#"{"type":"footer","lost":{"total":0},"exit_code":0}"#;

/// Call lines of [`inference`] with `iterations` iterations.
pub fn inference_calls(iterations: u64) -> u64 {
    4 * iterations + 22
}

/// The call lines of a run shaped like an inference script, for pid 42: set-up, 112 MiB
/// of weights, an input, `iterations` × (3 launches of 3 kernels on stream 0x77 and its
/// synchronisation), the output, cleanup.
pub fn inference(iterations: u64) -> String {
    let mut out = String::new();
    let mut ts = 10_000u64;
    let mut call = |out: &mut String, name: &str, dur: u64, extra: &str| {
        let _ = writeln!(
            out,
            r#"{{"type":"call","name":"{name}","pid":42,"tid":42,"ts_ns":{ts},"dur_ns":{dur},"ret":0{extra}}}"#
        );
        ts += dur + 500;
    };
    call(&mut out, "cuInit", 50_000, r#","flags":0"#);
    call(&mut out, "cuDeviceGet", 1_000, r#","device":0"#);
    call(
        &mut out,
        "cuDevicePrimaryCtxRetain",
        20_000,
        r#","context":"0x1","device":0"#,
    );
    call(&mut out, "cuCtxSetCurrent", 1_000, r#","context":"0x1""#);
    for (index, bytes) in [64u64 << 20, 32 << 20, 16 << 20].iter().enumerate() {
        call(
            &mut out,
            "cuMemAlloc_v2",
            5_000,
            &format!(r#","bytes":{bytes},"dptr":"0x7f{index:02}00000000""#),
        );
        call(
            &mut out,
            "cuMemcpyHtoD_v2",
            200_000,
            &format!(
                r#","kind":"HtoD","bytes":{bytes},"src":"0x5000","dst":"0x7f{index:02}00000000""#
            ),
        );
    }
    for (index, symbol) in ["_Z4gemmPfS_", "_Z4reluPf", "softmax_kernel"]
        .iter()
        .enumerate()
    {
        call(
            &mut out,
            "cuModuleGetFunction",
            3_000,
            &format!(
                r#","function":"0x{:x}","symbol":"{symbol}","module":"0x9""#,
                0x100 + index
            ),
        );
    }
    call(
        &mut out,
        "cuStreamCreate",
        2_000,
        r#","stream":"0x77","flags":0"#,
    );
    call(
        &mut out,
        "cuMemAlloc_v2",
        4_000,
        r#","bytes":1048576,"dptr":"0x7f1000000000""#,
    );
    call(
        &mut out,
        "cuMemcpyHtoDAsync_v2",
        3_000,
        r#","kind":"HtoD","bytes":1048576,"src":"0x6000","dst":"0x7f1000000000","stream":"0x77""#,
    );
    for _ in 0..iterations {
        for function in [0x100, 0x101, 0x102] {
            call(
                &mut out,
                "cuLaunchKernel",
                4_000,
                &format!(
                    r#","grid":[64,1,1],"block":[256,1,1],"shared_mem":0,"stream":"0x77","function":"0x{function:x}""#
                ),
            );
        }
        call(
            &mut out,
            "cuStreamSynchronize",
            30_000,
            r#","stream":"0x77""#,
        );
    }
    call(
        &mut out,
        "cuMemcpyDtoH_v2",
        8_000,
        r#","kind":"DtoH","bytes":4096,"src":"0x7f1000000000","dst":"0x6000""#,
    );
    for index in 0..3 {
        call(
            &mut out,
            "cuMemFree_v2",
            2_000,
            &format!(r#","dptr":"0x7f{index:02}00000000""#),
        );
    }
    call(
        &mut out,
        "cuMemFree_v2",
        2_000,
        r#","dptr":"0x7f1000000000""#,
    );
    call(
        &mut out,
        "cuDevicePrimaryCtxRelease_v2",
        9_000,
        r#","device":0"#,
    );
    out
}

/// A whole trace: the inference header, `body`, the footer.
pub fn with_header(body: &str) -> String {
    format!("{INFERENCE_HEADER}\n{body}{FOOTER}\n")
}

/// Samples in [`power`]: every 100 µs from the trace's start (ts 1000) for 2 ms.
pub const POWER_SAMPLES: u64 = 21;
/// Counter values [`power`] exports: GPU 0 gives 9 fields a sample (instant power
/// included), GPU 1 8 (no instant power; its energy is integrated).
pub const POWER_COUNTERS: u64 = POWER_SAMPLES * (9 + 8);

/// A `--power` trace of two GPUs: [`inference`] with 2 iterations (calls from ts 10 µs
/// to about 1.1 ms), sampled every 100 µs from ts 1000 for 2 ms. GPU 0 ("test GPU A")
/// draws 100 W and counts energy (10 mJ a sample, from 5000 mJ); GPU 1 ("test GPU B") draws
/// 250 W and has no energy counter.
pub fn power() -> String {
    let header = r#"{"type":"header","format":"cudatrace","version":1,"command":["python3","infer.py"],"pids":[42],"start_monotonic_ns":1000,"power":{"period_ms":1,"nvml":{"path":"/x/libnvidia-ml.so.1","version":"12.580","driver_version":"580.159.04","standin":false},"devices":[{"index":0,"name":"test GPU A","uuid":"GPU-a","power_limit_mw":700000,"energy_counter":true,"energy_source":"counter","unsupported":[]},{"index":1,"name":"test GPU B","uuid":"GPU-b","energy_counter":false,"energy_source":"integrated power","unsupported":["energy_mj: NOT_SUPPORTED","power_instant_mw: NOT_SUPPORTED"]}]}}"#;
    let mut out = format!("{header}\n");
    let body = inference(2);
    let mut calls = body.lines().peekable();
    let ts_of = |line: &str| -> u64 {
        let at = line.find("\"ts_ns\":").expect("a call line") + 8;
        let digits: String = line[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    for seq in 0..POWER_SAMPLES {
        let ts = 1000 + seq * 100_000;
        // The calls before this sample first, as the tracer would write them.
        while let Some(line) = calls.next_if(|line| ts_of(line) < ts) {
            out.push_str(line);
            out.push('\n');
        }
        let _ = writeln!(
            out,
            r#"{{"type":"power","device":0,"seq":{seq},"ts_ns":{ts},"read_ns":40000,"power_mw":100000,"power_instant_mw":100000,"energy_mj":{},"sm_clock_mhz":1980,"mem_clock_mhz":2619,"gpu_util_pct":{},"mem_util_pct":17,"temperature_c":60,"memory_used_bytes":1048576}}"#,
            5000 + seq * 10,
            seq * 5
        );
        let _ = writeln!(
            out,
            r#"{{"type":"power","device":1,"seq":{seq},"ts_ns":{ts},"read_ns":30000,"power_mw":250000,"sm_clock_mhz":1410,"mem_clock_mhz":1593,"gpu_util_pct":0,"mem_util_pct":0,"temperature_c":40,"memory_used_bytes":0}}"#
        );
    }
    for line in calls {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(FOOTER);
    out.push('\n');
    out
}

/// `--gpu`: tracing started at 1 ms, like [`known`]; times in [`gpu`] are offsets from it.
pub const GPU_BASE_NS: u64 = 1_000_000;
/// [`gpu`]'s call lines, GPU work lines, and work lines linked to a call.
pub const GPU_CALLS: u64 = 11;
pub const GPU_WORK: u64 = 7;
pub const GPU_LINKED: u64 = 6;

/// A `--gpu` trace of pid 300 (threads 300 and 301) with known figures. GPU work (device
/// 0; stream 13 for 0x10, 14 for 0x20), each line after its call as `run` writes them:
///
/// | work | GPU time | call |
/// |---|---|---|
/// | HtoD copy, 1 MiB | 7,500 + 2,000 | cuMemcpyHtoDAsync_v2 at 6,000 |
/// | memset, 4,000 B | 9,600 + 400 | cuMemsetD32Async at 9,000 |
/// | vector_add (A) | 11,500 + 5,000 | cuLaunchKernel at 10,000 |
/// | vector_add (B) | 16,500 + 3,000 | cuLaunchKernel at 12,000 |
/// | gemm (C), stream 14 | 15,500 + 2,000 | cuLaunchKernel at 14,000, thread 301 |
/// | DtoH copy, 4,096 B | 62,000 + 1,000 | cuMemcpyDtoHAsync_v2 at 60,000 |
/// | vector_add (D) | 64,000 + 500 | none: `no_api_record` |
///
/// Busy: 7,500-9,500, 9,600-10,000, 11,500-19,500, 62,000-63,000, 64,000-64,500: 11,900 ns
/// of the run's 70,000 (1,000 to 71,000). Idle gaps: 42,500 at 19,500 (the CPU in
/// cuStreamSynchronize 20,000-50,000 and cuMemcpyDtoHAsync_v2 60,000-61,000), 1,500 at
/// 10,000, 1,000 at 63,000, 100 at 9,500. Queueing: 500, 100, 500, 3,500, -200, 1,000.
pub fn gpu() -> String {
    let base = GPU_BASE_NS;
    let call = |name: &str, tid: u32, offset: u64, dur: u64, extra: &str| {
        format!(
            r#"{{"type":"call","name":"{name}","pid":300,"tid":{tid},"ts_ns":{},"dur_ns":{dur},"ret":0{extra}}}"#,
            base + offset
        )
    };
    let launch = |tid: u32, offset: u64, stream: &str, function: &str| {
        call(
            "cuLaunchKernel",
            tid,
            offset,
            1_000,
            &format!(
                r#","grid":[4,1,1],"block":[128,1,1],"stream":"{stream}","function":"{function}""#
            ),
        )
    };
    let link = |correlation: u32, tid: u32, call_offset: u64, queued: i64| {
        format!(
            r#""correlation_id":{correlation},"call_tid":{tid},"call_ts_ns":{},"queued_ns":{queued}"#,
            base + call_offset
        )
    };
    let kernel = |offset: u64, dur: u64, stream: u32, name: &str, mangled: &str, link: &str| {
        format!(
            r#"{{"type":"gpu_kernel","pid":300,"device":0,"context":1,"stream":{stream},"ts_ns":{},"dur_ns":{dur},"kernel":"{name}","kernel_mangled":"{mangled}","grid":[4,1,1],"block":[128,1,1],"static_shared_mem":0,"dynamic_shared_mem":0,"registers_per_thread":32,{link}}}"#,
            base + offset
        )
    };
    let vector_add = "vector_add(float const*, float const*, float*, int)";
    [
        format!(
            r#"{{"type":"header","format":"cudatrace","version":1,"command":["python3","train.py"],"pids":[300],"start_monotonic_ns":{base},"probes":[],"gpu":{{"library":"/tmp/cudatrace-gpu-x/libcudatrace_inject.so","libcupti":"/x/libcupti.so.13","libcupti_from":"--cupti"}}}}"#
        ),
        call("cuInit", 300, 1_000, 2_000, r#","flags":0"#),
        format!(
            r#"{{"type":"gpu_info","pid":300,"ts_ns":{},"cupti_version":130001,"libcupti":"/x/libcupti.so.13","clock":"monotonic"}}"#,
            base + 2_500
        ),
        call(
            "cuMemAlloc_v2",
            300,
            4_000,
            1_000,
            r#","bytes":1048576,"dptr":"0x7f0000000000""#,
        ),
        call(
            "cuMemcpyHtoDAsync_v2",
            300,
            6_000,
            1_000,
            r#","kind":"HtoD","bytes":1048576,"src":"0x5000","dst":"0x7f0000000000","stream":"0x10""#,
        ),
        call(
            "cuModuleGetFunction",
            300,
            8_000,
            500,
            r#","function":"0x30","symbol":"_Z10vector_addPKfS0_Pfi","module":"0x20""#,
        ),
        call(
            "cuMemsetD32Async",
            300,
            9_000,
            500,
            r#","dptr":"0x7f0000000000","value":0,"count":1000,"bytes":4000,"stream":"0x10""#,
        ),
        launch(300, 10_000, "0x10", "0x30"),
        launch(300, 12_000, "0x10", "0x30"),
        launch(301, 14_000, "0x20", "0x40"),
        format!(
            r#"{{"type":"gpu_copy","pid":300,"device":0,"context":1,"stream":13,"ts_ns":{},"dur_ns":2000,"kind":"HtoD","bytes":1048576,"src_kind":"pageable","dst_kind":"device","async":true,{}}}"#,
            base + 7_500,
            link(1, 300, 6_000, 500)
        ),
        format!(
            r#"{{"type":"gpu_memset","pid":300,"device":0,"context":1,"stream":13,"ts_ns":{},"dur_ns":400,"bytes":4000,"value":0,"memory":"device","async":true,{}}}"#,
            base + 9_600,
            link(2, 300, 9_000, 100)
        ),
        kernel(
            11_500,
            5_000,
            13,
            vector_add,
            "_Z10vector_addPKfS0_Pfi",
            &link(3, 300, 10_000, 500),
        ),
        kernel(15_500, 2_000, 14, "gemm()", "_Z4gemmv", &link(5, 301, 14_000, -200)),
        kernel(
            16_500,
            3_000,
            13,
            vector_add,
            "_Z10vector_addPKfS0_Pfi",
            &link(4, 300, 12_000, 3_500),
        ),
        call("cuStreamSynchronize", 300, 20_000, 30_000, r#","stream":"0x10""#),
        call(
            "cuMemcpyDtoHAsync_v2",
            300,
            60_000,
            1_000,
            r#","kind":"DtoH","bytes":4096,"src":"0x7f0000000000","dst":"0x6000","stream":"0x10""#,
        ),
        call(
            "cuMemFree_v2",
            300,
            70_000,
            1_000,
            r#","dptr":"0x7f0000000000""#,
        ),
        format!(
            r#"{{"type":"gpu_copy","pid":300,"device":0,"context":1,"stream":13,"ts_ns":{},"dur_ns":1000,"kind":"DtoH","bytes":4096,"src_kind":"device","dst_kind":"pageable","async":true,{}}}"#,
            base + 62_000,
            link(6, 300, 60_000, 1_000)
        ),
        kernel(
            64_000,
            500,
            13,
            vector_add,
            "_Z10vector_addPKfS0_Pfi",
            r#""correlation_id":7,"unlinked":"no_api_record""#,
        ),
        r#"{"type":"footer","lost":{"total":0},"exit_code":0}"#.to_owned(),
    ]
    .join("\n")
        + "\n"
}

/// A `--gpu` trace whose GPU work starts, and is half done, before the middle of the call
/// that issued it (as the stand-in's work did in a recorded run): a memset call at 9,000 for
/// 2,000 ns, its memset at 9,200 for 400; a launch at 12,000 for 1,000, its kernel `k()`
/// at 12,100 for 200; the stream synchronised at 20,000.
pub fn gpu_early_work() -> String {
    let base = GPU_BASE_NS;
    let link = |correlation: u32, call_offset: u64| {
        format!(
            r#""correlation_id":{correlation},"call_tid":300,"call_ts_ns":{},"queued_ns":0"#,
            base + call_offset
        )
    };
    [
        format!(
            r#"{{"type":"header","format":"cudatrace","version":1,"command":["python3","early.py"],"pids":[300],"start_monotonic_ns":{base},"probes":[],"gpu":{{"library":"/tmp/cudatrace-gpu-x/libcudatrace_inject.so","libcupti":"/x/libcupti.so.13","libcupti_from":"--cupti"}}}}"#
        ),
        format!(
            r#"{{"type":"call","name":"cuMemsetD32Async","pid":300,"tid":300,"ts_ns":{},"dur_ns":2000,"ret":0,"dptr":"0x7f0000000000","value":0,"count":100,"bytes":400,"stream":"0x10"}}"#,
            base + 9_000
        ),
        format!(
            r#"{{"type":"call","name":"cuLaunchKernel","pid":300,"tid":300,"ts_ns":{},"dur_ns":1000,"ret":0,"grid":[1,1,1],"block":[32,1,1],"stream":"0x10","function":"0x30"}}"#,
            base + 12_000
        ),
        format!(
            r#"{{"type":"gpu_memset","pid":300,"device":0,"context":1,"stream":13,"ts_ns":{},"dur_ns":400,"bytes":400,"value":0,"memory":"device","async":true,{}}}"#,
            base + 9_200,
            link(1, 9_000)
        ),
        format!(
            r#"{{"type":"gpu_kernel","pid":300,"device":0,"context":1,"stream":13,"ts_ns":{},"dur_ns":200,"kernel":"k()","kernel_mangled":"_Z1kv","grid":[1,1,1],"block":[32,1,1],"static_shared_mem":0,"dynamic_shared_mem":0,"registers_per_thread":16,{}}}"#,
            base + 12_100,
            link(2, 12_000)
        ),
        format!(
            r#"{{"type":"call","name":"cuStreamSynchronize","pid":300,"tid":300,"ts_ns":{},"dur_ns":1000,"ret":0,"stream":"0x10"}}"#,
            base + 20_000
        ),
        r#"{"type":"footer","lost":{"total":0},"exit_code":0}"#.to_owned(),
    ]
    .join("\n")
        + "\n"
}

/// [`gpu`] with `--power` samples of its one GPU ("test GPU A", 1000 W, with an energy
/// counter): every 10 µs from the start (offsets 0 to 80,000: 9 samples), 10 mJ apart.
///
/// By GPU time, interval 10,000-20,000 goes to vector_add A (5,000 ns of its 10,000 ns of
/// kernel time), gemm (2,000) and vector_add B (3,000): 5, 2 and 3 mJ; 60,000-70,000 to
/// vector_add D, alone: 10 mJ. The six other intervals ran no kernel (the copies and the
/// memset are not kernels): 60 mJ idle. vector_add: 18 mJ, 3 runs, 8,500 ns; gemm: 2 mJ.
pub fn gpu_power() -> String {
    let power = r#","power":{"period_ms":1,"nvml":{"path":"/x/libnvidia-ml.so.1","version":"12.580","driver_version":"580.159.04","standin":false},"devices":[{"index":0,"name":"test GPU A","uuid":"GPU-a","power_limit_mw":700000,"energy_counter":true,"energy_source":"counter","unsupported":[]}]}}"#;
    let mut lines: Vec<String> = gpu().lines().map(str::to_owned).collect();
    let header = lines[0]
        .strip_suffix('}')
        .expect("a JSON object")
        .to_owned();
    lines[0] = format!("{header}{power}");
    let footer = lines.pop().expect("the footer");
    for seq in 0..9u64 {
        lines.push(format!(
            r#"{{"type":"power","device":0,"seq":{seq},"ts_ns":{},"read_ns":20000,"power_mw":1000000,"energy_mj":{}}}"#,
            GPU_BASE_NS + seq * 10_000,
            7000 + seq * 10
        ));
    }
    lines.push(footer);
    lines.join("\n") + "\n"
}

/// A `--gpu` trace of NCCL calls, pid 7, rank 1 of 2 on communicator `aaaa…` (first
/// seen after a call): an all-reduce with its kernel (the kernel's line before the
/// call's); a group of an all-reduce (100 B) and a broadcast (300 B) whose one kernel
/// (8,000 ns) is launched in `ncclGroupEnd`; `ncclBcast` running as `ncclBroadcast`
/// inside it; a send; a failed all-reduce.
pub fn nccl_gpu() -> String {
    let call = |name: &str, ts: u64, dur: u64, extra: &str| {
        format!(
            r#"{{"type":"call","name":"{name}","pid":7,"tid":7,"ts_ns":{ts},"dur_ns":{dur},"ret":0{extra}}}"#
        )
    };
    let comm = r#","comm":"0x100""#;
    let kernel = |launch_ts: u64, ts: u64, dur: u64| {
        format!(
            r#"{{"type":"gpu_kernel","pid":7,"device":0,"context":1,"stream":13,"ts_ns":{ts},"dur_ns":{dur},"kernel":"ncclDevKernel_Generic","grid":[2,1,1],"block":[512,1,1],"correlation_id":3,"call_tid":7,"call_ts_ns":{launch_ts}}}"#
        )
    };
    let unique_id = "aa".repeat(32);
    [
        r#"{"type":"header","format":"cudatrace","version":3,"host":"node-a","start_wall":"2026-11-26T10:00:00Z","start_wall_ns":1795600000000000000,"start_monotonic_ns":1000000,"pids":[7],"gpu":{"library":"inject.so"}}"#
            .to_owned(),
        call("cuInit", 1_100_000, 10, ""),
        call(
            "ncclCommInitRank",
            1_200_000,
            100,
            &format!(r#","comm":"0x100","unique_id":"{unique_id}","rank":1,"nranks":2"#),
        ),
        call("cuLaunchKernel", 2_000_050, 10, r#","function":"0x30""#),
        // A kernel before its collective's line: kept until the line comes.
        kernel(2_000_050, 2_100_000, 5_000),
        call(
            "ncclAllReduce",
            2_000_000,
            100,
            &format!(r#"{comm},"count":256,"datatype":"float32","bytes":1024,"op":"sum""#),
        ),
        call("ncclGroupStart", 3_000_000, 5, ""),
        call("ncclAllReduce", 3_000_100, 10, &format!(r#"{comm},"bytes":100"#)),
        call(
            "ncclBroadcast",
            3_000_200,
            10,
            &format!(r#"{comm},"bytes":300,"root":0"#),
        ),
        call("cuLaunchKernel", 3_000_350, 10, r#","function":"0x30""#),
        call("ncclGroupEnd", 3_000_300, 100, ""),
        call("ncclBroadcast", 4_000_010, 20, &format!(r#"{comm},"bytes":64"#)),
        call("ncclBcast", 4_000_000, 50, &format!(r#"{comm},"bytes":64"#)),
        call("ncclSend", 5_000_000, 10, &format!(r#"{comm},"bytes":8,"peer":0"#)),
        format!(
            r#"{{"type":"call","name":"ncclAllReduce","pid":7,"tid":7,"ts_ns":6000000,"dur_ns":10,"ret":4,"ret_name":"ncclInvalidArgument"{comm}}}"#
        ),
        kernel(3_000_350, 3_100_000, 8_000),
        r#"{"type":"footer","calls_by_name":{"ncclCommInitRank":1}}"#.to_owned(),
    ]
    .join("\n")
}

/// Host names and the wall clock's offset (`start_wall_ns - start_monotonic_ns`) of
/// [`job_rank`]'s two traces: two machines whose monotonic clocks differ.
pub const JOB_HOSTS: [(&str, u64); 2] = [
    ("host-a", 1_795_600_000_000_000_000),
    ("host-b", 1_795_600_000_000_000_000 - 7_000_000_000),
];
/// When each rank arrives at each of [`job_rank`]'s four all-reduces, in ns after
/// 1795600010000000000 on the wall clock: rank 1 is 50 ms late to the first and third,
/// rank 0 1 ms late to the second and fourth.
pub const JOB_ARRIVALS: [[u64; 4]; 2] = [
    [0, 1_001_000_000, 2_000_000_000, 3_001_000_000],
    [50_000_000, 1_000_000_000, 2_050_000_000, 3_000_000_000],
];

/// One rank's trace of a two-rank job (pid 1000 + rank): a communicator made with
/// unique id `0102…`, then four all-reduces of 1 MiB at [`JOB_ARRIVALS`].
pub fn job_rank(rank: usize) -> String {
    let (host, offset) = JOB_HOSTS[rank];
    let pid = 1000 + rank;
    let monotonic = |wall_after: u64| 1_795_600_010_000_000_000 + wall_after - offset;
    let call = |name: &str, ts: u64, extra: &str| {
        format!(
            r#"{{"type":"call","name":"{name}","pid":{pid},"tid":{pid},"ts_ns":{ts},"dur_ns":20000,"ret":0,"comm":"0x5000"{extra}}}"#
        )
    };
    let unique_id: String = (1..=32).map(|b| format!("{b:02x}")).collect();
    let mut lines = vec![
        format!(
            r#"{{"type":"header","format":"cudatrace","version":3,"host":"{host}","start_wall":"2026-11-26T10:00:00Z","start_wall_ns":{},"start_monotonic_ns":{},"pids":[{pid}]}}"#,
            offset + 5_000_000_000,
            5_000_000_000_u64,
        ),
        call(
            "ncclCommInitRank",
            monotonic(0) - 1_000_000,
            &format!(r#","unique_id":"{unique_id}","rank":{rank},"nranks":2"#),
        ),
    ];
    for arrival in JOB_ARRIVALS[rank] {
        lines.push(call(
            "ncclAllReduce",
            monotonic(arrival),
            r#","count":262144,"datatype":"float32","bytes":1048576,"op":"sum""#,
        ));
    }
    lines.push(r#"{"type":"footer","calls_by_name":{"ncclCommInitRank":1}}"#.to_owned());
    lines.join("\n") + "\n"
}
