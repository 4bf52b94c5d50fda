//! The tables `cargo xtask bench` prints at the end, from results.json's types, and the
//! verdict on each of issue 7's targets.

use std::fmt::Write;

use super::{
    bench_loop::FUNCTION,
    gpu::GpuResults,
    overhead::{BASELINE, CONDITIONS, FLOOR, OverheadResults},
    rate::{RATE_TARGET, RateResults},
    resources::ResourceResults,
    results::Results,
    stacks::StacksResults,
    stats::Stats,
    trace_tools::{TOOLS, TraceToolResults},
};

/// Issue 7's targets.
const TARGET_FLOOR_RATIO: f64 = 1.25;
/// Issue 16: an untraced loop beside a traced command within 1% of untraced.
const TARGET_BYSTANDER_RATIO: f64 = 1.01;
const TARGET_RSS_MIB: f64 = 64.0;
const TARGET_SUMMARY_S: f64 = 20.0;
/// The condition whose ratio to the floor is issue 7's per-call target.
const TARGET_CONDITION: &str = "cudatrace";

/// One row of the targets table: what, the figure, and met (`None`: not comparable).
struct Target {
    target: String,
    measured: String,
    met: Option<bool>,
}

/// Every table, as printed.
pub fn render(results: &Results) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write_tables(&mut out, results);
    out
}

fn write_tables(out: &mut String, r: &Results) -> std::fmt::Result {
    let m = &r.machine;
    writeln!(
        out,
        "\ncudatrace bench, {}: {} x{} ({}), {:.0} GiB, Linux {}",
        r.date,
        m.cpu.as_deref().unwrap_or("?"),
        m.cpus.map_or("?".into(), |n| n.to_string()),
        if m.hypervisor == Some(true) {
            "VM"
        } else {
            "bare metal"
        },
        nan_if_none(m.mem_gib),
        m.kernel.as_deref().unwrap_or("?"),
    )?;
    let mut targets = Vec::new();
    if let Some(overhead) = &r.overhead {
        targets.extend(overhead_table(out, overhead)?);
    }
    if let Some(rate) = &r.rate {
        targets.push(rate_table(out, rate)?);
    }
    if let Some(resources) = &r.resources {
        targets.push(resources_table(out, resources)?);
    }
    if let Some(trace) = &r.trace {
        targets.push(trace_table(out, trace)?);
    }
    if let Some(stacks) = &r.stacks {
        stacks_table(out, stacks)?;
    }
    if let Some(gpu) = &r.gpu {
        gpu_table(out, gpu)?;
    }
    writeln!(out, "\n## Targets (issues 7 and 16)")?;
    writeln!(out, "| target | measured | |")?;
    writeln!(out, "|---|---|---|")?;
    for Target {
        target,
        measured,
        met,
    } in targets
    {
        let verdict = match met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "not comparable",
        };
        writeln!(out, "| {target} | {measured} | {verdict} |")?;
    }
    writeln!(
        out,
        "tracefs uprobe_events empty after the bench: {}",
        if r.tracefs_after.uprobe_events_empty {
            "yes"
        } else {
            "NO"
        }
    )
}

/// A Markdown table's header; the columns from `first_figure` on are right-aligned.
fn table_head(out: &mut String, columns: &[&str], first_figure: usize) -> std::fmt::Result {
    writeln!(out, "| {} |", columns.join(" | "))?;
    let rule: Vec<&str> = (0..columns.len())
        .map(|i| if i < first_figure { "---" } else { "---:" })
        .collect();
    writeln!(out, "|{}|", rule.join("|"))
}

fn nan_if_none(value: Option<f64>) -> f64 {
    value.unwrap_or(f64::NAN)
}

