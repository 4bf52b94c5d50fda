//! Part 3, resources: the `cudatrace` process's peak memory and CPU time while it traces,
//! idle and busy.

use std::{
    collections::BTreeMap,
    ffi::OsStr,
    fs,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::{
    bench_loop::{LOOP_PROGRAM, LoopReport},
    cudatrace::{Footer, cudatrace_run},
    env::Env,
    process::{Finished, run_measured},
    procfs::{rss_breakdown, status_kib},
};

/// `resources` in results.json.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ResourceResults {
    pub idle: IdleRun,
    pub busy: BusyRun,
}

/// cudatrace attached, tracing a program that calls once per 10 ms for 2 s.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct IdleRun {
    pub command: String,
    pub peak_rss_mib: f64,
    pub wall_s: f64,
    pub sampled: Sampled,
}

/// cudatrace tracing the loop on every CPU as fast as it goes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct BusyRun {
    pub command: String,
    /// Calls made, warm-up included.
    pub calls: u64,
    pub traced_calls: u64,
    pub lost_calls: u64,
    pub trace_bytes: u64,
    pub wall_s: f64,
    pub loop_calls_per_s: f64,
    /// The sampled VmHWM.
    pub peak_rss_mib: f64,
    /// wait4's maximum RSS of cudatrace and its waited-for children.
    pub wait4_max_rss_mib: f64,
    /// wait4's CPU time of cudatrace less the loop's own.
    pub tracer_cpu_s: f64,
    pub tracer_cpu_percent_of_one_cpu: f64,
    pub tracer_cpu_ns_per_call: f64,
    pub loop_cpu_s: f64,
    pub sampled: Sampled,
}

/// What /proc said about the `cudatrace` process while it ran.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The highest VmHWM seen (sampled every 50 ms).
    pub vm_hwm_kib: u64,
    pub samples: u64,
    /// Resident KiB by mapping kind, the largest breakdown seen (every 0.5 s).
    pub rss_breakdown_kib: BTreeMap<String, u64>,
}

/// Traces `cudatrace-driver sleep 2`, then `total_calls` calls of the loop on every CPU.
pub fn run(env: &Env, total_calls: u64) -> Result<ResourceResults> {
    let trace = env.out.join("resources.jsonl");
    let driver = env.standin.join("cudatrace-driver");
    let (idle_run, idle) =
        sampled_run(env, &trace, &[&driver, Path::new("sleep"), Path::new("2")])?;
    let per_thread = (total_calls / env.threads).max(1);
    let (busy_run, busy) = sampled_run(
        env,
        &trace,
        &env.loop_command(&[per_thread, 0, env.threads]),
    )?;
    let report = LoopReport::parse(&busy_run.stdout)?;
    let footer = Footer::read(&trace)?;
    let trace_bytes = fs::metadata(&trace)?.len();
    // wait4 counts cudatrace with its waited-for child, the loop: take the loop's own off.
    let tracer_cpu_s = busy_run.cpu_s - report.process_cpu_ns as f64 / 1e9;
    let mib = |kib: u64| kib as f64 / 1024.0;
    Ok(ResourceResults {
        idle: IdleRun {
            command: "cudatrace-driver sleep 2".into(),
            peak_rss_mib: mib(idle.vm_hwm_kib),
            wall_s: idle_run.wall_s,
            sampled: idle,
        },
        busy: BusyRun {
            command: format!("{LOOP_PROGRAM} {per_thread} 0 {}", env.threads),
            calls: report.traced_calls(),
            traced_calls: footer.events.call,
            lost_calls: footer.lost.calls,
            trace_bytes,
            wall_s: busy_run.wall_s,
            loop_calls_per_s: report.calls_per_s,
            peak_rss_mib: mib(busy.vm_hwm_kib),
            wait4_max_rss_mib: mib(busy_run.max_rss_kib),
            tracer_cpu_s,
            tracer_cpu_percent_of_one_cpu: 100.0 * tracer_cpu_s / busy_run.wall_s,
            tracer_cpu_ns_per_call: tracer_cpu_s * 1e9 / footer.events.call.max(1) as f64,
            loop_cpu_s: report.process_cpu_ns as f64 / 1e9,
            sampled: busy,
        },
    })
}

/// Runs cudatrace over `command`, sampling its VmHWM and RSS breakdown.
fn sampled_run(
    env: &Env,
    trace: &Path,
    command: &[impl AsRef<OsStr>],
) -> Result<(Finished, Sampled)> {
    let mut sampled = Sampled {
        vm_hwm_kib: 0,
        samples: 0,
        rss_breakdown_kib: BTreeMap::new(),
    };
    let mut last_breakdown = Instant::now() - Duration::from_secs(10);
    let mut sampler = |pid: u32| {
        if let Some(kib) = status_kib(pid, "VmHWM:") {
            sampled.vm_hwm_kib = sampled.vm_hwm_kib.max(kib);
            sampled.samples += 1;
        }
        if last_breakdown.elapsed() >= Duration::from_millis(500) {
            let breakdown = rss_breakdown(pid);
            if breakdown.values().sum::<u64>() >= sampled.rss_breakdown_kib.values().sum::<u64>() {
                sampled.rss_breakdown_kib = breakdown;
            }
            last_breakdown = Instant::now();
        }
    };
    let run = run_measured(
        &env.out,
        &mut cudatrace_run(env, trace, &[], command),
        Some(&mut sampler),
    )?;
    run.ensure_ok("cudatrace run")?;
    Ok((run, sampled))
}
