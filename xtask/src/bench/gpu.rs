//! Part 6, gpu (issue 32): what `run --gpu` costs the traced process's own threads, on the
//! stand-in libcuda and libcupti. `cudatrace-bench-loop` calls `cuInit` (which loads the
//! injection library, as the driver does) and then launches at a fixed rate; the stand-in
//! libcupti makes a kernel record and an API record of each launch, which the library's
//! flushing thread converts and hands, in batches of up to 32, to the `gpu_records` uprobe.
//! Every run has `CUDATRACE_BPF_STATS=1`: the call-entry program's time per launch, and the
//! `gpu_records` program's per batch and per record. Two ways, rounds interleaved: batches
//! copied whole (as cudatrace runs), and record by record (`CUDATRACE_INJECT_UNMARKED=1`,
//! the way an earlier build's library is copied).

use std::{fs, path::Path};

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use super::{
    cudatrace::{cudatrace_run, footer_json},
    env::Env,
    stats::Stats,
};

/// Launches per run, after the loop's 1,000 warm-up launches.
pub const CALLS: u64 = 200_000;
/// Launches a second: a launch-bound PyTorch loop's rate on the H100 (about 7 µs a launch),
/// which this 2-core machine's reader keeps up with.
pub const RATE: u64 = 100_000;

/// `gpu` in results.json.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GpuResults {
    pub calls: u64,
    pub rate: u64,
    pub ways: Vec<GpuWay>,
}

/// One way of copying the records.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GpuWay {
    pub way: String,
    /// The call-entry program's ns per launch.
    pub call_program_ns: Stats,
    /// The `gpu_records` program's ns per call of `cudatrace_gpu_records` (one batch).
    pub batch_program_ns: Stats,
    /// The same per GPU record sent (kernel and API records).
    pub record_program_ns: Stats,
    /// Records per batch.
    pub records_per_batch: Stats,
    /// Events lost, over all runs (the footer's `lost.total`).
    pub lost: u64,
}

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Whole,
    RecordByRecord,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Whole => "batches whole",
            Way::RecordByRecord => "record by record",
        }
    }
}

pub fn run(env: &Env, rounds: usize) -> Result<GpuResults> {
    let cupti = env.standin.join("libcupti.so.13");
    ensure!(
        cupti.exists(),
        "no stand-in libcupti at {}",
        cupti.display()
    );
    let ways = [Way::Whole, Way::RecordByRecord];
    // Per way: call ns, batch ns, record ns, records per batch; lost.
    let mut figures: [([Vec<f64>; 4], u64); 2] = Default::default();
    for round in 0..rounds {
        for turn in 0..ways.len() {
            let way = ways[(round + turn) % ways.len()];
            let run = one_run(env, &cupti, way)?;
            let (lists, lost) = &mut figures[way as usize];
            lists[0].push(run.call_ns);
            lists[1].push(run.batch_ns);
            lists[2].push(run.record_ns);
            lists[3].push(run.per_batch);
            *lost += run.lost;
        }
    }
    Ok(GpuResults {
        calls: CALLS,
        rate: RATE,
        ways: ways
            .iter()
            .map(|&way| {
                let (lists, lost) = &figures[way as usize];
                GpuWay {
                    way: way.name().into(),
                    call_program_ns: Stats::of(&lists[0]),
                    batch_program_ns: Stats::of(&lists[1]),
                    record_program_ns: Stats::of(&lists[2]),
                    records_per_batch: Stats::of(&lists[3]),
                    lost: *lost,
                }
            })
            .collect(),
    })
}

struct OneRun {
    call_ns: f64,
    batch_ns: f64,
    record_ns: f64,
    per_batch: f64,
    lost: u64,
}

fn one_run(env: &Env, cupti: &Path, way: Way) -> Result<OneRun> {
    let trace = env.out.join("gpu.jsonl");
    let cupti = cupti.display().to_string();
    let command = [
        env.bench_loop.display().to_string(),
        CALLS.to_string(),
        RATE.to_string(),
        "1".into(),
        "cuLaunchKernel".into(),
    ];
    let mut cmd = cudatrace_run(env, &trace, &["--gpu", "--cupti", &cupti], &command);
    cmd.env("CUDATRACE_BPF_STATS", "1")
        .env("CUDATRACE_BENCH_CUINIT", "1");
    if way == Way::RecordByRecord {
        cmd.env("CUDATRACE_INJECT_UNMARKED", "1");
    }
    let output = cmd.output().context("running cudatrace")?;
    ensure!(
        output.status.success(),
        "cudatrace run --gpu failed: {output:?}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stat = |program: &str, field: &str| -> Result<f64> {
        stderr
            .lines()
            .find(|line| line.contains(&format!("bpf-stats {program} ")))
            .and_then(|line| {
                let at = line.find(&format!("{field}="))? + field.len() + 1;
                line[at..].split_whitespace().next()?.parse().ok()
            })
            .with_context(|| format!("no bpf-stats {field} for {program}"))
    };
    let footer = footer_json(&trace)?;
    // The records the program copied: written, or refused by a full ring (counted).
    let records = footer["events"]["gpu_kernel"].as_f64().unwrap_or(0.0)
        + footer["gpu"]["api_records"].as_f64().unwrap_or(0.0)
        + footer["lost"]["gpu_ring_full"].as_f64().unwrap_or(0.0);
    ensure!(
        records >= CALLS as f64,
        "only {records} GPU records of {CALLS} launches: did the library start?"
    );
    let batches = stat("gpu_records", "run_cnt")?;
    let batch_time = stat("gpu_records", "run_time_ns")?;
    let _ = fs::remove_file(&trace);
    Ok(OneRun {
        call_ns: stat("call_enter", "ns_per_run")?,
        batch_ns: batch_time / batches,
        record_ns: batch_time / records,
        per_batch: records / batches,
        lost: footer["lost"]["total"].as_u64().unwrap_or(0),
    })
}
