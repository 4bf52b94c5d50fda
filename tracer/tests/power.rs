//! Root tests of `cudatrace run --power` against the stand-in libnvidia-ml (NOT NVIDIA's
//! NVML: constant power, an energy counter that grows with CLOCK_MONOTONIC; its switches
//! give two GPUs, no energy counter, failed reads, a failed nvmlInit) and the stand-in
//! libcuda: the samples, energy per stage and for the run, the fallback to integrated
//! power, NVML errors, a missing NVML, the sampler's period, the summary.

mod common;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use common::{power::*, *};
use serde_json::{Value, json};

/// `cudatrace run -q --power=MS --nvml STANDIN --libcuda STANDIN -o TRACE -- COMMAND`,
/// with `env` for the stand-in NVML (read by cudatrace itself, which loads it).
fn run_power(
    name: &str,
    period: &str,
    env: &[(&str, &str)],
    command: &[&str],
) -> (PathBuf, Output) {
    let trace = scratch(&format!("power-{name}")).join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", &format!("--power={period}"), "--nvml"])
        .arg(&nvml_standin().lib)
        .arg("--libcuda")
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .args(command)
        .envs(env.iter().copied())
        .output()
        .expect("running cudatrace");
    (trace, output)
}

fn demo() -> &'static str {
    standin().demo.to_str().unwrap()
}

fn driver() -> &'static str {
    standin().driver.to_str().unwrap()
}

