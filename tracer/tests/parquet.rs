//! `cudatrace export --format parquet` read by a real consumer: DuckDB's own Python
//! package, pinned and fetched at test time (`tests/parquet/duckdb_query.py`, cached under
//! target/). For each trace, DuckDB's answers over the tables equal `summary --json`'s
//! figures: per-function counts, errors and time, kernel launches, bytes copied by
//! direction, collectives per communicator, rank and op, energy per GPU. Then a job of two
//! traces queried together (the README's straggler query, run as the README prints it),
//! and what the export refuses.

mod common;
mod traces;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use common::*;
use serde_json::{Value, json};

// ---- DuckDB ----

/// Each query's rows, from DuckDB.
fn duckdb(queries: &[String]) -> Vec<Vec<Value>> {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("duckdb");
    let mut child = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/parquet/duckdb_query.py"
        ))
        .arg(&cache)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running python3 tests/parquet/duckdb_query.py");
    let input = serde_json::to_vec(&json!({ "queries": queries })).unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &input).unwrap();
    drop(child.stdin.take());
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "DuckDB failed (exit {:?}):\n{}",
        output.status.code(),
        stderr(&output)
    );
    let answer: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(answer["duckdb"], "1.5.6");
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rows| rows.as_array().unwrap().clone())
        .collect()
}

/// A query and the rows it must return, in any order.
struct Check {
    what: &'static str,
    sql: String,
    rows: Vec<Value>,
}

