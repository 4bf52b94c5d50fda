//! `cargo xtask bench`: the no-GPU benchmarks of issue 7, against the stand-in libcuda.
//!
//! Four parts, each printed as a table at the end and written to target/bench/results.json
//! (BENCHMARKS.md says what each measures and shows a run):
//!
//! - **overhead**: ns per call of `cuLaunchKernel` in a tight loop
//!   (`cudatrace-bench-loop`, standin/bench_loop.c) untraced, under the kernel's bare tracefs
//!   uprobe + uretprobe, under `cudatrace run` and under bpftrace, interleaved round by round;
//! - **rate**: the loop paced at increasing call rates under `cudatrace run`, with the lost
//!   calls from the trace footer;
//! - **resources**: peak RSS and CPU time of the `cudatrace` process while it traces;
//! - **trace**: `cudatrace summary` and `cudatrace export` on a generated trace of 10M calls;
//! - **stacks**: what `--stacks` adds per call and per frame walked (issue 23), a Python
//!   loop calling the stand-in through ctypes from a shallow and a deep stack;
//! - **gpu**: what `run --gpu`'s probes cost per launch and per GPU record (issue 32), on
//!   the stand-in libcupti, batches copied whole and record by record.
//!
//! Nothing here asserts a timing: targets are reported as met or missed, never failed on.
//!
//! Each part is a module with one `run` returning its typed results ([`results`] gathers
//! them into results.json; [`report`] prints the tables from them). The programs traced and
//! their readers: [`bench_loop`], [`cudatrace`], [`tracefs`], [`bpftrace`], [`tracers`];
//! running and measuring them: [`process`], [`procfs`], [`stats`].

mod bench_loop;
mod bpftrace;
mod cudatrace;
mod env;
mod generated_trace;
mod gpu;
mod overhead;
mod process;
mod procfs;
mod rate;
mod report;
mod resources;
mod results;
mod stacks;
mod stats;
mod trace_tools;
mod tracefs;
mod tracers;

