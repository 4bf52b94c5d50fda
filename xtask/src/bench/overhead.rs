//! Part 1, per-call overhead: ns per call of the loop's function in a tight loop, under each
//! condition of [`CONDITIONS`], interleaved round by round.

use std::{collections::BTreeMap, path::Path};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{
    bench_loop::{FUNCTION, LoopReport},
    env::Env,
    process::{check_interrupted, run_measured},
    procfs::{Interrupts, difference, interrupts},
    stats::Stats,
    tracefs::file_offset,
    tracers::{AttachPoint, Tracer},
};
use crate::cmd;

/// One way of running the loop: a row of the table and a key of results.json.
pub struct Condition {
    /// Its key under `overhead.conditions` in results.json.
    pub key: &'static str,
    /// Its row in the table.
    pub label: &'static str,
    pub tracer: Tracer,
    /// The floor its added ns are divided by: [`FLOOR`], or [`ENTRY_FLOOR`] for the
    /// conditions without a return probe.
    pub floor: &'static str,
}

/// The baseline every condition's added ns are counted from.
pub const BASELINE: &str = "untraced";
/// The floor the added ns of the other conditions are divided by.
pub const FLOOR: &str = "tracefs_uprobe_uretprobe";
/// The floor of the conditions without a return probe (`--launch-entry-only`): the
/// kernel's bare entry uprobe alone.
pub const ENTRY_FLOOR: &str = "tracefs_uprobe";
/// The untraced loop beside a traced command: compared with the baseline, not the floor.
pub const BYSTANDER: &str = "bystander";

/// The conditions, in the table's order; the rounds run them in this order, rotated.
pub const CONDITIONS: &[Condition] = &[
    Condition {
        key: BASELINE,
        label: "no tracing",
        tracer: Tracer::None,
        floor: FLOOR,
    },
    Condition {
        key: FLOOR,
        label: "tracefs uprobe+uretprobe (floor)",
        tracer: Tracer::TracefsFloor { returns: true },
        floor: FLOOR,
    },
    Condition {
        key: "cudatrace",
        label: "cudatrace run",
        tracer: Tracer::CudatraceRun {
            args: &[],
            trace: "overhead.jsonl",
            bpf_stats: false,
        },
        floor: FLOOR,
    },
    Condition {
        key: "cudatrace_bpf_stats",
        label: "cudatrace run, BPF stats on",
        tracer: Tracer::CudatraceRun {
            args: &[],
            trace: "overhead.jsonl",
            bpf_stats: true,
        },
        floor: FLOOR,
    },
    Condition {
        key: ENTRY_FLOOR,
        label: "tracefs uprobe alone (entry-only floor)",
        tracer: Tracer::TracefsFloor { returns: false },
        floor: ENTRY_FLOOR,
    },
    Condition {
        key: "cudatrace_lean",
        label: "cudatrace run --launch-entry-only",
        tracer: Tracer::CudatraceRun {
            args: &["--launch-entry-only"],
            trace: "overhead.jsonl",
            bpf_stats: false,
        },
        floor: ENTRY_FLOOR,
    },
    Condition {
        key: "cudatrace_lean_bpf_stats",
        label: "cudatrace run --launch-entry-only, BPF stats on",
        tracer: Tracer::CudatraceRun {
            args: &["--launch-entry-only"],
            trace: "overhead.jsonl",
            bpf_stats: true,
        },
        floor: ENTRY_FLOOR,
    },
    Condition {
        key: "bpftrace",
        label: "bpftrace (entry/return pairing)",
        tracer: Tracer::Bpftrace,
        floor: FLOOR,
    },
    Condition {
        key: BYSTANDER,
        label: "no tracing, beside `cudatrace run` of another command",
        tracer: Tracer::Bystander,
        floor: FLOOR,
    },
];

impl Condition {
    /// Compared with the floor: every condition but the baseline, the floor and the
    /// bystander.
    pub fn compared_to_floor(&self) -> bool {
        ![BASELINE, FLOOR, ENTRY_FLOOR, BYSTANDER].contains(&self.key)
    }
}

/// `overhead` in results.json.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct OverheadResults {
    pub calls_per_run: u64,
    pub rounds: usize,
    /// The file offset of the loop's function, where the tracefs uprobes attach.
    pub tracefs_offset: String,
    /// `bpftrace --version`; `None` where there is no bpftrace (its condition is skipped).
    pub bpftrace_version: Option<String>,
    /// Why bpftrace runs were run again.
    pub bpftrace_runs_redone: Vec<String>,
    /// By condition key; a skipped condition has none.
    pub conditions: BTreeMap<String, ConditionResults>,
    /// Each compared condition's added ns over its floor's added ns (`Condition::floor`),
    /// from the medians.
    pub added_ns_ratio_to_floor: BTreeMap<String, Option<f64>>,
    /// The same ratio within each round (a round's conditions ran back to back).
    pub added_ns_ratio_to_floor_per_round: BTreeMap<String, Option<Stats>>,
    /// The bystander's ns per call over the untraced loop's, from the medians (absent from
    /// runs before the condition existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bystander_ratio_to_untraced: Option<f64>,
    /// The same ratio within each round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bystander_ratio_to_untraced_per_round: Option<Stats>,
}

