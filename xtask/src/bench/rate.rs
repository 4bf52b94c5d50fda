//! Part 2, sustained rate: the loop paced at increasing call rates under `cudatrace run`,
//! with the calls lost from the trace footer; then the fastest rate with smaller rings.

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::{
    bench_loop::LoopReport, cudatrace::Footer, cudatrace::cudatrace_run, env::Env,
    process::run_measured,
};

/// Paced steps, total calls/s over all loop threads; the last is issue 7's target.
const RATE_STEPS: &[u64] = &[
    25_000, 50_000, 75_000, 100_000, 125_000, 150_000, 200_000, 300_000, 500_000,
];
pub const RATE_TARGET: u64 = 500_000;
/// Ring sizes (KiB) tried at the fastest rate, to show how much of the default is needed.
const RING_STEPS_KIB: &[u64] = &[4096, 1024, 256];
/// `cudatrace run`'s default `--ring-kib`.
const DEFAULT_RING_KIB: u64 = 16384;

/// `rate` in results.json.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RateResults {
    /// Loop threads, one per CPU.
    pub threads: u64,
    pub seconds_per_step: f64,
    /// The paced steps under the default ring.
    pub steps: Vec<RateStep>,
    pub highest_achieved_calls_per_s_with_0_lost: f64,
    pub first_step_with_loss: Option<RateStep>,
    /// The fastest step again, with the rings of `RING_STEPS_KIB`.
    pub smaller_rings_at_full_speed: Vec<RateStep>,
}

/// One paced run of the loop under `cudatrace run`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RateStep {
    pub target_calls_per_s: u64,
    pub achieved_calls_per_s: f64,
    /// Within 5% of the target; a loop that could not keep pace ran flat out.
    pub kept_pace: bool,
    pub ring_kib: u64,
    /// Calls made, warm-up included.
    pub calls: u64,
    /// Call lines in the trace.
    pub traced_calls: u64,
    pub lost_calls: u64,
    pub entries_seen: u64,
    #[serde(rename = "loop")]
    pub report: LoopReport,
}

/// Runs the paced steps, each aiming to last `seconds`, then the ring sizes.
pub fn run(env: &Env, seconds: f64) -> Result<RateResults> {
    let mut steps = Vec::new();
    let mut saturated = false;
    for &target in RATE_STEPS {
        // Past the first step the loop cannot keep up with, only the target step is run:
        // a busy-wait that is always late makes every faster step the same run.
        if saturated && target != RATE_TARGET {
            continue;
        }
        let per_thread = ((target as f64 * seconds) as u64 / env.threads).max(1);
        let step = run_step(env, target, per_thread, None)?;
        eprintln!(
            "xtask: bench: rate {target:>7}/s: achieved {:>9.0}/s, lost {}",
            step.achieved_calls_per_s, step.lost_calls
        );
        saturated |= !step.kept_pace;
        steps.push(step);
    }
    // How much of the default ring the fastest rate needs.
    let fastest = RATE_TARGET;
    let per_thread = ((fastest as f64 * seconds / 2.0) as u64 / env.threads).max(1);
    let mut rings = Vec::new();
    for &kib in RING_STEPS_KIB {
        let step = run_step(env, fastest, per_thread, Some(kib))?;
        eprintln!(
            "xtask: bench: ring {kib:>5} KiB at full speed: achieved {:>9.0}/s, lost {}",
            step.achieved_calls_per_s, step.lost_calls
        );
        rings.push(step);
    }
    let highest_clean = steps
        .iter()
        .filter(|s| s.lost_calls == 0)
        .map(|s| s.achieved_calls_per_s)
        .fold(0.0, f64::max);
    let first_loss = steps.iter().find(|s| s.lost_calls != 0).cloned();
    Ok(RateResults {
        threads: env.threads,
        seconds_per_step: seconds,
        steps,
        highest_achieved_calls_per_s_with_0_lost: highest_clean,
        first_step_with_loss: first_loss,
        smaller_rings_at_full_speed: rings,
    })
}

/// `per_thread` calls on each loop thread at `target` calls/s in all.
fn run_step(env: &Env, target: u64, per_thread: u64, ring_kib: Option<u64>) -> Result<RateStep> {
    let trace = env.out.join("rate.jsonl");
    let ring = ring_kib.map(|k| k.to_string());
    let mut extra = Vec::new();
    if let Some(ring) = &ring {
        extra.extend(["--ring-kib", ring.as_str()]);
    }
    let loop_command = env.loop_command(&[per_thread, target, env.threads]);
    let mut command = cudatrace_run(env, &trace, &extra, &loop_command);
    let run = run_measured(&env.out, &mut command, None)?;
    run.ensure_ok("cudatrace run")?;
    let report = LoopReport::parse(&run.stdout)?;
    let footer = Footer::read(&trace)?;
    Ok(RateStep {
        target_calls_per_s: target,
        achieved_calls_per_s: report.calls_per_s,
        kept_pace: report.calls_per_s >= 0.95 * target as f64,
        ring_kib: ring_kib.unwrap_or(DEFAULT_RING_KIB),
        calls: report.traced_calls(),
        traced_calls: footer.events.call,
        lost_calls: footer.lost.calls,
        entries_seen: footer.entries_seen,
        report,
    })
}