fn power_lines(trace: &[Value]) -> Vec<&Value> {
    trace.iter().filter(|l| l["type"] == "power").collect()
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

/// `cudatrace summary --json TRACE`.
fn summary_json(trace: &Path) -> Value {
    let output = Command::new(CUDATRACE)
        .args(["summary", "--json"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn summary_text(trace: &Path) -> String {
    let output = Command::new(CUDATRACE)
        .arg("summary")
        .arg(trace)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    String::from_utf8(output.stdout).unwrap()
}

/// The most a difference of two interpolated counter readings can be off from
/// `power × time`, in mJ: each reading is floored to a whole mJ, and is taken up to one
/// sample's reads (`read_ns`) before its time stamp.
fn counter_error_mj(watts: f64, lines: &[&Value]) -> f64 {
    let max_read_ns = lines.iter().map(|l| u(&l["read_ns"])).max().unwrap();
    watts * max_read_ns as f64 / 1e6 + 1.0
}

#[test]
fn samples_carry_every_field_and_the_header_names_the_library_and_gpu() {
    let Some(_guard) = root() else { return };
    let (path, output) = run_power("fields", "5", &[], &[demo()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&path);
    assert_complete(&trace);
    let power = &trace[0]["power"];
    assert_eq!(
        *power,
        json!({
            "period_ms": 5,
            "nvml": {
                "path": nvml_standin().lib.canonicalize().unwrap().to_str().unwrap(),
                "version": "cudatrace-standin",
                "driver_version": "cudatrace-standin",
                "standin": true
            },
            "devices": [{
                "index": 0,
                "name": "cudatrace stand-in GPU 0",
                "uuid": "GPU-00000000-0000-0000-0000-000000000000",
                "power_limit_mw": 700000,
                "energy_counter": true,
                "energy_source": "counter",
                "unsupported": []
            }]
        })
    );
    let lines = power_lines(&trace);
    assert!(lines.len() >= 3, "{} samples", lines.len());
    let footer = trace.last().unwrap();
    assert_eq!(footer["events"]["power"], lines.len() as u64);
    assert_eq!(footer["power"]["samples"], lines.len() as u64);
    assert_eq!(footer["power"]["read_errors"], json!({}));
    assert_eq!(footer["power"]["dropped_samples"], 0);
    let watts = STANDIN_POWER_W;
    let tolerance = counter_error_mj(watts, &lines);
    for (index, line) in lines.iter().enumerate() {
        let mut fields = (*line).clone();
        let object = fields.as_object_mut().unwrap();
        for key in ["seq", "ts_ns", "read_ns", "energy_mj"] {
            object.remove(key);
        }
        assert_eq!(
            fields,
            json!({
                "type": "power", "device": 0, "power_mw": 100000, "power_instant_mw": 100000,
                "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "gpu_util_pct": 42,
                "mem_util_pct": 17, "temperature_c": 55, "memory_used_bytes": 1073741824u64
            }),
            "{line}"
        );
        let read_ns = u(&line["read_ns"]);
        assert!(read_ns > 0 && read_ns < 50_000_000, "{line}");
        // The stand-in's counter is 100 W since boot: it is the time stamp's energy,
        // less what elapsed between the read and the stamp.
        let energy = u(&line["energy_mj"]) as f64;
        let at_stamp = u(&line["ts_ns"]) as f64 * watts / 1e6;
        assert!(
            (at_stamp - energy) >= -1.0 && at_stamp - energy <= tolerance,
            "{energy} mJ at {at_stamp}: {line}"
        );
        if index > 0 {
            let before = lines[index - 1];
            assert!(u(&line["seq"]) > u(&before["seq"]), "{line}");
            assert!(u(&line["ts_ns"]) > u(&before["ts_ns"]));
        }
    }
    // Every tick is a line or a skipped tick (a busy machine may make the sampler late).
    assert_eq!(
        u(&lines.last().unwrap()["seq"]) + 1,
        lines.len() as u64 + u(&footer["power"]["skipped_ticks"])
    );
    // Sampling started before the command and ended after it.
    let calls = calls(&trace);
    let first_call = u(&calls[0]["ts_ns"]);
    let last = calls.last().unwrap();
    let last_end = u(&last["ts_ns"]) + u(&last["dur_ns"]);
    assert!(u(&lines[0]["ts_ns"]) < first_call);
    assert!(u(&lines.last().unwrap()["ts_ns"]) > last_end);
    assert!(u(&lines[0]["ts_ns"]) > u(&trace[0]["start_monotonic_ns"]));
}

#[test]
fn energy_per_stage_and_for_the_run_is_power_times_time() {
    let Some(_guard) = root() else { return };
    let (path, output) = run_power("stages", "5", &[], &[demo()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&path);
    let lines = power_lines(&trace);
    let tolerance_mj = counter_error_mj(STANDIN_POWER_W, &lines);
    let summary = summary_json(&path);
    let power = &summary["power"];
    let (first, last) = (u(&lines[0]["ts_ns"]), u(&lines.last().unwrap()["ts_ns"]));
    let span_s = (last - first) as f64 / 1e9;
    let device = &power["devices"][0];
    assert_eq!(device["energy_source"], "counter");
    assert_eq!(device["samples"], lines.len() as u64);
    assert_eq!(
        (u(&device["first_ts_ns"]), u(&device["last_ts_ns"])),
        (first, last)
    );
    // The counter's energy: 100 W over the samples' span, within the counter's error.
    let energy_j = device["energy_j"].as_f64().unwrap();
    assert!(
        (energy_j - STANDIN_POWER_W * span_s).abs() * 1e3 <= tolerance_mj,
        "{energy_j} J over {span_s} s"
    );
    assert_eq!(power["energy_j"], device["energy_j"]);
    // Constant power integrates exactly.
    let integrated = device["integrated_j"].as_f64().unwrap();
    assert!(
        (integrated - STANDIN_POWER_W * span_s).abs() < 1e-9,
        "{integrated}"
    );
    assert_eq!(
        (device["peak_w"].as_f64(), power["peak_w"].as_f64()),
        (Some(100.0), Some(100.0))
    );
    assert_eq!(power["read_errors"], 0);

    // The stand-in's counter moves at every 5 ms sample, so the readings' step is about
    // the sample period (a late tick lengthens one step, not the median).
    let step = power["step_ns"].as_u64().expect("the readings' step");
    assert!((2_500_000..=50_000_000).contains(&step), "step {step} ns");

    // The demo's six stages, each the counter's energy between its boundaries, marked
    // where shorter than one step.
    let stages = &summary["stages"][0]["stages"];
    let energies = &power["stages"][0]["stages"];
    assert_eq!(energies.as_array().unwrap().len(), 6);
    let mut sum_j = 0.0;
    for (stage, energy) in stages
        .as_array()
        .unwrap()
        .iter()
        .zip(energies.as_array().unwrap())
    {
        assert_eq!(stage["name"], energy["name"]);
        assert_eq!(stage["start_ns"], energy["start_ns"]);
        assert_eq!(stage["duration_ns"], energy["duration_ns"]);
        assert_eq!(
            energy["within_one_step"],
            u(&stage["duration_ns"]) < step,
            "{energy}"
        );
        assert_eq!(
            energy["covered_ns"], stage["duration_ns"],
            "inside the samples: {energy}"
        );
        let expected_mj = u(&stage["duration_ns"]) as f64 * STANDIN_POWER_W / 1e6;
        let got_mj = energy["energy_j"].as_f64().unwrap() * 1e3;
        assert!(
            (got_mj - expected_mj).abs() <= tolerance_mj,
            "{}: {got_mj} mJ, expected {expected_mj} ± {tolerance_mj}",
            stage["name"]
        );
        sum_j += energy["energy_j"].as_f64().unwrap();
    }
    // The stages partition the calls' span: their energies add up to its energy.
    let span_ns: u64 = stages
        .as_array()
        .unwrap()
        .iter()
        .map(|s| u(&s["duration_ns"]))
        .sum();
    assert!((sum_j * 1e3 - span_ns as f64 * STANDIN_POWER_W / 1e6).abs() <= tolerance_mj);

    // Kernels by launch windows: the demo's three kernels, 80 launches, an estimate.
    let kernels = &power["kernels"];
    assert_eq!(kernels["estimate"], true);
    assert_eq!(kernels["method"], "launch windows (estimate: no --gpu)");
    let launches: u64 = kernels["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| u(&k["launches"]))
        .sum();
    assert_eq!(launches, 80);
    let windows_j: f64 = kernels["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["energy_j"].as_f64().unwrap())
        .sum();
    let outside = kernels["outside_windows_j"].as_f64().unwrap();
    assert!((windows_j + outside - energy_j).abs() < 1e-9);
    let idle = &power["before_first_launch"];
    let first_launch = calls(&trace)
        .iter()
        .find(|c| c["name"].as_str().unwrap().starts_with("cuLaunchKernel"))
        .map(|c| u(&c["ts_ns"]))
        .unwrap();
    assert_eq!(u(&idle["duration_ns"]), first_launch - first);
    let idle_mj = idle["energy_j"].as_f64().unwrap() * 1e3;
    assert!(
        (idle_mj - (first_launch - first) as f64 * STANDIN_POWER_W / 1e6).abs() <= tolerance_mj
    );

    let text = summary_text(&path);
    for needle in [
        "Energy (--power: 1 GPU, a sample every 5 ms; NVML ",
        "(cudatrace STAND-IN, not NVIDIA's NVML))",
        "cudatrace stand-in GPU 0         counter",
        "Energy by stage, pid ",
        "Energy by kernel name (3 kernels), launch windows (estimate: no --gpu)",
        "outside any launch window",
        "before the first launch: ",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
}

#[test]
fn two_gpus_one_without_an_energy_counter_falls_back_to_integrated_power() {
    let Some(_guard) = root() else { return };
    let env = [
        ("NVML_STANDIN_DEVICES", "2"),
        ("NVML_STANDIN_NO_ENERGY", "1"),
    ];
    let (path, output) = run_power("fallback", "5", &env, &[driver(), "sleep", "0.2"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&path);
    assert_complete(&trace);
    let devices = &trace[0]["power"]["devices"];
    assert_eq!(devices.as_array().unwrap().len(), 2);
    assert_eq!(devices[1]["name"], "cudatrace stand-in GPU 1");
    assert_eq!(
        devices[1]["uuid"],
        "GPU-00000000-0000-0000-0000-000000000001"
    );
    assert_eq!(
        (&devices[1]["energy_counter"], &devices[1]["energy_source"]),
        (&json!(false), &json!("integrated power"))
    );
    assert_eq!(
        devices[1]["unsupported"],
        json!(["energy_mj: NOT_SUPPORTED"])
    );
    assert_eq!(devices[0]["energy_source"], "counter");

    let lines = power_lines(&trace);
    let of = |device: u64| -> Vec<&Value> {
        lines
            .iter()
            .copied()
            .filter(|l| l["device"] == device)
            .collect()
    };
    let (gpu0, gpu1) = (of(0), of(1));
    assert_eq!(gpu0.len(), gpu1.len(), "one line per GPU per tick");
    assert_eq!(gpu0.len() + gpu1.len(), lines.len());
    for (a, b) in gpu0.iter().zip(&gpu1) {
        assert_eq!(a["seq"], b["seq"]);
        assert_eq!(
            (&a["power_mw"], &b["power_mw"]),
            (&json!(100000), &json!(200000))
        );
        assert!(a.get("energy_mj").is_some());
        assert!(b.get("energy_mj").is_none(), "never read: {b}");
        assert_eq!(
            (&a["temperature_c"], &b["temperature_c"]),
            (&json!(55), &json!(56))
        );
        assert_eq!(b["memory_used_bytes"], 1073741824u64 + (1 << 20));
        assert!(b.get("errors").is_none(), "{b}");
    }

    let summary = summary_json(&path);
    let power = &summary["power"];
    let gpu1_summary = &power["devices"][1];
    assert_eq!(gpu1_summary["energy_source"], "integrated power");
    assert!(gpu1_summary.get("counter_j").is_none());
    let span_s = (u(&gpu1.last().unwrap()["ts_ns"]) - u(&gpu1[0]["ts_ns"])) as f64 / 1e9;
    // 200 W held constant: the trapezoid rule is exact.
    assert!((gpu1_summary["energy_j"].as_f64().unwrap() - 200.0 * span_s).abs() < 1e-9);
    assert_eq!(gpu1_summary["mean_w"].as_f64().unwrap().round(), 200.0);
    assert_eq!(
        power["peak_w"].as_f64(),
        Some(300.0),
        "both GPUs in one tick"
    );
    assert!(gpu1_summary["note"].as_str().unwrap().contains(
        "energy counter NOT SUPPORTED on this GPU: energy integrated from power samples"
    ));
    let text = summary_text(&path);
    assert!(
        text.contains(
            "GPU 1: energy counter NOT SUPPORTED on this GPU: energy integrated from power samples"
        ),
        "{text}"
    );
    assert!(
        text.contains("cudatrace stand-in GPU 1         integrated power"),
        "{text}"
    );
}

#[test]
fn nvml_errors_while_sampling_are_counted_and_reported() {
    let Some(_guard) = root() else { return };
    // Every third nvmlDeviceGetPowerUsage fails; the first call is cudatrace's probe at
    // start-up, so the k-th sample (from 0) makes call k + 2.
    let env = [("NVML_STANDIN_FAIL_POWER_EVERY", "3")];
    let (path, output) = run_power("errors", "5", &env, &[driver(), "sleep", "0.1"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&path);
    let lines = power_lines(&trace);
    let mut failed = 0;
    for (k, line) in lines.iter().enumerate() {
        if (k + 2) % 3 == 0 {
            failed += 1;
            assert_eq!(
                line["errors"],
                json!({"power_mw": "UNKNOWN"}),
                "sample {k}: {line}"
            );
            assert!(line.get("power_mw").is_none(), "{line}");
            assert_eq!(
                line["power_instant_mw"], 100000,
                "the other fields are read"
            );
        } else {
            assert!(line.get("errors").is_none(), "sample {k}: {line}");
            assert_eq!(line["power_mw"], 100000);
        }
    }
    assert!(failed >= 3, "{} samples", lines.len());
    let footer = trace.last().unwrap();
    assert_eq!(
        footer["power"]["read_errors"],
        json!({"nvmlDeviceGetPowerUsage: UNKNOWN": failed})
    );
    assert!(
        stderr(&output).contains(&format!(
            "cudatrace: WARNING: --power: NVML errors while sampling (those fields are missing \
             from those samples): nvmlDeviceGetPowerUsage: UNKNOWN ×{failed}"
        )),
        "{}",
        stderr(&output)
    );
    let summary = summary_json(&path);
    assert_eq!(summary["power"]["read_errors"], failed);
    assert_eq!(
        summary["power"]["devices"][0]["errors"],
        json!({"power_mw": failed})
    );
}

/// What `cudatrace run --power` does when NVML is missing: one line, exit 72, and the
/// command never starts (it would create `marker`).
fn assert_no_nvml(output: &Output, marker: &Path, trace: &Path, expected: &str) {
    assert_eq!(output.status.code(), Some(72), "{}", stderr(output));
    let text = stderr(output);
    assert_eq!(text.lines().count(), 1, "one line: {text}");
    assert!(
        text.starts_with("cudatrace: error: --power: no usable NVML (libnvidia-ml.so.1): "),
        "{text}"
    );
    assert!(text.contains(expected), "{expected:?} not in {text}");
    assert!(
        text.trim_end()
            .ends_with("; pass --nvml PATH, or run without --power"),
        "{text}"
    );
    assert!(!marker.exists(), "the command ran");
    assert!(!trace.exists(), "a trace was written");
}

#[test]
fn a_missing_or_failing_nvml_stops_the_run_before_the_command_starts() {
    let Some(_guard) = root() else { return };
    let dir = scratch("power-missing");
    let marker = dir.join("ran");
    let trace = dir.join("trace.jsonl");
    let run = |nvml: Option<&Path>, env: &[(&str, &str)]| -> Output {
        let mut command = Command::new(CUDATRACE);
        command.args(["run", "-q", "--power", "--missing-probes", "ignore"]);
        if let Some(nvml) = nvml {
            command.arg("--nvml").arg(nvml);
        }
        command
            .arg("--libcuda")
            .arg(&standin().lib)
            .arg("-o")
            .arg(&trace)
            .args(["--", "touch"])
            .arg(&marker)
            .env_remove("LD_LIBRARY_PATH")
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };

    let missing = dir.join("nowhere/libnvidia-ml.so.1");
    let output = run(Some(&missing), &[]);
    assert_no_nvml(
        &output,
        &marker,
        &trace,
        &format!(
            "--nvml {}: {}: cannot open shared object file",
            missing.display(),
            missing.display()
        ),
    );

    let output = run(
        Some(&nvml_standin().lib),
        &[("NVML_STANDIN_INIT_ERROR", "9")],
    );
    assert_no_nvml(
        &output,
        &marker,
        &trace,
        &format!(
            "--nvml {}: nvmlInit_v2: DRIVER_NOT_LOADED",
            nvml_standin().lib.display()
        ),
    );

    // The loader's search finds only the file in a `stubs` folder: it is not taken.
    let stubs = nvml_standin()
        .in_stubs
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let output = run(None, &[("LD_LIBRARY_PATH", &stubs)]);
    let real_nvml = [
        "/usr/local/nvidia/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/lib/wsl/lib",
    ]
    .iter()
    .any(|dir| Path::new(dir).join("libnvidia-ml.so.1").exists());
    if real_nvml {
        // A machine with NVIDIA's NVML in the usual places: that one, never the stub.
        if output.status.code() == Some(0) {
            let header = &read_trace(&trace)[0];
            let path = header["power"]["nvml"]["path"].as_str().unwrap();
            assert!(!path.contains("/stubs/"), "{path}");
            std::fs::remove_file(&marker).unwrap();
            std::fs::remove_file(&trace).unwrap();
        }
    } else {
        assert_no_nvml(
            &output,
            &marker,
            &trace,
            &format!(
                "the loader found {}, a link-time stub: skipped; not in /usr/local/nvidia/lib64, \
                 /usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/lib, /usr/lib/wsl/lib",
                nvml_standin().in_stubs.canonicalize().unwrap().display()
            ),
        );
    }

    // Bad periods and --nvml without --power are usage errors.
    for (args, message) in [
        (
            vec!["--power=0"],
            "0 ms is out of range: give the sampling period in whole milliseconds, 1 to 60000",
        ),
        (vec!["--power=abc"], "\"abc\" is not a number"),
        (vec!["--nvml", "/x"], "--power"),
    ] {
        let output = Command::new(CUDATRACE)
            .arg("run")
            .args(&args)
            .args(["--", "touch"])
            .arg(&marker)
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(message),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!marker.exists());
    }
}

#[test]
fn the_loaders_search_honours_ld_library_path() {
    let Some(_guard) = root() else { return };
    let dir = scratch("power-search");
    let trace = dir.join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--power", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .args(["--", driver(), "exit", "0"])
        .env("LD_LIBRARY_PATH", nvml_standin().lib.parent().unwrap())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace);
    assert_eq!(
        trace[0]["power"]["nvml"]["path"],
        nvml_standin().lib.canonicalize().unwrap().to_str().unwrap()
    );
    assert_eq!(trace[0]["power"]["period_ms"], 20, "the default period");
    // At least the first sample and the last.
    assert!(power_lines(&trace).len() >= 2);
}

#[test]
fn the_sampler_keeps_its_period() {
    let Some(_guard) = root() else { return };
    let period_ns: u64 = 10_000_000;
    let (path, output) = run_power("period", "10", &[], &[driver(), "sleep", "1"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&path);
    let lines = power_lines(&trace);
    let footer = &trace.last().unwrap()["power"];
    let (samples, skipped) = (u(&footer["samples"]), u(&footer["skipped_ticks"]));
    assert_eq!(samples, lines.len() as u64);
    // Ticks are numbered from 0; the last sample (taken when tracing stops) has the number
    // of the tick that was due next. Every tick is sampled or counted as skipped.
    let seqs: Vec<u64> = lines.iter().map(|l| u(&l["seq"])).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(seqs[0], 0);
    assert_eq!(*seqs.last().unwrap() + 1, samples + skipped, "{seqs:?}");
    // A second of sleeping, plus start-up and exit: at least 100 ticks, and not so many
    // skipped that the period means nothing (a loaded machine may skip a few).
    assert!(
        samples + skipped >= 100,
        "{samples} samples, {skipped} skipped"
    );
    assert!(
        skipped * 10 <= samples,
        "{samples} samples, {skipped} skipped"
    );
    // Each regular sample is taken in its own tick: after the tick's time, and before the
    // next tick's time plus its reads (times from the first sample, itself taken at once).
    let t0 = u(&lines[0]["ts_ns"]);
    let first_reads = u(&lines[0]["read_ns"]);
    for line in &lines[..lines.len() - 1] {
        let offset = u(&line["ts_ns"]) as i64 - t0 as i64 - (u(&line["seq"]) * period_ns) as i64;
        let read_ns = u(&line["read_ns"]) as i64;
        assert!(
            offset > -(first_reads as i64) - 1_000_000 && offset < period_ns as i64 + read_ns,
            "sample {} is {offset} ns off its tick: {line}",
            line["seq"]
        );
    }
}

#[test]
fn the_runs_energy_is_over_the_commands_life_with_the_samplers_margins_apart() {
    let Some(_guard) = root() else { return };
    // Exactly 250 W: `sleep 2` costs 500 J, whatever cudatrace's own start-up and teardown
    // around it (the sampler runs through both). Not quiet: the closing report is checked.
    let trace = scratch("power-command-life").join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "--power=20", "--missing-probes", "ignore", "--nvml"])
        .arg(&nvml_standin().lib)
        .arg("--libcuda")
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .args(["--", "sleep", "2"])
        .env("NVML_STANDIN_POWER_MW", "250000")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let summary = summary_json(&trace);
    let power = &summary["power"];
    let command = &power["command"];
    let energy = command["energy_j"].as_f64().unwrap();
    let seconds = command["duration_ns"].as_f64().unwrap() / 1e9;
    assert!(
        (energy - 500.0).abs() < 10.0,
        "{energy} J, not 500 J within 2%"
    );
    assert!((seconds - 2.0).abs() < 0.04, "{seconds} s");
    assert!((command["mean_w"].as_f64().unwrap() - 250.0).abs() < 0.5);
    // The exec and exit of the trace bound it exactly.
    let lines = read_trace(&trace);
    let ts = |event: &str| {
        lines
            .iter()
            .find(|l| l["type"] == "process" && l["event"] == event)
            .map(|l| u(&l["ts_ns"]))
            .unwrap()
    };
    assert_eq!(u(&command["start_ns"]), ts("exec"));
    assert_eq!(u(&command["duration_ns"]), ts("exit") - ts("exec"));
    // The sampler's margins and the command add up to all the samples.
    let margin = |key: &str| power[key]["energy_j"].as_f64().unwrap();
    let all = power["energy_j"].as_f64().unwrap();
    let sum = energy + margin("before_command") + margin("after_command");
    assert!((sum - all).abs() < 1e-6, "{sum} != {all}");
    assert!(all > energy, "the sampler ran longer than the command");
    assert_eq!(power["devices"][0]["command_j"], command["energy_j"]);
    // The closing report and the summary say the command's figure.
    let said = stderr(&output);
    let line = said
        .lines()
        .find(|l| l.starts_with("cudatrace: energy:"))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        line.contains(&format!("{energy:.3} J over the command's 2.0")),
        "{line}"
    );
    assert!(line.contains("sampled outside it: "), "{line}");
    let text = summary_text(&trace);
    assert!(
        text.contains(&format!(
            "the command (its first exec to its last exit): {energy:.3} J over 2.0"
        )),
        "{text}"
    );
    // No calls: times count from the trace's start (here, under a second before the
    // peak), not from zero (thousands of seconds of uptime).
    let all_samples = text.lines().find(|l| l.contains("all samples:")).unwrap();
    let at = all_samples.split(" at +").nth(1).unwrap();
    let unit = at
        .split(';')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap();
    assert!(["ns", "µs", "ms"].contains(&unit), "{all_samples}");
}