/// One condition's runs and their figures.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ConditionResults {
    pub label: String,
    pub ns_per_call: Stats,
    /// The loop's own system time per call.
    pub sys_ns_per_call: Stats,
    /// IRQ-work and IPI interrupts (all CPUs) per traced call.
    pub interrupts_per_call: Stats,
    pub runs: Vec<OverheadRun>,
}

/// One run of the loop under one condition.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct OverheadRun {
    #[serde(rename = "loop")]
    pub report: LoopReport,
    /// IRQ-work and IPI interrupts (all CPUs) from just before to just after the run.
    pub interrupts: Interrupts,
    /// Events the tracer recorded, checked against the calls made.
    pub recorded: Option<u64>,
    pub lost: Option<u64>,
    /// With `CUDATRACE_BPF_STATS=1`: each cudatrace program's run count and run time.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub programs: BTreeMap<String, ProgramRuns>,
}

/// One eBPF program's figures over a run, as cudatrace printed them.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ProgramRuns {
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

impl ProgramRuns {
    pub fn ns_per_run(&self) -> f64 {
        self.run_time_ns as f64 / self.run_cnt.max(1) as f64
    }
}

/// The `cudatrace: bpf-stats NAME id=N run_cnt=N run_time_ns=N ...` lines of a stderr.
pub fn parse_program_stats(stderr: &str) -> BTreeMap<String, ProgramRuns> {
    let mut programs = BTreeMap::new();
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix("cudatrace: bpf-stats ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let Some(name) = words.next() else { continue };
        let field = |key: &str| {
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.parse::<u64>().ok())
        };
        if let (Some(run_cnt), Some(run_time_ns)) = (field("run_cnt="), field("run_time_ns=")) {
            let entry = programs.entry(name.to_owned()).or_insert(ProgramRuns {
                run_cnt: 0,
                run_time_ns: 0,
            });
            entry.run_cnt += run_cnt;
            entry.run_time_ns += run_time_ns;
        }
    }
    programs
}

/// Runs every available condition `rounds` times with `calls` timed calls each.
pub fn run(env: &Env, tracefs: &Path, calls: u64, rounds: usize) -> Result<OverheadResults> {
    let offset = file_offset(&env.libcuda, FUNCTION)?;
    let bpftrace = cmd::stdout(std::process::Command::new("bpftrace").arg("--version"))
        .ok()
        .map(|v| v.trim().to_owned());
    if bpftrace.is_none() {
        eprintln!(
            "xtask: bench: bpftrace not found, its condition is skipped \
             (Debian: apt-get install -y bpftrace)"
        );
    }
    let conditions: Vec<&Condition> = CONDITIONS
        .iter()
        .filter(|c| c.tracer != Tracer::Bpftrace || bpftrace.is_some())
        .collect();
    let point = AttachPoint {
        env,
        tracefs,
        offset,
    };
    let mut runs: BTreeMap<&str, Vec<OverheadRun>> = BTreeMap::new();
    let mut redone = Vec::new();
    for round in 0..rounds {
        // Rotate the order so no condition always runs first or after the same one.
        let mut order = conditions.clone();
        order.rotate_left(round % conditions.len());
        for condition in order {
            let mut attempt = 0;
            let run = loop {
                attempt += 1;
                let result = run_once(&point, condition.tracer, calls)
                    .with_context(|| format!("round {}, {}", round + 1, condition.label));
                match result {
                    Ok(run) => break run,
                    Err(e) if attempt < condition.tracer.tries() => {
                        check_interrupted()?;
                        eprintln!("xtask: bench: {e:#}; running it again");
                        redone.push(format!("{e:#}"));
                    }
                    Err(e) => return Err(e),
                }
            };
            eprintln!(
                "xtask: bench: round {}/{} {:34} {:>10.1} ns/call",
                round + 1,
                rounds,
                condition.label,
                run.report.ns_per_call
            );
            runs.entry(condition.key).or_default().push(run);
        }
    }
    Ok(results(calls, rounds, offset, bpftrace, redone, &runs))
}

