//! `cargo xtask bench`: the no-GPU benchmarks of issue 7, against the stand-in libcuda.
//!
//! Four parts, each printed as a table at the end and written to target/bench/results.json
//! (BENCHMARKS.md says what each measures and shows a run):
//!
//! - **overhead**: ns per call of `cuCtxSynchronize` in a tight loop
//!   (`cudatrace-bench-loop`, standin/bench_loop.c) untraced, under the kernel's bare tracefs
//!   uprobe + uretprobe, under `cudatrace run` and under bpftrace, interleaved round by round;
//! - **rate**: the loop paced at increasing call rates under `cudatrace run`, with the lost
//!   calls from the trace footer;
//! - **resources**: peak RSS and CPU time of the `cudatrace` process while it traces;
//! - **trace**: `cudatrace summary` and `cudatrace export` on a generated trace of 10M calls.
//!
//! Nothing here asserts a timing: targets are reported as met or missed, never failed on.

mod bench_loop;
mod bpftrace;
mod cudatrace;
mod env;
mod generated_trace;
mod overhead;
mod process;
mod procfs;
mod rate;
mod resources;
mod stats;
mod trace_tools;
mod tracefs;
mod tracers;

use std::{fs, path::Path, process::Command, thread, time::Instant};

use anyhow::{Result, bail, ensure};
use serde::Deserialize;
use serde_json::{Value, json};

use self::{
    bench_loop::{FUNCTION, LOOP_PROGRAM},
    env::Env,
    overhead::CONDITIONS,
    procfs::Machine,
    rate::RATE_TARGET,
    stats::Stats,
    tracefs::{TracefsAfter, remove_stale_probes, tracefs_dir},
};
use crate::{cmd, ebpf, standin};