fn assert_checks(checks: Vec<Check>) {
    let answers = duckdb(&checks.iter().map(|c| c.sql.clone()).collect::<Vec<_>>());
    let mut failures = Vec::new();
    for (check, mut got) in checks.into_iter().zip(answers) {
        let mut want = check.rows;
        let key = |v: &Value| v.to_string();
        got.sort_by_key(key);
        want.sort_by_key(key);
        if got != want {
            failures.push(format!(
                "{}:\n  {}\n  DuckDB: {got:?}\n  summary: {want:?}",
                check.what, check.sql
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---- cudatrace ----

fn export(trace: &Path, out: &Path, extra: &[&str]) -> Output {
    Command::new(CUDATRACE)
        .args(["export", "--format", "parquet"])
        .arg(trace)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

fn exported(trace: &Path) -> PathBuf {
    let out = trace.with_extension("parquet");
    let _ = std::fs::remove_dir_all(&out);
    let output = export(trace, &out, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    out
}

fn summary_json(trace: &Path) -> Value {
    let output = Command::new(CUDATRACE)
        .args(["summary", "--json"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    serde_json::from_slice(&output.stdout).unwrap()
}

fn write_trace(name: &str, text: &str) -> PathBuf {
    let path = scratch(&format!("parquet-{name}")).join("trace.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

/// The sections of `summary --json` that only some traces have.
const SECTIONS: [&str; 2] = ["collectives", "power"];

/// `value`'s `key`, which `summary --json` must have written.
fn key<'a>(value: &'a Value, key: &str) -> &'a Value {
    value
        .get(key)
        .unwrap_or_else(|| panic!("summary --json: no `{key}` in {value}"))
}

/// DuckDB's figures over `trace`'s tables against `summary --json`'s; `sections` are those
/// of [`SECTIONS`] the trace has, and the summary must have them (and not the others).
fn summary_checks(trace: &Path, sections: &[&str]) -> Vec<Check> {
    let summary = summary_json(trace);
    for section in SECTIONS {
        assert_eq!(
            summary.get(section).is_some(),
            sections.contains(&section),
            "{}: the `{section}` section of summary --json (expected: {sections:?})",
            trace.display()
        );
    }
    let dir = exported(trace);
    let table = |name: &str| format!("'{}'", dir.join(format!("{name}.parquet")).display());
    let rows = |name: &str, f: &dyn Fn(&Value) -> Value| -> Vec<Value> {
        let items = key(&summary, name).as_array();
        let items = items.unwrap_or_else(|| panic!("summary --json: `{name}` is not a list"));
        items.iter().map(f).collect()
    };
    let mut checks = vec![
        Check {
            what: "calls, errors, span",
            sql: format!(
                "select count(*), count(*) filter (not ok), count(distinct pid) from {}",
                table("calls")
            ),
            rows: vec![json!([
                summary["calls"],
                summary["errors"],
                summary["pids"].as_array().map_or(0, Vec::len)
            ])],
        },
        Check {
            what: "per function: count, errors, total time",
            sql: format!(
                "select name, count(*), count(*) filter (not ok), coalesce(sum(dur_ns), 0) \
                 from {} group by name",
                table("calls")
            ),
            rows: rows("functions", &|f| {
                json!([f["name"], f["count"], f["errors"], f["total_ns"]])
            }),
        },
        Check {
            what: "kernel launches per kernel",
            sql: format!(
                "select kernel, count(*) from {} where family = 'launch' and ok \
                 and kernel is not null group by kernel",
                table("calls")
            ),
            rows: rows("kernels", &|k| json!([k["kernel"], k["launches"]])),
        },
        Check {
            what: "kernel launches in all",
            sql: format!(
                "select count(*) from {} where family = 'launch' and ok and kernel is not null",
                table("calls")
            ),
            rows: vec![json!([summary["kernel_launches"]])],
        },
        Check {
            what: "bytes copied by direction",
            sql: format!(
                "select kind, count(*), sum(bytes) from {} where ok group by kind",
                table("copies")
            ),
            rows: rows("copies", &|c| json!([c["kind"], c["count"], c["bytes"]])),
        },
    ];
    if let Some(collectives) = summary.get("collectives") {
        let collective_rows = key(collectives, "rows").as_array().unwrap();
        // A `--gpu` trace's collectives have their kernels' time.
        let gpu = summary.get("gpu").is_some();
        let gpu_sql = if gpu { ", sum(gpu_ns)" } else { "" };
        checks.push(Check {
            what: "collectives per communicator, rank, process and op",
            // The summary's row is a communicator's op in a process, with the rank known
            // (a split child's is not known until the program asks).
            sql: format!(
                "select comm_id, min(comm_rank), min(comm_nranks), pid, op, \
                 count(*) filter (ok), count(*) filter (not ok), \
                 count(*) filter (ok and \"group\" is not null), \
                 coalesce(sum(bytes) filter (ok), 0), coalesce(sum(dur_ns) filter (ok), 0)\
                 {gpu_sql} from {} group by comm_id, pid, op",
                table("collectives")
            ),
            rows: collective_rows
                .iter()
                .map(|r| {
                    let mut columns = vec![
                        "communicator",
                        "rank",
                        "nranks",
                        "pid",
                        "op",
                        "calls",
                        "errors",
                        "grouped",
                        "bytes",
                        "host_ns",
                    ];
                    if gpu {
                        columns.push("gpu_ns");
                    }
                    columns.iter().map(|c| key(r, c).clone()).collect()
                })
                .collect(),
        });
    }
    if let Some(power) = summary.get("power") {
        // GPUs whose energy is the counter's: its last reading less its first.
        checks.push(Check {
            what: "energy per GPU (counter)",
            sql: format!(
                "select device, (max(energy_mj) - min(energy_mj)) / 1000.0 from {} \
                 group by device having count(energy_mj) > 0",
                table("power")
            ),
            rows: key(power, "devices")
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| key(d, "energy_source") == "counter")
                .map(|d| json!([key(d, "index"), key(d, "energy_j")]))
                .collect(),
        });
    }
    checks
}

// ---- the tests ----

#[test]
fn hand_written_traces_give_the_summarys_figures_in_duckdb() {
    let mut checks = Vec::new();
    for (name, text, sections) in [
        ("known", traces::known(), &[][..]),
        // Without its footer: a trace cut short.
        (
            "inference",
            format!("{}\n{}", traces::INFERENCE_HEADER, traces::inference(30)),
            &[],
        ),
        ("power", traces::power(), &["power"]),
        ("gpu", traces::gpu(), &[]),
        ("gpu-power", traces::gpu_power(), &["power"]),
        ("nccl-gpu", traces::nccl_gpu(), &["collectives"]),
    ] {
        checks.extend(summary_checks(&write_trace(name, &text), sections));
    }
    assert_checks(checks);
}

/// A `--stacks --gpu` trace: GPU time and calls per Python line, from `kernels`, `calls`
/// and `stacks` joined as docs/trace-format.md shows, equal `summary --json`'s by line.
#[test]
fn python_lines_gpu_time_in_duckdb_is_the_summarys() {
    let trace = write_trace("stacks", &traces::stacks());
    let summary = summary_json(&trace);
    let dir = exported(&trace);
    let table = |name: &str| format!("'{}'", dir.join(format!("{name}.parquet")).display());
    let lines = summary["stacks"]["lines"].as_array().unwrap();
    let by_line = |key: &str| -> Vec<Value> {
        lines
            .iter()
            .filter(|row| row["name"] != "(no stack)" && row[key].as_u64() > Some(0))
            .map(|row| json!([row["name"], row[key]]))
            .collect()
    };
    let frames: usize = traces::stacks()
        .lines()
        .filter(|line| line.contains(r#""type":"stack""#))
        .map(|line| line.matches(r#""qualname""#).count())
        .sum();
    assert_checks(vec![
        Check {
            what: "GPU time per Python line",
            sql: format!(
                "select s.file || ':' || s.line, sum(k.dur_ns) from {} k join {} c \
                 on c.trace = k.trace and c.pid = k.pid \
                 and c.tid = coalesce(k.capture_call_tid, k.call_tid) \
                 and c.ts_ns = coalesce(k.capture_call_ts_ns, k.call_ts_ns) \
                 join {} s on s.trace = c.trace and s.stack = c.stack and s.frame = 0 \
                 group by all",
                table("kernels"),
                table("calls"),
                table("stacks")
            ),
            rows: by_line("gpu_ns"),
        },
        Check {
            what: "calls per Python line",
            sql: format!(
                "select s.file || ':' || s.line, count(*) from {} c \
                 join {} s on s.trace = c.trace and s.stack = c.stack and s.frame = 0 \
                 group by all",
                table("calls"),
                table("stacks")
            ),
            rows: by_line("calls"),
        },
        Check {
            what: "every frame of every stack, the cut one marked",
            sql: format!(
                "select count(*), count(distinct stack), count(distinct stack) filter (cut) \
                 from {}",
                table("stacks")
            ),
            rows: vec![json!([frames, 5, 1])],
        },
    ]);
}

#[test]
fn recorded_traces_give_the_summarys_figures_in_duckdb() {
    let Some(_guard) = root() else { return };
    let dir = scratch("parquet-recorded");
    let mut traces = Vec::new();
    let demo = dir.join("demo.jsonl");
    let power = dir.join("power.jsonl");
    let gpu = dir.join("gpu.jsonl");
    // The demo with two stand-in GPUs' power (NOT NVIDIA's NVML), the second without an
    // energy counter; the stand-in driver's GPU work (a stand-in CUPTI).
    for (trace, flags, program, sections) in [
        // Exported as it ends, too (run --export).
        (
            &demo,
            vec!["--export".to_owned(), "parquet".to_owned()],
            vec![standin().demo.clone()],
            &[][..],
        ),
        (
            &power,
            vec![
                "--power=5".to_owned(),
                "--nvml".to_owned(),
                common::power::nvml_standin().lib.display().to_string(),
            ],
            vec![standin().demo.clone()],
            &["power"],
        ),
        (
            &gpu,
            vec![
                "--gpu".to_owned(),
                "--cupti".to_owned(),
                common::gpu::cupti_standin().lib.display().to_string(),
            ],
            vec![standin().driver.clone(), PathBuf::from("gpu")],
            &[],
        ),
    ] {
        let output = Command::new(CUDATRACE)
            .args(["run", "-q"])
            .args(&flags)
            .arg("--libcuda")
            .arg(&standin().lib)
            .arg("-o")
            .arg(trace)
            .arg("--")
            .args(&program)
            .env("NVML_STANDIN_DEVICES", "2")
            .env("NVML_STANDIN_NO_ENERGY", "1")
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        assert_complete(&read_trace(trace));
        traces.push((trace.clone(), sections));
    }
    let beside = demo.with_extension("parquet");
    assert!(
        beside.join("calls.parquet").is_file(),
        "run --export parquet"
    );
    let nccl_dir = scratch("parquet-nccl");
    common::nccl::trace_nccl_caller(&nccl_dir);
    traces.push((nccl_dir.join("t.jsonl"), &["collectives"]));
    let mut checks = Vec::new();
    for (trace, sections) in &traces {
        checks.extend(summary_checks(trace, sections));
    }
    // The demo's kernel launches, as demo_inference.c makes them: 4 × 20 batches.
    let demo_tables = demo.with_extension("parquet");
    checks.push(Check {
        what: "the demo's launches",
        sql: format!(
            "select count(*), count(distinct kernel) from '{}' where family = 'launch'",
            demo_tables.join("calls.parquet").display()
        ),
        rows: vec![json!([80, 3])],
    });
    // The stand-in's GPU work: 4 kernels, 2 copies, 2 memsets, each linked to its call.
    let gpu_tables = gpu.with_extension("parquet");
    let joined = |table: &str| {
        format!(
            "select count(*) from '{0}' w join '{1}' c on c.trace = w.trace and c.pid = w.pid \
             and c.tid = w.call_tid and c.ts_ns = w.call_ts_ns",
            gpu_tables.join(format!("{table}.parquet")).display(),
            gpu_tables.join("calls.parquet").display()
        )
    };
    for (what, table, count) in [
        ("kernels, each joined to its launch", "kernels", 4),
        ("GPU copies, each joined to its call", "gpu_copies", 2),
        ("GPU memsets, each joined to its call", "gpu_memsets", 2),
    ] {
        checks.push(Check {
            what,
            sql: joined(table),
            rows: vec![json!([count])],
        });
    }
    assert_checks(checks);
}

/// The README's straggler query, as the README prints it.
fn readme_query() -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let blocks: Vec<&str> = readme.split("```sql\n").skip(1).collect();
    let block = blocks
        .iter()
        .find(|b| b.contains("'job/*/collectives.parquet'"))
        .expect("the README's straggler query");
    block.split("```").next().unwrap().to_owned()
}

#[test]
fn a_jobs_tables_concatenate_and_the_readmes_query_names_the_straggler() {
    let dir = scratch("parquet-job");
    let job = dir.join("job");
    for rank in 0..2 {
        let trace = dir.join(format!("rank{rank}.jsonl"));
        std::fs::write(&trace, traces::job_rank(rank)).unwrap();
        let output = export(&trace, &job.join(format!("rank{rank}")), &[]);
        assert!(output.status.success(), "{}", stderr(&output));
    }
    let glob = |table: &str| format!("'{}/*/{table}.parquet'", job.display());
    let readme = readme_query().replace("'job/*/collectives.parquet'", &glob("collectives"));
    let [(host_a, _), (host_b, _)] = traces::JOB_HOSTS;
    assert_checks(vec![
        Check {
            what: "the README's query: rank 1 made the others wait 100 ms, rank 0 2 ms",
            sql: readme,
            rows: vec![
                json!([1, host_b, 2, 100_000_000]),
                json!([0, host_a, 2, 2_000_000]),
            ],
        },
        Check {
            what: "each collective on each rank: wall-clock arrival, from two clocks",
            sql: format!(
                "select host, rank, comm_seq, ts_ns + wall_offset_ns - 1795600010000000000 \
                 from {}",
                glob("collectives")
            ),
            rows: (0..2)
                .flat_map(|rank| {
                    traces::JOB_ARRIVALS[rank]
                        .iter()
                        .enumerate()
                        .map(move |(seq, arrival)| {
                            json!([traces::JOB_HOSTS[rank].0, rank, seq + 1, arrival])
                        })
                })
                .collect(),
        },
        Check {
            what: "every table of both traces, with its trace, host and rank",
            sql: format!(
                "select t.host, count(distinct c.trace), count(*), min(c.rank), max(c.rank) \
                 from {} c join {} t using (trace) group by t.host",
                glob("calls"),
                glob("traces")
            ),
            rows: vec![json!([host_a, 1, 5, 0, 0]), json!([host_b, 1, 5, 1, 1])],
        },
    ]);
}

#[test]
fn the_folder_and_bad_lines_are_refused_as_the_other_outputs_are() {
    let trace = write_trace("refusals", &traces::known());
    let dir = trace.parent().unwrap().to_owned();
    let out = dir.join("tables");

    // A new folder, then the same again: the tables are overwritten.
    for _ in 0..2 {
        let output = export(&trace, &out, &[]);
        assert!(output.status.success(), "{}", stderr(&output));
    }
    // Something else in it: refused, unless --force, which leaves it there.
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let output = export(&trace, &out, &[]);
    assert_eq!(output.status.code(), Some(73), "{}", stderr(&output));
    assert!(stderr(&output).contains("notes.txt"), "{}", stderr(&output));
    let output = export(&trace, &out, &["--force"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "mine"
    );

    // A table that is a symbolic link: refused, its target untouched.
    let linked = dir.join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    let target = dir.join("target.txt");
    std::fs::write(&target, "keep").unwrap();
    std::os::unix::fs::symlink(&target, linked.join("calls.parquet")).unwrap();
    let output = export(&trace, &linked, &[]);
    assert_eq!(output.status.code(), Some(73), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("symbolic link"),
        "{}",
        stderr(&output)
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");

    // A malformed line: exit 65, and no table is left (a file cut short cannot be read).
    let bad = write_trace(
        "bad-line",
        &traces::known().replacen("\"type\":\"call\"", "\"type\":\"call\",", 1),
    );
    let bad_out = bad.parent().unwrap().join("tables");
    let output = export(&bad, &bad_out, &[]);
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    assert_eq!(std::fs::read_dir(&bad_out).unwrap().count(), 0);
    let output = export(&bad, &bad_out, &["--skip-bad-lines"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_checks(vec![Check {
        what: "the skipped line is counted in traces",
        sql: format!(
            "select lines, skipped_lines from '{}'",
            bad_out.join("traces.parquet").display()
        ),
        rows: vec![json!([traces::KNOWN_LINES, 1])],
    }]);

    // What a folder cannot be, and what the tables do not filter.
    for (args, code) in [
        (vec!["-o", "-"], 2),
        (vec!["--pid", "100"], 2),
        (vec!["--start-ms", "1"], 2),
    ] {
        let output = Command::new(CUDATRACE)
            .args(["export", "--format", "parquet"])
            .arg(&trace)
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(code),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    // A pipe is read once, through a copy: -o names the folder.
    let piped = Command::new(CUDATRACE)
        .args(["export", "--format", "parquet", "/dev/stdin", "-o"])
        .arg(dir.join("piped"))
        .stdin(std::fs::File::open(&trace).unwrap())
        .output()
        .unwrap();
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert_checks(vec![Check {
        what: "a piped trace's calls",
        sql: format!(
            "select count(*) from '{}'",
            dir.join("piped/calls.parquet").display()
        ),
        rows: vec![json!([traces::KNOWN_CALLS])],
    }]);
    let missing = dir.join("missing.jsonl");
    let output = export(&missing, &dir.join("none"), &[]);
    assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        format!(
            "cudatrace: error: cannot open the trace {}: No such file or directory (os error 2)\n",
            missing.display()
        )
    );
    let output = export(&dir, &dir.join("none"), &[]);
    assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
    assert_eq!(stderr(&output), common::folder_refused(dir.display()));
    // Without -o: TRACE.parquet beside the trace.
    let output = Command::new(CUDATRACE)
        .args(["export", "--format", "parquet"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        trace
            .with_extension("parquet")
            .join("calls.parquet")
            .is_file()
    );
}
