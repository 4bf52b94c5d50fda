//! `--power --gpu`: energy per kernel by GPU time. The hand-written `traces::gpu_power()`
//! (no root), whose every figure is known, and root runs of the stand-in libcupti (NOT
//! NVIDIA's CUPTI: a kernel runs gridX·gridY·gridZ ns after its call) and the stand-in
//! libnvidia-ml (NOT NVIDIA's NVML: constant power, an energy counter on CLOCK_MONOTONIC)
//! together.

mod common;
mod traces;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use common::{gpu::cupti_standin, power::*, *};
use serde_json::{Value, json};

fn summary(trace: &Path, json: bool) -> Output {
    let mut command = Command::new(CUDATRACE);
    command.arg("summary");
    if json {
        command.arg("--json");
    }
    let output = command.arg(trace).output().expect("running cudatrace");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    output
}

fn summary_json(trace: &Path) -> Value {
    serde_json::from_slice(&summary(trace, true).stdout).unwrap()
}

fn summary_text(trace: &Path) -> String {
    String::from_utf8(summary(trace, false).stdout).unwrap()
}

/// (kernel, energy J, runs, GPU time ns) of the summary's `power.kernels`, in its order.
fn kernel_rows(json: &Value) -> Vec<(String, f64, u64, u64)> {
    json["power"]["kernels"]["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["kernel"].as_str().unwrap().to_owned(),
                k["energy_j"].as_f64().unwrap(),
                k["launches"].as_u64().unwrap(),
                k["window_ns"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_power_gpu_trace_gives_each_kernel_the_energy_of_its_gpu_time() {
    let trace = scratch("power-gpu-readers").join("trace.jsonl");
    std::fs::write(&trace, traces::gpu_power()).unwrap();
    let json = summary_json(&trace);
    let kernels = &json["power"]["kernels"];
    assert_eq!(
        (&kernels["method"], &kernels["estimate"]),
        (&json!("GPU time (--gpu)"), &json!(false))
    );
    let vector_add = "vector_add(float const*, float const*, float*, int)";
    assert_eq!(
        kernel_rows(&json),
        [
            (vector_add.to_owned(), 0.018, 3, 8_500),
            ("gemm()".to_owned(), 0.002, 1, 2_000),
        ]
    );
    assert_eq!(kernels["outside_windows_j"], 0.06);
    assert_eq!(json["power"]["energy_j"], 0.08);
    assert_eq!(
        kernels["devices"],
        json!([{"cuda_device": 0, "nvml_index": 0, "how": "the only GPU NVML sees", "assumed": false}])
    );
    assert_eq!(kernels.get("unsampled_ns"), None);
    assert_eq!(kernels.get("late_ns"), None);

    let text = summary_text(&trace);
    let section = &text[text.find("Energy by kernel name").expect("the section")..];
    assert_eq!(
        section,
        "Energy by kernel name (2 kernels), GPU time (--gpu)\n  \
         each sample interval's energy goes to the kernels that ran in it, by their GPU time \
         in it (docs/power.md)\n  \
         CUDA device 0 = NVML GPU 0 (the only GPU NVML sees)\n        \
         energy   share      runs    GPU time  kernel\n       \
         0.018 J   22.5%         3      8.5 µs  vector_add(float const*, float const*, float*, int)\n       \
         0.002 J    2.5%         1      2.0 µs  gemm()\n       \
         0.060 J          in sample intervals without a kernel (idle)\n"
    );
    assert!(!text.contains("ESTIMATE"), "{text}");
}

/// `cudatrace run -q --gpu --cupti STANDIN --power=1 --nvml STANDIN --libcuda STANDIN -o
/// TRACE -- cudatrace-driver gpu`, with `env` (read by cudatrace and the command).
fn run_power_gpu(name: &str, env: &[(&str, &str)]) -> PathBuf {
    let trace = scratch(&format!("power-gpu-{name}")).join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--gpu", "--cupti"])
        .arg(&cupti_standin().lib)
        .arg("--power=1")
        .arg("--nvml")
        .arg(&nvml_standin().lib)
        .arg("--libcuda")
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(&standin().driver)
        .arg("gpu")
        .envs(env.iter().copied())
        .output()
        .expect("running cudatrace");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    trace
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

/// What the summary must give, from the trace's own lines: GPU `nvml`'s samples as
/// intervals, each interval's energy (its counter readings' difference, or with `watts`
/// that constant power times the interval) shared by the kernels' time in it (a kernel
/// `[ts, ts + dur)`): per kernel name, mJ and the intervals it ran in.
fn expected_mj(trace: &[Value], nvml: u64, watts: Option<f64>) -> BTreeMap<String, (f64, u64)> {
    let samples: Vec<(u64, f64)> = trace
        .iter()
        .filter(|l| l["type"] == "power" && l["device"] == nvml)
        .map(|l| {
            let ts = u(&l["ts_ns"]);
            // W × ns = 1e-6 mJ.
            let mj = watts.map_or(u(&l["energy_mj"]) as f64, |w| w * ts as f64 / 1e6);
            (ts, mj)
        })
        .collect();
    let kernels: Vec<(&str, u64, u64)> = trace
        .iter()
        .filter(|l| l["type"] == "gpu_kernel")
        .map(|l| {
            let start = u(&l["ts_ns"]);
            (
                l["kernel"].as_str().unwrap(),
                start,
                start + u(&l["dur_ns"]),
            )
        })
        .collect();
    let mut energy = BTreeMap::new();
    for pair in samples.windows(2) {
        let ((t0, e0), (t1, e1)) = (pair[0], pair[1]);
        let overlap = |start: u64, end: u64| end.min(t1).saturating_sub(start.max(t0));
        let busy: u64 = kernels.iter().map(|k| overlap(k.1, k.2)).sum();
        for (name, start, end) in &kernels {
            let (mj, intervals) = energy.entry(name.to_string()).or_insert((0.0, 0));
            let o = overlap(*start, *end);
            if o > 0 {
                *mj += (e1 - e0) * o as f64 / busy as f64;
                *intervals += 1;
            }
        }
    }
    energy
}

/// Every kernel name's energy is what [`expected_mj`] says from the counter, and the
/// stand-in's constant power gives the same within the counter's error; every sampled
/// joule is a kernel's or idle.
fn assert_split(trace: &[Value], json: &Value, nvml: u64) {
    let from_counter = expected_mj(trace, nvml, None);
    let watts = STANDIN_POWER_W * (nvml + 1) as f64;
    let from_power = expected_mj(trace, nvml, Some(watts));
    // Each reading is floored to a whole mJ and taken up to its reads before its stamp.
    let max_read_ns = trace
        .iter()
        .filter(|l| l["type"] == "power")
        .map(|l| u(&l["read_ns"]))
        .max()
        .unwrap();
    let reading_error_mj = watts * max_read_ns as f64 / 1e6 + 1.0;
    let rows = kernel_rows(json);
    assert_eq!(rows.len(), 3, "{rows:?}");
    for (name, energy_j, _, _) in &rows {
        let want = from_counter[name].0 / 1e3;
        assert!(
            (energy_j - want).abs() <= 1e-9 * want.max(1.0),
            "{name}: {energy_j} J, expected {want} J"
        );
        assert!(*energy_j > 0.0, "{name} ran inside the samples");
        let (constant_mj, intervals) = from_power[name];
        let bound_mj = 2.0 * reading_error_mj * intervals as f64;
        assert!(
            (energy_j * 1e3 - constant_mj).abs() <= bound_mj,
            "{name}: {energy_j} J, {watts} W over its share of time: {constant_mj} mJ ± {bound_mj}"
        );
    }
    let kernels = &json["power"]["kernels"];
    let attributed: f64 =
        rows.iter().map(|r| r.1).sum::<f64>() + kernels["outside_windows_j"].as_f64().unwrap();
    let total = json["power"]["energy_j"].as_f64().unwrap();
    assert!(
        (attributed - total).abs() < 1e-9,
        "{attributed} J of {total} J"
    );
    // The stand-in's kernels, all inside the samples: vector_add 4096·2 and 128·64·2 ns,
    // the long-named kernel 7 ns, the huge-named one 1 ns.
    let mut runs: Vec<(u64, u64)> = rows.iter().map(|r| (r.2, r.3)).collect();
    runs.sort();
    assert_eq!(runs, [(1, 1), (1, 7), (2, 8_192 + 16_384)]);
    assert_eq!(kernels.get("unsampled_ns"), None);
}

#[test]
fn run_power_gpu_gives_each_stand_in_kernel_its_share_by_gpu_time() {
    let Some(_guard) = root() else { return };
    let path = run_power_gpu("one", &[]);
    let trace = read_trace(&path);
    assert_complete(&trace);
    assert_eq!(trace[0]["gpu"].get("cuda_visible_devices"), None);
    let json = summary_json(&path);
    assert_eq!(json["power"]["kernels"]["method"], "GPU time (--gpu)");
    assert_split(&trace, &json, 0);
    assert_eq!(
        json["power"]["kernels"]["devices"],
        json!([{"cuda_device": 0, "nvml_index": 0, "how": "the only GPU NVML sees", "assumed": false}])
    );
    let text = summary_text(&path);
    assert!(
        text.contains("Energy by kernel name (3 kernels), GPU time (--gpu)\n")
            && text.contains("  CUDA device 0 = NVML GPU 0 (the only GPU NVML sees)\n"),
        "{text}"
    );
}

#[test]
fn cuda_visible_devices_puts_the_kernels_on_their_nvml_gpu() {
    let Some(_guard) = root() else { return };
    // Two stand-in GPUs (100 W and 200 W); the command sees only NVML GPU 1, as its CUDA
    // device 0.
    let path = run_power_gpu(
        "visible",
        &[("NVML_STANDIN_DEVICES", "2"), ("CUDA_VISIBLE_DEVICES", "1")],
    );
    let trace = read_trace(&path);
    assert_complete(&trace);
    assert_eq!(trace[0]["gpu"]["cuda_visible_devices"], "1");
    let json = summary_json(&path);
    assert_split(&trace, &json, 1);
    let how = "CUDA_VISIBLE_DEVICES entry 0 is 1: ASSUMED CUDA numbers GPUs as NVML does (true \
               on a machine of one GPU model, or with CUDA_DEVICE_ORDER=PCI_BUS_ID)";
    assert_eq!(
        json["power"]["kernels"]["devices"],
        json!([{"cuda_device": 0, "nvml_index": 1, "how": how, "assumed": true}])
    );
    // GPU 0's energy is all idle: no kernel ran there.
    let gpu0 = json["power"]["devices"][0]["energy_j"].as_f64().unwrap();
    let idle = json["power"]["kernels"]["outside_windows_j"]
        .as_f64()
        .unwrap();
    assert!(idle > gpu0, "idle {idle} J, GPU 0 {gpu0} J");
    let text = summary_text(&path);
    assert!(
        text.contains(&format!("  CUDA device 0 = NVML GPU 1 ({how})\n")),
        "{text}"
    );
}