/// One run of the loop under `tracer`.
fn run_once(point: &AttachPoint, tracer: Tracer, calls: u64) -> Result<OverheadRun> {
    let env = point.env;
    let attached = tracer.attach(point)?;
    let loop_command = env.loop_command(&[calls]);
    let before = interrupts();
    let run = run_measured(&env.out, &mut attached.command(env, &loop_command), None);
    let after = interrupts();
    let runs_as = attached.runs_as();
    let stopped = attached.stop();
    let run = run?;
    let stopped = stopped?;
    run.ensure_ok(runs_as)?;
    let report = LoopReport::parse(&run.stdout)?;
    let programs = parse_program_stats(&run.stderr);
    let tally = stopped.tally(&report)?;
    Ok(OverheadRun {
        report,
        interrupts: difference(&before, &after),
        recorded: tally.recorded,
        lost: tally.lost,
        programs,
    })
}

/// The figures of every condition's runs, and the ratios to the floor.
fn results(
    calls: u64,
    rounds: usize,
    offset: u64,
    bpftrace: Option<String>,
    redone: Vec<String>,
    runs: &BTreeMap<&str, Vec<OverheadRun>>,
) -> OverheadResults {
    let mut conditions = BTreeMap::new();
    for condition in CONDITIONS {
        let Some(runs) = runs.get(condition.key) else {
            continue;
        };
        let figures =
            |f: &dyn Fn(&OverheadRun) -> f64| Stats::of(&runs.iter().map(f).collect::<Vec<_>>());
        conditions.insert(
            condition.key.to_owned(),
            ConditionResults {
                label: condition.label.to_owned(),
                ns_per_call: figures(&|r| r.report.ns_per_call),
                sys_ns_per_call: figures(&|r| r.report.sys_ns as f64 / r.report.calls as f64),
                interrupts_per_call: figures(&|r| {
                    r.interrupts.values().sum::<u64>() as f64 / r.report.traced_calls() as f64
                }),
                runs: runs.clone(),
            },
        );
    }
    let median = |key: &str| {
        conditions
            .get(key)
            .and_then(|c: &ConditionResults| c.ns_per_call.median)
    };
    let base = median(BASELINE).unwrap_or(0.0);
    let per_round = |key: &str, floor: &str| {
        let (Some(runs), Some(floors), Some(bases)) =
            (runs.get(key), runs.get(floor), runs.get(BASELINE))
        else {
            return None;
        };
        let ratios: Vec<f64> = runs
            .iter()
            .zip(floors)
            .zip(bases)
            .map(|((r, fl), b)| {
                (r.report.ns_per_call - b.report.ns_per_call)
                    / (fl.report.ns_per_call - b.report.ns_per_call)
            })
            .collect();
        Some(Stats::of(&ratios))
    };
    let compared = CONDITIONS.iter().filter(|c| c.compared_to_floor());
    let bystander_per_round = match (runs.get(BYSTANDER), runs.get(BASELINE)) {
        (Some(bystander), Some(bases)) => Some(Stats::of(
            &bystander
                .iter()
                .zip(bases)
                .map(|(r, b)| r.report.ns_per_call / b.report.ns_per_call)
                .collect::<Vec<_>>(),
        )),
        _ => None,
    };
    OverheadResults {
        bystander_ratio_to_untraced: median(BYSTANDER)
            .map(|v| v / base)
            .filter(|r| r.is_finite()),
        bystander_ratio_to_untraced_per_round: bystander_per_round,
        calls_per_run: calls,
        rounds,
        tracefs_offset: format!("0x{offset:x}"),
        bpftrace_version: bpftrace,
        bpftrace_runs_redone: redone,
        added_ns_ratio_to_floor: compared
            .clone()
            .map(|c| {
                let floor = median(c.floor).unwrap_or(f64::NAN);
                let ratio = median(c.key).map(|v| (v - base) / (floor - base));
                // JSON has no NaN: a ratio that is not a number is null.
                (c.key.to_owned(), ratio.filter(|r| r.is_finite()))
            })
            .collect(),
        added_ns_ratio_to_floor_per_round: compared
            .map(|c| (c.key.to_owned(), per_round(c.key, c.floor)))
            .collect(),
        conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_at(ns_per_call: f64) -> OverheadRun {
        OverheadRun {
            report: LoopReport {
                calls: 1000,
                threads: 1,
                ns: (ns_per_call * 1000.0) as u64,
                ns_per_call,
                calls_per_s: 1e9 / ns_per_call,
                user_ns: 0,
                sys_ns: 500,
                process_cpu_ns: 0,
            },
            interrupts: [("IWI".to_owned(), 20), ("RES".to_owned(), 2)].into(),
            recorded: None,
            lost: None,
            programs: BTreeMap::new(),
        }
    }

    #[test]
    fn each_condition_has_its_own_key_and_the_references_are_there() {
        let keys: Vec<&str> = CONDITIONS.iter().map(|c| c.key).collect();
        assert_eq!(
            keys,
            [
                "untraced",
                "tracefs_uprobe_uretprobe",
                "cudatrace",
                "cudatrace_bpf_stats",
                "tracefs_uprobe",
                "cudatrace_lean",
                "cudatrace_lean_bpf_stats",
                "bpftrace",
                "bystander"
            ]
        );
        let compared: Vec<(&str, &str)> = CONDITIONS
            .iter()
            .filter(|c| c.compared_to_floor())
            .map(|c| (c.key, c.floor))
            .collect();
        assert_eq!(
            compared,
            [
                ("cudatrace", FLOOR),
                ("cudatrace_bpf_stats", FLOOR),
                ("cudatrace_lean", ENTRY_FLOOR),
                ("cudatrace_lean_bpf_stats", ENTRY_FLOOR),
                ("bpftrace", FLOOR)
            ]
        );
    }

    #[test]
    fn program_stats_lines_are_read_and_summed_by_name() {
        let stderr = "loop output\n\
            cudatrace: bpf-stats call_enter id=12 run_cnt=201000 run_time_ns=20100000 ns_per_run=100.0\n\
            cudatrace: bpf-stats call_return id=13 run_cnt=201000 run_time_ns=30150000 ns_per_run=150.0\n\
            cudatrace: bpf-stats call_return id=14 run_cnt=0 run_time_ns=0 ns_per_run=0.0\n";
        let programs = parse_program_stats(stderr);
        assert_eq!(programs.len(), 2);
        assert_eq!(programs["call_enter"].run_cnt, 201000);
        assert_eq!(programs["call_enter"].ns_per_run(), 100.0);
        assert_eq!(programs["call_return"].run_time_ns, 30150000);
        assert_eq!(programs["call_return"].ns_per_run(), 150.0);
    }

    #[test]
    fn added_ns_are_divided_by_the_floors_from_the_medians_and_per_round() {
        let runs: BTreeMap<&str, Vec<OverheadRun>> = [
            (BASELINE, vec![run_at(3.0), run_at(5.0)]),
            (FLOOR, vec![run_at(1003.0), run_at(2005.0)]),
            ("cudatrace", vec![run_at(1103.0), run_at(2005.0)]),
            (ENTRY_FLOOR, vec![run_at(503.0), run_at(1005.0)]),
            ("cudatrace_lean", vec![run_at(553.0), run_at(1005.0)]),
            (BYSTANDER, vec![run_at(3.3), run_at(5.0)]),
        ]
        .into();
        let results = results(1000, 2, 0x3280, None, Vec::new(), &runs);
        assert_eq!(results.tracefs_offset, "0x3280");
        // Medians: base 4, floor 1504, cudatrace 1554: (1554 - 4) / (1504 - 4).
        let ratio = results.added_ns_ratio_to_floor["cudatrace"].unwrap();
        assert!((ratio - 1550.0 / 1500.0).abs() < 1e-12, "{ratio}");
        let per_round = results.added_ns_ratio_to_floor_per_round["cudatrace"]
            .clone()
            .unwrap();
        assert_eq!(per_round.values, Some(vec![Some(1.1), Some(1.0)]));
        // The lean mode over its own floor: medians (779 - 4) / (754 - 4); 1.1, 1.0.
        let lean = results.added_ns_ratio_to_floor["cudatrace_lean"].unwrap();
        assert!((lean - 775.0 / 750.0).abs() < 1e-12, "{lean}");
        let lean_per_round = results.added_ns_ratio_to_floor_per_round["cudatrace_lean"]
            .clone()
            .unwrap();
        assert_eq!(lean_per_round.values, Some(vec![Some(1.1), Some(1.0)]));
        // bpftrace did not run: no condition, and null ratios under its key.
        assert!(!results.conditions.contains_key("bpftrace"));
        assert_eq!(results.added_ns_ratio_to_floor["bpftrace"], None);
        assert_eq!(results.added_ns_ratio_to_floor_per_round["bpftrace"], None);
        // The bystander against the baseline: medians 4.15 / 4, and 1.1, 1.0 per round.
        let bystander = results.bystander_ratio_to_untraced.unwrap();
        assert!((bystander - 4.15 / 4.0).abs() < 1e-12, "{bystander}");
        assert_eq!(
            results
                .bystander_ratio_to_untraced_per_round
                .unwrap()
                .values
                .unwrap()
                .len(),
            2
        );
        assert!(!results.added_ns_ratio_to_floor.contains_key(BYSTANDER));
        let untraced = &results.conditions[BASELINE];
        assert_eq!(untraced.label, "no tracing");
        assert_eq!(untraced.sys_ns_per_call.median, Some(0.5));
        // 22 interrupts over 1000 calls and 1000 warm-up calls.
        assert_eq!(untraced.interrupts_per_call.median, Some(22.0 / 2000.0));
    }
}