use std::{fs, path::Path, process::Command, thread, time::Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::ValueEnum;

use self::{
    bench_loop::{FUNCTION, LOOP_PROGRAM},
    env::Env,
    gpu::GpuResults,
    overhead::OverheadResults,
    procfs::Machine,
    rate::RateResults,
    resources::ResourceResults,
    results::{Results, RunOptions},
    stacks::StacksResults,
    trace_tools::TraceToolResults,
    tracefs::{TracefsAfter, remove_stale_probes, tracefs_dir},
};
use crate::{cmd, ebpf, standin};

#[derive(clap::Args, Debug, Clone)]
pub struct BenchOptions {
    /// Timed calls per overhead run (each condition, each round).
    #[arg(long, default_value_t = 200_000)]
    pub calls: u64,
    /// Rounds of the overhead conditions, interleaved (the order rotates each round).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds each paced-rate step aims to last (longer when the loop cannot keep pace).
    #[arg(long, default_value_t = 5.0)]
    pub rate_seconds: f64,
    /// Calls (all threads together) of the resource-use run.
    #[arg(long, default_value_t = 2_000_000)]
    pub resource_calls: u64,
    /// Call events in the generated trace timed with `summary` and `export`.
    #[arg(long, default_value_t = 10_000_000)]
    pub trace_events: u64,
    /// Rounds of the `summary` / `export` timings.
    #[arg(long, default_value_t = 3)]
    pub trace_rounds: usize,
    /// Keep the generated trace (target/bench/generated.jsonl, about 3.9 GB for 10M calls).
    #[arg(long)]
    pub keep_trace: bool,
    /// Run only these parts (comma-separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Part>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Overhead,
    Rate,
    Resources,
    Trace,
    Stacks,
    Gpu,
}

pub fn bench(opts: &BenchOptions) -> Result<()> {
    if !cmd::is_root() {
        bail!(
            "the benchmark attaches uprobes (tracefs, cudatrace, bpftrace): run `sudo -E cargo xtask bench`"
        );
    }
    ensure!(
        opts.calls > 0 && opts.rounds > 0,
        "--calls and --rounds must be positive"
    );
    process::catch_interrupts();

    let root = cmd::workspace_root();
    ebpf::build_ebpf(&ebpf::BuildEbpfOptions::default())?;
    cmd::run(
        cmd::cargo()
            .args(["build", "--release", "-p", "cudatrace", "--locked"])
            .current_dir(&root),
        "cargo build --release -p cudatrace --locked",
    )?;
    let standin_dir = standin::out_dir(&root);
    standin::build(&root, &standin_dir)?;
    standin::build_program(&root, &standin_dir, LOOP_PROGRAM, "bench_loop.c")?;

    let env = Env {
        out: root.join("target/bench"),
        cudatrace: root.join("target/release/cudatrace"),
        libcuda: fs::canonicalize(standin_dir.join("libcuda.so.1"))?,
        bench_loop: standin_dir.join(LOOP_PROGRAM),
        standin: standin_dir,
        threads: thread::available_parallelism().map_or(2, |n| n.get() as u64),
    };
    fs::create_dir_all(&env.out)?;
    let tracefs = tracefs_dir()?;
    remove_stale_probes(&tracefs)?;

    let machine = Machine::read();
    let date = cmd::stdout(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]))
        .map(|d| d.trim().to_owned())
        .unwrap_or_default();
    let started = Instant::now();
    let mut parts = Parts::default();
    let outcome = run_parts(&env, opts, &tracefs, &mut parts);
    let results = Results {
        date,
        machine,
        options: RunOptions {
            calls: opts.calls,
            rounds: opts.rounds,
            rate_seconds: opts.rate_seconds,
            resource_calls: opts.resource_calls,
            trace_events: opts.trace_events,
            trace_rounds: opts.trace_rounds,
            threads: env.threads,
        },
        function: FUNCTION.into(),
        libcuda: env.libcuda.clone(),
        overhead: parts.overhead,
        rate: parts.rate,
        resources: parts.resources,
        trace: parts.trace,
        stacks: parts.stacks,
        gpu: parts.gpu,
        // Whatever happened, nothing of ours may stay in tracefs.
        tracefs_after: TracefsAfter::read(&tracefs)?,
        bench_seconds: started.elapsed().as_secs_f64(),
    };
    let path = env.out.join("results.json");
    fs::write(&path, serde_json::to_string_pretty(&results)? + "\n")?;
    outcome?;
    print!("{}", report::render(&results));
    println!("\nresults: {}", path.display());
    ensure!(
        results.tracefs_after.ours_left.is_empty(),
        "tracefs still has the bench's probes: {:?}",
        results.tracefs_after.ours_left
    );
    Ok(())
}

/// The results of the parts that ran.
#[derive(Default)]
struct Parts {
    overhead: Option<OverheadResults>,
    rate: Option<RateResults>,
    resources: Option<ResourceResults>,
    trace: Option<TraceToolResults>,
    stacks: Option<StacksResults>,
    gpu: Option<GpuResults>,
}

/// Runs the parts `--only` asks for, in order, into `parts`; stops at the first error.
fn run_parts(env: &Env, opts: &BenchOptions, tracefs: &Path, parts: &mut Parts) -> Result<()> {
    for &part in Part::value_variants() {
        if !(opts.only.is_empty() || opts.only.contains(&part)) {
            continue;
        }
        let name = part.to_possible_value().expect("no part is skipped");
        eprintln!("xtask: bench: {}", name.get_name());
        run_part(part, env, opts, tracefs, parts)
            .with_context(|| format!("bench part {}", name.get_name()))?;
    }
    Ok(())
}

fn run_part(
    part: Part,
    env: &Env,
    opts: &BenchOptions,
    tracefs: &Path,
    parts: &mut Parts,
) -> Result<()> {
    match part {
        Part::Overhead => {
            parts.overhead = Some(overhead::run(env, tracefs, opts.calls, opts.rounds)?);
        }
        Part::Rate => parts.rate = Some(rate::run(env, opts.rate_seconds)?),
        Part::Resources => parts.resources = Some(resources::run(env, opts.resource_calls)?),
        Part::Trace => {
            parts.trace = Some(trace_tools::run(
                env,
                opts.trace_events,
                opts.trace_rounds,
                opts.keep_trace,
            )?);
        }
        Part::Stacks => parts.stacks = Some(stacks::run(env, opts.rounds)?),
        Part::Gpu => parts.gpu = Some(gpu::run(env, opts.rounds)?),
    }
    Ok(())
}