fn overhead_table(out: &mut String, o: &OverheadResults) -> Result<Vec<Target>, std::fmt::Error> {
    writeln!(
        out,
        "\n## Per-call cost: {FUNCTION} in a tight loop, 1 thread, {} calls per run, {} rounds interleaved; median [min-max]",
        o.calls_per_run, o.rounds
    )?;
    table_head(
        out,
        &[
            "condition",
            "ns/call",
            "added ns/call",
            "loop's sys ns/call",
            "IRQ-work+IPI per call",
        ],
        1,
    )?;
    let base = nan_if_none(
        o.conditions
            .get(BASELINE)
            .and_then(|c| c.ns_per_call.median),
    );
    for condition in CONDITIONS {
        let Some(s) = o.conditions.get(condition.key) else {
            continue;
        };
        writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.2} |",
            condition.label,
            s.ns_per_call.spread(1),
            nan_if_none(s.ns_per_call.median) - base,
            nan_if_none(s.sys_ns_per_call.median),
            nan_if_none(s.interrupts_per_call.median),
        )?;
    }
    let ratio = |key: &str| nan_if_none(o.added_ns_ratio_to_floor.get(key).copied().flatten());
    let ratios: Vec<String> = CONDITIONS
        .iter()
        // A condition an earlier run did not have is left out (a missing tracer is said).
        .filter(|c| c.compared_to_floor() && o.added_ns_ratio_to_floor.contains_key(c.key))
        .map(|c| {
            let per_round = o.added_ns_ratio_to_floor_per_round.get(c.key).cloned();
            // The usual floor goes unnamed; another is named after the ratio.
            let floor = if c.floor == FLOOR {
                String::new()
            } else {
                format!(" {}'s", c.floor)
            };
            format!(
                "{} {:.2}x{floor} (per round: {})",
                c.key,
                ratio(c.key),
                per_round
                    .flatten()
                    .unwrap_or_else(|| Stats::of(&[]))
                    .spread(2)
            )
        })
        .collect();
    writeln!(out, "added ns over the floor's: {}", ratios.join(", "))?;
    program_times(out, o, base)?;
    if !o.bpftrace_runs_redone.is_empty() {
        writeln!(
            out,
            "bpftrace runs redone: {} (why: results.json overhead.bpftrace_runs_redone)",
            o.bpftrace_runs_redone.len()
        )?;
    }
    // Per round: the two ran back to back. An untraced run lasts about a millisecond, so
    // one preemption spoils a round; the median of the rounds stands.
    let bystander_per_round = o.bystander_ratio_to_untraced_per_round.clone();
    let bystander = bystander_per_round.as_ref().and_then(|s| s.median);
    if let (Some(medians), Some(per_round)) = (o.bystander_ratio_to_untraced, &bystander_per_round)
    {
        writeln!(
            out,
            "bystander (an untraced loop beside a traced command) over untraced: per round {}, medians {medians:.3}x",
            per_round.spread(3)
        )?;
    }
    let ratio = ratio(TARGET_CONDITION);
    let mut targets = vec![Target {
        target: format!("per-call cost <= {TARGET_FLOOR_RATIO}x the tracefs floor"),
        measured: format!("{ratio:.2}x"),
        met: Some(ratio <= TARGET_FLOOR_RATIO),
    }];
    if let Some(ratio) = bystander {
        targets.push(Target {
            target: format!(
                "a bystander's per-call cost <= {TARGET_BYSTANDER_RATIO}x untraced (median of rounds)"
            ),
            measured: format!("{ratio:.3}x"),
            met: Some(ratio <= TARGET_BYSTANDER_RATIO),
        });
    }
    Ok(targets)
}