/// Issue 7's targets.
const TARGET_FLOOR_RATIO: f64 = 1.25;
const TARGET_RSS_MIB: f64 = 64.0;
const TARGET_SUMMARY_S: f64 = 20.0;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchOptions {
    /// Timed calls per overhead run (each condition, each round).
    #[arg(long, default_value_t = 200_000)]
    pub calls: u64,
    /// Rounds of the four overhead conditions, interleaved (the order rotates each round).
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
    let wants = |part| opts.only.is_empty() || opts.only.contains(&part);

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
    let mut results = json!({
        "date": date,
        "machine": machine,
        "options": {
            "calls": opts.calls, "rounds": opts.rounds, "rate_seconds": opts.rate_seconds,
            "resource_calls": opts.resource_calls, "trace_events": opts.trace_events,
            "trace_rounds": opts.trace_rounds, "threads": env.threads,
        },
        "function": FUNCTION,
        "libcuda": env.libcuda,
    });
    let started = Instant::now();
    let mut outcome = Ok(());
    for (part, run) in [
        (
            Part::Overhead,
            (|env, opts, tracefs| {
                Ok(serde_json::to_value(overhead::run(
                    env,
                    tracefs,
                    opts.calls,
                    opts.rounds,
                )?)?)
            }) as fn(&Env, &BenchOptions, &Path) -> Result<Value>,
        ),
        (Part::Rate, |env, opts, _| {
            Ok(serde_json::to_value(rate::run(env, opts.rate_seconds)?)?)
        }),
        (Part::Resources, |env, opts, _| {
            Ok(serde_json::to_value(resources::run(
                env,
                opts.resource_calls,
            )?)?)
        }),
        (Part::Trace, |env, opts, _| {
            Ok(serde_json::to_value(trace_tools::run(
                env,
                opts.trace_events,
                opts.trace_rounds,
                opts.keep_trace,
            )?)?)
        }),
    ] {
        if !wants(part) {
            continue;
        }
        let key = format!("{part:?}").to_lowercase();
        eprintln!("xtask: bench: {key}");
        match run(&env, opts, &tracefs) {
            Ok(value) => results[key] = value,
            Err(e) => {
                outcome = Err(e.context(format!("bench part {key}")));
                break;
            }
        }
    }
    // Whatever happened, nothing of ours may stay in tracefs.
    let tracefs_after = TracefsAfter::read(&tracefs)?;
    results["tracefs_after"] = serde_json::to_value(&tracefs_after)?;
    results["bench_seconds"] = json!(started.elapsed().as_secs_f64());
    let path = env.out.join("results.json");
    fs::write(&path, serde_json::to_string_pretty(&results)? + "\n")?;
    outcome?;
    print_tables(&results);
    println!("\nresults: {}", path.display());
    ensure!(
        tracefs_after.ours_left.is_empty(),
        "tracefs still has the bench's probes: {:?}",
        tracefs_after.ours_left
    );
    Ok(())
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// `median [min-max]` of a stats object.
fn spread(s: &Value, digits: usize) -> String {
    Stats::deserialize(s)
        .unwrap_or_else(|_| Stats::of(&[]))
        .spread(digits)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn print_tables(r: &Value) {
    let m = &r["machine"];
    println!(
        "\ncudatrace bench, {}: {} x{} ({}), {:.0} GiB, Linux {}",
        r["date"].as_str().unwrap_or(""),
        m["cpu"].as_str().unwrap_or("?"),
        m["cpus"],
        if m["hypervisor"] == true {
            "VM"
        } else {
            "bare metal"
        },
        f(&m["mem_gib"]),
        m["kernel"].as_str().unwrap_or("?"),
    );
    let mut targets: Vec<(String, String, Option<bool>)> = Vec::new();
    let o = &r["overhead"];
    if o.is_object() {
        println!(
            "\n## Per-call cost: {FUNCTION} in a tight loop, 1 thread, {} calls per run, {} rounds interleaved; median [min-max]",
            o["calls_per_run"], o["rounds"]
        );
        println!(
            "| condition | ns/call | added ns/call | loop's sys ns/call | IRQ-work+IPI per call |"
        );
        println!("|---|---:|---:|---:|---:|");
        let base = f(&o["conditions"]["untraced"]["ns_per_call"]["median"]);
        for c in CONDITIONS {
            let s = &o["conditions"][c.key];
            if !s.is_object() {
                continue;
            }
            println!(
                "| {} | {} | {:.0} | {:.0} | {:.2} |",
                c.label,
                spread(&s["ns_per_call"], 1),
                f(&s["ns_per_call"]["median"]) - base,
                f(&s["sys_ns_per_call"]["median"]),
                f(&s["interrupts_per_call"]["median"]),
            );
        }
        let ratio = f(&o["added_ns_ratio_to_floor"]["cudatrace"]);
        let per_round = &o["added_ns_ratio_to_floor_per_round"];
        println!(
            "added ns over the floor's: cudatrace {ratio:.2}x (per round: {}), bpftrace {:.2}x (per round: {})",
            spread(&per_round["cudatrace"], 2),
            f(&o["added_ns_ratio_to_floor"]["bpftrace"]),
            spread(&per_round["bpftrace"], 2),
        );
        if let Some(redone) = o["bpftrace_runs_redone"]
            .as_array()
            .filter(|r| !r.is_empty())
        {
            println!(
                "bpftrace runs redone: {} (why: results.json overhead.bpftrace_runs_redone)",
                redone.len()
            );
        }
        targets.push((
            format!("per-call cost <= {TARGET_FLOOR_RATIO}x the tracefs floor"),
            format!("{ratio:.2}x"),
            Some(ratio <= TARGET_FLOOR_RATIO),
        ));
    }
    let rt = &r["rate"];
    if rt.is_object() {
        println!(
            "\n## Sustained rate under cudatrace: {} loop threads, paced by busy-wait, ~{} s per step",
            rt["threads"], rt["seconds_per_step"]
        );
        println!("| target calls/s | achieved calls/s | ring | calls | lost |");
        println!("|---:|---:|---:|---:|---:|");
        let rows = rt["steps"].as_array().into_iter().flatten().chain(
            rt["smaller_rings_at_full_speed"]
                .as_array()
                .into_iter()
                .flatten(),
        );
        for s in rows {
            println!(
                "| {} | {:.0}{} | {} KiB | {} | {} |",
                s["target_calls_per_s"],
                f(&s["achieved_calls_per_s"]),
                if s["kept_pace"] == true { "" } else { " (max)" },
                s["ring_kib"],
                s["calls"],
                s["lost_calls"],
            );
        }
        let highest = f(&rt["highest_achieved_calls_per_s_with_0_lost"]);
        let first_loss = &rt["first_step_with_loss"];
        println!(
            "highest rate with 0 lost (16 MiB ring): {highest:.0} calls/s; first with loss: {}",
            if first_loss.is_object() {
                format!("{:.0} calls/s", f(&first_loss["achieved_calls_per_s"]))
            } else {
                "none reached".into()
            }
        );
        let at_target = rt["steps"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["target_calls_per_s"] == RATE_TARGET));
        let met = at_target.is_some_and(|s| s["kept_pace"] == true && s["lost_calls"] == 0);
        targets.push((
            format!("0 lost at {RATE_TARGET} calls/s"),
            at_target.map_or("not run".into(), |s| {
                format!(
                    "{:.0} calls/s reached, {} lost",
                    f(&s["achieved_calls_per_s"]),
                    s["lost_calls"]
                )
            }),
            Some(met),
        ));
    }
    let rs = &r["resources"];
    if rs.is_object() {
        let busy = &rs["busy"];
        let idle = &rs["idle"];
        println!("\n## The cudatrace process while tracing");
        println!("| run | calls | lost | wall s | peak RSS (VmHWM) | tracer CPU |");
        println!("|---|---:|---:|---:|---:|---:|");
        println!(
            "| {} (idle) | - | - | {:.1} | {:.1} MiB | - |",
            idle["command"].as_str().unwrap_or(""),
            f(&idle["wall_s"]),
            f(&idle["peak_rss_mib"])
        );
        println!(
            "| {} | {} | {} | {:.1} | {:.1} MiB | {:.2} s ({:.0}% of a CPU, {:.0} ns/call) |",
            busy["command"].as_str().unwrap_or(""),
            busy["calls"],
            busy["lost_calls"],
            f(&busy["wall_s"]),
            f(&busy["peak_rss_mib"]),
            f(&busy["tracer_cpu_s"]),
            f(&busy["tracer_cpu_percent_of_one_cpu"]),
            f(&busy["tracer_cpu_ns_per_call"]),
        );
        let breakdown = &busy["sampled"]["rss_breakdown_kib"];
        if let Some(map) = breakdown.as_object() {
            let parts: Vec<String> = map
                .iter()
                .filter(|(_, v)| v.as_u64().unwrap_or(0) >= 1024)
                .map(|(k, v)| format!("{k} {:.1} MiB", v.as_u64().unwrap_or(0) as f64 / 1024.0))
                .collect();
            println!("RSS by mapping (busy): {}", parts.join(", "));
        }
        let peak = f(&busy["peak_rss_mib"]).max(f(&idle["peak_rss_mib"]));
        targets.push((
            format!("tracer RSS <= {TARGET_RSS_MIB} MiB"),
            format!("{peak:.1} MiB"),
            Some(peak <= TARGET_RSS_MIB),
        ));
    }
    let tt = &r["trace"];
    if tt.is_object() {
        println!(
            "\n## summary and export of a generated trace: {} calls, {:.2} GB (warm page cache); median [min-max] of {} runs",
            tt["events"],
            f(&tt["bytes"]) / 1e9,
            tt["tools"]["summary"]["wall_s"]["n"]
        );
        if let Some(note) = tt["scaled_note"].as_str() {
            println!("NOTE: {note}");
        }
        println!("| command | wall s | CPU s | Mevents/s | peak RSS MiB |");
        println!("|---|---:|---:|---:|---:|");
        for (key, label) in [
            ("summary", "cudatrace summary"),
            (
                "export_chrome",
                "cudatrace export --format chrome -o /dev/null",
            ),
            (
                "export_perfetto",
                "cudatrace export --format perfetto -o /dev/null",
            ),
        ] {
            let t = &tt["tools"][key];
            println!(
                "| {label} | {} | {} | {:.2} | {} |",
                spread(&t["wall_s"], 2),
                spread(&t["cpu_s"], 2),
                f(&t["events_per_s"]) / 1e6,
                spread(&t["peak_rss_mib"], 1),
            );
        }
        let wall = f(&tt["tools"]["summary"]["wall_s"]["median"]);
        let scaled = tt["events"] != tt["requested_events"];
        targets.push((
            format!("summary of 10M events < {TARGET_SUMMARY_S} s"),
            format!(
                "{wall:.2} s for {} events{}",
                tt["events"],
                if scaled { " (scaled down)" } else { "" }
            ),
            (!scaled).then_some(wall < TARGET_SUMMARY_S),
        ));
    }
    println!("\n## Targets (issue 7)");
    println!("| target | measured | |");
    println!("|---|---|---|");
    for (target, measured, met) in targets {
        println!(
            "| {target} | {measured} | {} |",
            met.map_or("not comparable", verdict)
        );
    }
    println!(
        "tracefs uprobe_events empty after the bench: {}",
        if r["tracefs_after"]["uprobe_events_empty"] == true {
            "yes"
        } else {
            "NO"
        }
    );
}