/// Where cudatrace's added ns go: its programs' run time per call (the kernel's statistics,
/// from the runs with them on), the rest being the traps and their kernel work.
fn program_times(out: &mut String, o: &OverheadResults, base: f64) -> std::fmt::Result {
    for condition in &o.conditions {
        let (key, results) = condition;
        let Some(first) = results.runs.first() else {
            continue;
        };
        if first.programs.is_empty() {
            continue;
        }
        let mut names: Vec<&String> = first.programs.keys().collect();
        names.sort();
        let mut parts = Vec::new();
        let mut total_per_call = Vec::new();
        for name in names {
            let per_run: Vec<f64> = results
                .runs
                .iter()
                .filter_map(|r| r.programs.get(name).map(|p| p.ns_per_run()))
                .collect();
            parts.push(format!("{name} {} ns/run", Stats::of(&per_run).spread(1)));
        }
        for run in &results.runs {
            let calls = run.report.traced_calls() as f64;
            total_per_call.push(
                run.programs
                    .values()
                    .map(|p| p.run_time_ns as f64)
                    .sum::<f64>()
                    / calls,
            );
        }
        let program = Stats::of(&total_per_call);
        let added = nan_if_none(results.ns_per_call.median) - base;
        writeln!(
            out,
            "{key}: {}; programs per call {} ns of the {added:.0} added (the rest: traps and their kernel work)",
            parts.join(", "),
            program.spread(1),
        )?;
    }
    Ok(())
}

fn rate_table(out: &mut String, rt: &RateResults) -> Result<Target, std::fmt::Error> {
    writeln!(
        out,
        "\n## Sustained rate under cudatrace: {} loop threads, paced by busy-wait, ~{:?} s per step",
        rt.threads, rt.seconds_per_step
    )?;
    table_head(
        out,
        &[
            "target calls/s",
            "achieved calls/s",
            "ring",
            "calls",
            "lost",
        ],
        0,
    )?;
    for s in rt.steps.iter().chain(&rt.smaller_rings_at_full_speed) {
        writeln!(
            out,
            "| {} | {:.0}{} | {} KiB | {} | {} |",
            s.target_calls_per_s,
            s.achieved_calls_per_s,
            if s.kept_pace { "" } else { " (max)" },
            s.ring_kib,
            s.calls,
            s.lost_calls,
        )?;
    }
    writeln!(
        out,
        "highest rate with 0 lost (16 MiB ring): {:.0} calls/s; first with loss: {}",
        rt.highest_achieved_calls_per_s_with_0_lost,
        rt.first_step_with_loss
            .as_ref()
            .map_or("none reached".into(), |s| format!(
                "{:.0} calls/s",
                s.achieved_calls_per_s
            ))
    )?;
    let at_target = rt
        .steps
        .iter()
        .find(|s| s.target_calls_per_s == RATE_TARGET);
    Ok(Target {
        target: format!("0 lost at {RATE_TARGET} calls/s"),
        measured: at_target.map_or("not run".into(), |s| {
            format!(
                "{:.0} calls/s reached, {} lost",
                s.achieved_calls_per_s, s.lost_calls
            )
        }),
        met: Some(at_target.is_some_and(|s| s.kept_pace && s.lost_calls == 0)),
    })
}

fn resources_table(out: &mut String, rs: &ResourceResults) -> Result<Target, std::fmt::Error> {
    let (idle, busy) = (&rs.idle, &rs.busy);
    writeln!(out, "\n## The cudatrace process while tracing")?;
    table_head(
        out,
        &[
            "run",
            "calls",
            "lost",
            "wall s",
            "peak RSS (VmHWM)",
            "tracer CPU",
        ],
        1,
    )?;
    writeln!(
        out,
        "| {} (idle) | - | - | {:.1} | {:.1} MiB | - |",
        idle.command, idle.wall_s, idle.peak_rss_mib
    )?;
    writeln!(
        out,
        "| {} | {} | {} | {:.1} | {:.1} MiB | {:.2} s ({:.0}% of a CPU, {:.0} ns/call) |",
        busy.command,
        busy.calls,
        busy.lost_calls,
        busy.wall_s,
        busy.peak_rss_mib,
        busy.tracer_cpu_s,
        busy.tracer_cpu_percent_of_one_cpu,
        busy.tracer_cpu_ns_per_call,
    )?;
    let parts: Vec<String> = busy
        .sampled
        .rss_breakdown_kib
        .iter()
        .filter(|(_, kib)| **kib >= 1024)
        .map(|(kind, kib)| format!("{kind} {:.1} MiB", *kib as f64 / 1024.0))
        .collect();
    writeln!(out, "RSS by mapping (busy): {}", parts.join(", "))?;
    let peak = busy.peak_rss_mib.max(idle.peak_rss_mib);
    Ok(Target {
        target: format!("tracer RSS <= {TARGET_RSS_MIB} MiB"),
        measured: format!("{peak:.1} MiB"),
        met: Some(peak <= TARGET_RSS_MIB),
    })
}

fn trace_table(out: &mut String, tt: &TraceToolResults) -> Result<Target, std::fmt::Error> {
    let summary = tt.tools.get("summary");
    writeln!(
        out,
        "\n## summary and export of a generated trace: {} calls, {:.2} GB (warm page cache); median [min-max] of {} runs",
        tt.events,
        tt.bytes as f64 / 1e9,
        summary.map_or(0, |s| s.wall_s.n)
    )?;
    if let Some(note) = &tt.scaled_note {
        writeln!(out, "NOTE: {note}")?;
    }
    table_head(
        out,
        &["command", "wall s", "CPU s", "Mevents/s", "peak RSS MiB"],
        1,
    )?;
    for tool in TOOLS {
        let Some(t) = tt.tools.get(tool.key) else {
            continue;
        };
        writeln!(
            out,
            "| {} | {} | {} | {:.2} | {} |",
            tool.label(),
            t.wall_s.spread(2),
            t.cpu_s.spread(2),
            nan_if_none(t.events_per_s) / 1e6,
            t.peak_rss_mib.spread(1),
        )?;
    }
    let wall = nan_if_none(summary.and_then(|s| s.wall_s.median));
    let scaled = tt.events != tt.requested_events;
    Ok(Target {
        target: format!("summary of 10M events < {TARGET_SUMMARY_S} s"),
        measured: format!(
            "{wall:.2} s for {} events{}",
            tt.events,
            if scaled { " (scaled down)" } else { "" }
        ),
        met: (!scaled).then_some(wall < TARGET_SUMMARY_S),
    })
}

/// `--stacks`: per call at each depth, and per frame walked. No target here: issue 23's
/// are measured on the GPU machine (BENCHMARKS.md).
fn stacks_table(out: &mut String, s: &StacksResults) -> std::fmt::Result {
    writeln!(
        out,
        "\n## --stacks ({} calls of cuCtxSynchronize through ctypes, {}, BPF statistics on)",
        s.calls, s.python
    )?;
    table_head(
        out,
        &[
            "depth",
            "frames walked",
            "memory reads",
            "bytes read",
            "run us/call",
            "--stacks us/call",
            "run program ns",
            "--stacks program ns",
            "added ns",
            "identities per frame: program ns",
            "added ns",
        ],
        1,
    )?;
    for d in &s.depths {
        let added = |with: Option<f64>| match (with, d.run_program_ns.median) {
            (Some(with), Some(without)) => format!("{:.0}", with - without),
            _ => "n/a".into(),
        };
        let ident = d.ident_program_ns.as_ref().and_then(|s| s.median);
        writeln!(
            out,
            "| {} | {:.1} | {} | {} | {:.2} | {:.2} | {:.0} | {:.0} | {} | {:.0} | {} |",
            d.depth,
            d.frames_per_call,
            d.reads_per_call
                .map_or_else(|| "n/a".to_owned(), |reads| format!("{reads:.1}")),
            d.read_bytes_per_call
                .map_or_else(|| "n/a".to_owned(), |bytes| format!("{bytes:.0}")),
            nan_if_none(d.run_us.median),
            nan_if_none(d.stacks_us.median),
            nan_if_none(d.run_program_ns.median),
            nan_if_none(d.stacks_program_ns.median),
            added(d.stacks_program_ns.median),
            nan_if_none(ident),
            added(ident),
        )?;
    }
    match s.program_ns_per_frame {
        Some(ns) => writeln!(out, "\nprogram time per frame walked: {ns:.0} ns"),
        None => writeln!(out, "\nprogram time per frame walked: n/a"),
    }
}

/// `run --gpu` on the stand-in libcupti: program time per launch, per batch of GPU records
/// and per record, each way. No target: issue 32's are measured on the GPU machine.
fn gpu_table(out: &mut String, g: &GpuResults) -> std::fmt::Result {
    writeln!(
        out,
        "\n## run --gpu ({} launches at {} a second, the stand-in libcupti, BPF statistics on)",
        g.calls, g.rate
    )?;
    table_head(
        out,
        &[
            "GPU records copied",
            "call program ns",
            "gpu_records ns a batch",
            "ns a record",
            "records a batch",
            "lost",
        ],
        1,
    )?;
    for w in &g.ways {
        writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.1} | {} |",
            w.way,
            nan_if_none(w.call_program_ns.median),
            nan_if_none(w.batch_program_ns.median),
            nan_if_none(w.record_program_ns.median),
            nan_if_none(w.records_per_batch.median),
            w.lost,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// results.json and the tables printed of a run before the bench was typed (2026-11-23,
    /// `--calls 20000 --rounds 2 --rate-seconds 1 --resource-calls 200000
    /// --trace-events 200000 --trace-rounds 1`).
    const RESULTS: &str = include_str!("testdata/results.json");
    const TABLES: &str = include_str!("testdata/report.txt");

    fn earlier_run() -> Results {
        serde_json::from_str(RESULTS).unwrap()
    }

    #[test]
    fn the_tables_of_an_earlier_run_are_printed_the_same_from_its_results() {
        let rendered = render(&earlier_run());
        for (line, (printed, expected)) in rendered.lines().zip(TABLES.lines()).enumerate() {
            assert_eq!(printed, expected, "line {}", line + 1);
        }
        assert_eq!(rendered, TABLES);
    }

    #[test]
    fn results_json_keeps_the_keys_of_an_earlier_run() {
        let earlier: serde_json::Value = serde_json::from_str(RESULTS).unwrap();
        let again = serde_json::to_value(earlier_run()).unwrap();
        assert_eq!(again, earlier);
    }

    #[test]
    fn a_missing_bpftrace_a_scaled_trace_and_leftover_probes_are_said() {
        let mut results = earlier_run();
        let overhead = results.overhead.as_mut().unwrap();
        overhead.conditions.remove("bpftrace");
        overhead
            .added_ns_ratio_to_floor
            .insert("bpftrace".into(), None);
        overhead
            .added_ns_ratio_to_floor_per_round
            .insert("bpftrace".into(), None);
        overhead.bpftrace_runs_redone = vec!["round 1: bpftrace did not stop".into()];
        let trace = results.trace.as_mut().unwrap();
        trace.requested_events = 10_000_000;
        trace.scaled_note = Some("only 1.0 GB free: scaled down".into());
        results.tracefs_after.uprobe_events_empty = false;
        results.rate = None;
        let tables = render(&results);
        assert!(!tables.contains("| bpftrace (entry/return pairing) |"));
        assert!(
            tables.contains(
                "bpftrace NaNx (per round: NaN [NaN-NaN])\nbpftrace runs redone: 1 (why:"
            )
        );
        assert!(!tables.contains("## Sustained rate"));
        assert!(!tables.contains("0 lost at 500000 calls/s"));
        assert!(tables.contains("NOTE: only 1.0 GB free: scaled down\n"));
        assert!(tables.contains(
            "| summary of 10M events < 20 s | 0.33 s for 200000 events (scaled down) | not comparable |"
        ));
        assert!(tables.ends_with("tracefs uprobe_events empty after the bench: NO\n"));
    }
}
