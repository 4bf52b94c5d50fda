//! `cudatrace export` checked by Perfetto's own trace processor: the WebAssembly build the
//! Perfetto UI runs, fetched at test time and pinned (`tests/perfetto/fetch_ui.py`), run
//! under Node by `tests/perfetto/trace_processor.mjs`. For each trace, both formats:
//!
//! - the slices, counter values, flows, thread tracks and processes the trace processor
//!   finds are exactly what `cudatrace export` says it wrote (and what the trace holds);
//! - slice names and arguments (kernel names, grid and block, copy sizes, driver events),
//!   the device-memory counter values and the flows' ends are the trace's;
//! - its `stats` table has no error or data-loss entry (the harness fails otherwise).
//!
//! A new kind of track (GPU kernels per stream, power counters) adds a [`Check`]: a SQL
//! query and the rows it must return.

mod common;
mod traces;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use common::{trace_processor::run as trace_processor, *};
use serde_json::{Value, json};

// ---- the trace processor ----

/// A SQL query and the rows it must return, exactly (`ordered`: in this order, else as a
/// multiset).
struct Check {
    what: String,
    sql: String,
    rows: Vec<Value>,
    ordered: bool,
}

fn check(what: impl Into<String>, sql: impl Into<String>, rows: Vec<Value>) -> Check {
    Check {
        what: what.into(),
        sql: sql.into(),
        rows,
        ordered: false,
    }
}

fn ordered(mut check: Check) -> Check {
    check.ordered = true;
    check
}

/// One value: `select count(*) ...` and the count.
fn count(what: impl Into<String>, sql: impl Into<String>, expected: u64) -> Check {
    check(what, sql, vec![json!([expected])])
}

/// Loads `file`, runs every check's query in one go, and fails listing every mismatch
/// (and on a parse error or error statistics, which the harness reports).
fn assert_checks(file: &Path, checks: &[Check]) {
    let queries: Vec<&str> = checks.iter().map(|c| c.sql.as_str()).collect();
    let output = trace_processor(file, &queries);
    assert_eq!(
        output.status.code(),
        Some(0),
        "the trace processor did not load {} cleanly:\n{}\n{}",
        file.display(),
        stderr(&output),
        String::from_utf8_lossy(&output.stdout)
    );
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    let answers = result["queries"].as_array().unwrap();
    assert_eq!(answers.len(), checks.len());
    let mut failures = Vec::new();
    for (check, answer) in checks.iter().zip(answers) {
        let mut got = answer["rows"].as_array().unwrap().clone();
        let mut want = check.rows.clone();
        if !check.ordered {
            got.sort_by_key(Value::to_string);
            want.sort_by_key(Value::to_string);
        }
        if got != want {
            let show = |rows: &[Value]| {
                let mut text = rows
                    .iter()
                    .take(12)
                    .map(Value::to_string)
                    .collect::<Vec<_>>()
                    .join("\n      ");
                if rows.len() > 12 {
                    text.push_str(&format!("\n      ... {} rows in all", rows.len()));
                }
                text
            };
            failures.push(format!(
                "{}:\n    {}\n    trace processor:\n      {}\n    expected:\n      {}",
                check.what,
                check.sql,
                show(&got),
                show(&want)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}: {} of {} checks failed\n{}",
        file.display(),
        failures.len(),
        checks.len(),
        failures.join("\n")
    );
    eprintln!(
        "{}: {} checks passed ({} bytes, {})",
        file.display(),
        checks.len(),
        result["bytes"],
        result["wasm"]
    );
}

// ---- the exports ----

#[derive(Clone, Copy, Debug)]
enum Format {
    Chrome,
    Perfetto,
}

/// Runs `check` for both formats at once (exporting a large trace in a debug build takes
/// seconds); a panic in either fails the test.
fn each_format(check: impl Fn(Format) + Sync) {
    common::trace_processor::engine(); // fetched once, before the threads need it
    std::thread::scope(|scope| {
        for format in [Format::Chrome, Format::Perfetto] {
            let check = &check;
            scope.spawn(move || check(format));
        }
    });
}

impl Format {
    fn flag(self) -> &'static str {
        match self {
            Format::Chrome => "chrome",
            Format::Perfetto => "perfetto",
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Format::Chrome => "json",
            Format::Perfetto => "pftrace",
        }
    }

    /// Where the trace processor files a slice's arguments: `args.*` from the JSON,
    /// `debug.*` from the protobuf's debug annotations.
    fn arg(self, name: &str) -> String {
        match self {
            Format::Chrome => format!("args.{name}"),
            Format::Perfetto => format!("debug.{name}"),
        }
    }

    /// The device-memory counter track's name (the JSON's counter `device memory` with the
    /// series `bytes`).
    fn memory_track(self) -> &'static str {
        match self {
            Format::Chrome => "device memory bytes",
            Format::Perfetto => "device memory",
        }
    }
}

/// What `cudatrace export` says it wrote (its last line on stderr).
#[derive(Debug, Clone, Copy)]
struct Written {
    slices: u64,
    counters: u64,
    flows: u64,
    markers: u64,
}

/// `cudatrace export TRACE --format FORMAT`; the file and what cudatrace says it wrote.
fn export(trace: &Path, format: Format) -> (PathBuf, Written) {
    let output = Command::new(CUDATRACE)
        .arg("export")
        .arg(trace)
        .args(["--format", format.flag()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stderr(&output);
    let line = text.lines().last().unwrap();
    // "cudatrace: wrote FILE (FORMAT): 133 slices, 13 counter values, 80 flows, 2 markers in 0.04 s"
    let figures = line
        .split_once("): ")
        .and_then(|(_, rest)| rest.rsplit_once(" in "))
        .unwrap_or_else(|| panic!("no figures in {line:?}"))
        .0;
    let figure = |label: &str| -> u64 {
        figures
            .split(", ")
            .find_map(|part| part.strip_suffix(label))
            .unwrap_or_else(|| panic!("no {label:?} in {line:?}"))
            .parse()
            .unwrap()
    };
    let written = Written {
        slices: figure(" slices"),
        counters: figure(" counter values"),
        flows: figure(" flows"),
        markers: figure(" markers"),
    };
    (trace.with_extension(format.extension()), written)
}

// ---- what a trace holds, from its JSONL lines ----

/// Tracks and values the trace implies, to compare with the trace processor's tables.
struct Facts {
    /// (pid, tid) with calls or process events: one thread track each.
    threads: BTreeSet<(u64, u64)>,
    /// (pid, tid) with driver events: one `NVIDIA driver, tid T` track each.
    driver_threads: BTreeSet<(u64, u64)>,
    /// Processes with any event.
    pids: BTreeSet<u64>,
    calls: u64,
    driver: u64,
    markers: u64,
    /// (pid, time since the base at the call's return, live_bytes).
    memory: Vec<(u64, u64, u64)>,
    /// `--power`: the GPUs sampled (each a process-like group of counter tracks).
    gpus: BTreeSet<u64>,
    /// `--power`: counter values the samples give (each field present, and the energy).
    power_values: u64,
    /// NCCL collective calls: each a slice again on its rank's track.
    collectives: u64,
    /// (pid, comm, rank, nranks) of the collectives: a rank track each.
    rank_tracks: BTreeSet<(u64, String, String, String)>,
}

/// The NCCL collectives (each drawn on its rank's track too).
const COLLECTIVES: [&str; 11] = [
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclBcast",
    "ncclReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclAlltoAll",
    "ncclGather",
    "ncclScatter",
    "ncclSend",
    "ncclRecv",
];

/// The fields of a power line that become counter values, besides the energy.
const POWER_FIELDS: [&str; 8] = [
    "power_mw",
    "power_instant_mw",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "gpu_util_pct",
    "mem_util_pct",
    "temperature_c",
    "memory_used_bytes",
];

fn facts(lines: &[Value]) -> Facts {
    let base_ns = lines[0]["start_monotonic_ns"].as_u64().unwrap_or(0);
    let mut facts = Facts {
        threads: BTreeSet::new(),
        driver_threads: BTreeSet::new(),
        pids: BTreeSet::new(),
        calls: 0,
        driver: 0,
        markers: 0,
        memory: Vec::new(),
        gpus: BTreeSet::new(),
        power_values: 0,
        collectives: 0,
        rank_tracks: BTreeSet::new(),
    };
    let counter_gpus: Vec<&Value> = lines[0]["power"]["devices"]
        .as_array()
        .map(|devices| {
            devices
                .iter()
                .filter(|d| d["energy_counter"] == true)
                .map(|d| &d["index"])
                .collect()
        })
        .unwrap_or_default();
    // Hand-written traces have no live_bytes: cudatrace computes them, and so does this,
    // for the plain cuMemAlloc_v2/cuMemFree_v2 they use.
    let mut live = BTreeMap::<u64, u64>::new();
    let mut last_collective = BTreeMap::<(Option<u64>, Option<u64>), (u64, u64)>::new();
    let mut allocations = BTreeMap::<(u64, String), u64>::new();
    for line in lines {
        let (pid, tid) = (line["pid"].as_u64(), line["tid"].as_u64());
        match line["type"].as_str() {
            Some("call") => {
                facts.calls += 1;
                facts.threads.insert((pid.unwrap(), tid.unwrap()));
                if COLLECTIVES.contains(&line["name"].as_str().unwrap()) {
                    // A collective inside the thread's previous one (ncclBcast runs as
                    // ncclBroadcast) is one rank slice for the two.
                    let start = line["ts_ns"].as_u64().unwrap();
                    let end = start + line["dur_ns"].as_u64().unwrap();
                    let previous = last_collective.insert((pid, tid), (start, end));
                    if !previous.is_some_and(|(ts, ends)| start <= ts && ends <= end) {
                        facts.collectives += 1;
                    }
                    facts.rank_tracks.insert((
                        pid.unwrap(),
                        line["comm"].to_string(),
                        line["rank"].to_string(),
                        line["nranks"].to_string(),
                    ));
                }
                facts.pids.insert(pid.unwrap());
                let pid = pid.unwrap();
                let dptr = line["dptr"].as_str().map(str::to_owned);
                let live_bytes = match (line["name"].as_str().unwrap(), dptr, line["ret"] == 0) {
                    _ if line.get("live_bytes").is_some() => line["live_bytes"].as_u64(),
                    ("cuMemAlloc_v2", Some(dptr), true) => {
                        let bytes = line["bytes"].as_u64().unwrap();
                        allocations.insert((pid, dptr), bytes);
                        let live = live.entry(pid).or_default();
                        *live += bytes;
                        Some(*live)
                    }
                    ("cuMemFree_v2", Some(dptr), true) => {
                        let bytes = allocations.remove(&(pid, dptr)).unwrap();
                        let live = live.entry(pid).or_default();
                        *live -= bytes;
                        Some(*live)
                    }
                    _ => None,
                };
                if let Some(bytes) = live_bytes {
                    let end = line["ts_ns"].as_u64().unwrap() + line["dur_ns"].as_u64().unwrap();
                    facts.memory.push((pid, end - base_ns, bytes));
                }
            }
            Some("process") => {
                facts.markers += 1;
                facts.threads.insert((pid.unwrap(), tid.unwrap()));
                facts.pids.insert(pid.unwrap());
            }
            Some("driver") => {
                facts.driver += 1;
                facts.driver_threads.insert((pid.unwrap(), tid.unwrap()));
                facts.pids.insert(pid.unwrap());
            }
            Some("lost") => facts.markers += 1,
            Some("power") => {
                facts.gpus.insert(line["device"].as_u64().unwrap());
                let present = POWER_FIELDS
                    .iter()
                    .filter(|f| line.get(**f).is_some())
                    .count();
                // Energy: the counter's reading, or integrated power.
                let energy = if counter_gpus.contains(&&line["device"]) {
                    line.get("energy_mj").is_some()
                } else {
                    line.get("power_instant_mw")
                        .or(line.get("power_mw"))
                        .is_some()
                };
                facts.power_values += present as u64 + u64::from(energy);
            }
            _ => {}
        }
    }
    facts
}

/// The checks every export passes: counts against cudatrace's own figures and the trace,
/// the memory counter's values, the flows' ends, and one thread track per thread.
fn common_checks(format: Format, written: Written, facts: &Facts) -> Vec<Check> {
    assert_eq!(
        written.slices,
        facts.calls + facts.driver + facts.collectives,
        "cudatrace wrote a slice per call and driver line, and per collective on its rank's track"
    );
    assert_eq!(written.markers, facts.markers);
    assert_eq!(
        written.counters,
        facts.memory.len() as u64 + facts.power_values
    );
    let driver_tracks = facts.driver_threads.len() as u64;
    let rank_tracks = facts.rank_tracks.len() as u64;
    let (thread_tracks, driver_track_sql) = match format {
        // The JSON has only thread tracks: a driver or NCCL rank track is a thread of its own.
        Format::Chrome => (
            facts.threads.len() as u64 + driver_tracks + rank_tracks,
            "select count(*) from thread where name like 'NVIDIA driver, tid %'",
        ),
        Format::Perfetto => (
            facts.threads.len() as u64,
            "select count(*) from track where name like 'NVIDIA driver, tid %'",
        ),
    };
    let memory_track = format.memory_track();
    let mut memory: Vec<Value> = facts
        .memory
        .iter()
        .map(|(pid, ts, bytes)| json!([pid, ts, bytes]))
        .collect();
    memory.sort_by_key(|row| (row[0].as_u64(), row[1].as_u64()));
    vec![
        count(
            "slices of calls and driver events",
            "select count(*) from slice where category not in ('process', 'lost')",
            written.slices,
        ),
        count(
            "process and lost-event markers (instants: slices of no duration)",
            "select count(*) from slice where category in ('process', 'lost') and dur = 0",
            written.markers,
        ),
        count(
            "all slices",
            "select count(*) from slice",
            written.slices + written.markers,
        ),
        count(
            "driver slices",
            "select count(*) from slice where category = 'driver'",
            facts.driver,
        ),
        count(
            "collectives on rank tracks",
            "select count(*) from slice where category = 'nccl_rank'",
            facts.collectives,
        ),
        count(
            "counter values",
            "select count(*) from counter",
            written.counters,
        ),
        ordered(check(
            "device memory: pid, time (ns since tracing started, at the call's return), bytes",
            format!(
                "select p.pid, c.ts, cast(c.value as int) from counter c \
                 join process_counter_track t on c.track_id = t.id join process p using (upid) \
                 where t.name = '{memory_track}' order by p.pid, c.ts"
            ),
            memory,
        )),
        count("flows", "select count(*) from flow", written.flows),
        count(
            "flows from a launch to a synchronisation",
            "select count(*) from flow f join slice o on f.slice_out = o.id \
             join slice i on f.slice_in = i.id where o.category = 'launch' \
             and (i.name like 'cuStreamSynchronize%' or i.name like 'cuCtxSynchronize%')",
            written.flows,
        ),
        count(
            "thread tracks",
            "select count(*) from thread_track",
            thread_tracks,
        ),
        count("driver tracks", driver_track_sql, driver_tracks),
        count(
            "a trace without stacks has no stack samples, frames, callsites or mappings",
            "select (select count(*) from perf_sample) + (select count(*) from \
             cpu_profile_stack_sample) + (select count(*) from stack_profile_frame) + \
             (select count(*) from stack_profile_callsite) + \
             (select count(*) from stack_profile_mapping)",
            0,
        ),
        count(
            "processes and GPUs (pid 0 is the trace processor's own placeholder)",
            "select count(*) from process where pid != 0",
            facts.pids.len() as u64 + facts.gpus.len() as u64,
        ),
        check(
            "threads with slices: (pid, tid)",
            "select distinct p.pid, t.tid from slice s join thread_track tt on s.track_id = tt.id \
             join thread t using (utid) join process p using (upid) \
             where s.category not in ('driver', 'nccl_rank')",
            facts
                .threads
                .iter()
                .map(|(pid, tid)| json!([pid, tid]))
                .collect(),
        ),
    ]
}

/// Launches grouped by kernel name, grid, block and stream, with their counts.
fn launch_groups(format: Format, expected: &[(Value, u64)]) -> Check {
    let arg = |name: &str| format!("extract_arg(s.arg_set_id, '{}')", format.arg(name));
    check(
        "launches: kernel, grid, block, stream, count",
        format!(
            "select s.name, {}, {}, {}, {}, {}, {}, {}, count(*) from slice s \
             where s.category = 'launch' group by 1, 2, 3, 4, 5, 6, 7, 8",
            arg("grid[0]"),
            arg("grid[1]"),
            arg("grid[2]"),
            arg("block[0]"),
            arg("block[1]"),
            arg("block[2]"),
            arg("stream"),
        ),
        expected
            .iter()
            .map(|(key, n)| {
                let mut row = key.as_array().unwrap().clone();
                row.push(json!(n));
                Value::Array(row)
            })
            .collect(),
    )
}

/// Launch groups of the trace's call lines, named by `name` (a failed launch's name ends
/// with its error, as the export names it).
fn launches_of(lines: &[Value], name: impl Fn(&Value) -> String) -> Vec<(Value, u64)> {
    let mut groups = BTreeMap::<String, (Value, u64)>::new();
    for call in calls(lines) {
        if !call["name"].as_str().unwrap().starts_with("cuLaunchKernel") {
            continue;
        }
        let mut label = name(call);
        // An entry-only launch (`--launch-entry-only`) has no `ret`: it counts as launched.
        if call.get("ret").is_some_and(|ret| ret != 0) {
            label = format!("{label} → {}", call["ret_name"].as_str().unwrap());
        }
        let key = json!([
            label,
            call["grid"][0],
            call["grid"][1],
            call["grid"][2],
            call["block"][0],
            call["block"][1],
            call["block"][2],
            call["stream"]
        ]);
        groups.entry(key.to_string()).or_insert((key, 0)).1 += 1;
    }
    groups.into_values().collect()
}

/// Copies: function (the slice name's first word), direction and bytes, from the
/// trace processor's arguments and from the trace's lines.
fn copies(format: Format, lines: &[Value]) -> Check {
    check(
        "copies: function, kind, bytes",
        format!(
            "select substr(name, 1, instr(name, ' ') - 1), extract_arg(arg_set_id, '{}'), \
             extract_arg(arg_set_id, '{}') from slice where category = 'copy'",
            format.arg("kind"),
            format.arg("bytes")
        ),
        calls(lines)
            .into_iter()
            .filter(|c| c.get("kind").is_some())
            .map(|c| json!([c["name"], c["kind"], c["bytes"]]))
            .collect(),
    )
}

fn write_trace(name: &str, text: &str) -> PathBuf {
    let path = scratch(&format!("perfetto-{name}")).join("trace.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

/// The stand-in demo recorded for real.
fn record_demo(dir: &Path) -> PathBuf {
    record_demo_with(dir, &[])
}

/// The stand-in demo recorded with `run`'s `flags`.
fn record_demo_with(dir: &Path, flags: &[&str]) -> PathBuf {
    let trace = dir.join("demo.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q"])
        .args(flags)
        .arg("--libcuda")
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(&standin().demo)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    trace
}

// ---- the tests ----

/// The demo's launches, as `demo_inference.c` makes them: 20 batches of fill, gemm, mul,
/// gemm on one stream.
const DEMO_FILL: &str = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 2> >(int, at::native::FillFunctor<float>, std::array<char*, 2>)";
const DEMO_GEMM: &str = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas";

#[test]
fn the_recorded_demo_loads_in_perfettos_trace_processor() {
    let Some(_guard) = root() else { return };
    let dir = scratch("perfetto-demo");
    let trace = record_demo(&dir);
    let lines = read_trace(&trace);
    assert_complete(&lines);
    let facts = facts(&lines);
    let pid = lines[0]["pids"][0].as_u64().unwrap();
    let stream = calls(&lines)
        .into_iter()
        .find(|c| c["name"] == "cuStreamCreate")
        .unwrap()["stream"]
        .clone();
    let launches = launches_of(&lines, |c| c["kernel"].as_str().unwrap().to_owned());
    // The demo's own figures, from its source: 4 launch shapes × 20 batches.
    let shapes: Vec<(Value, u64)> = launches
        .iter()
        .map(|(k, n)| (json!([k[0], k[1], k[2], k[3], k[4]]), *n))
        .collect();
    assert_eq!(shapes.len(), 4, "{shapes:?}");
    assert!(shapes.iter().all(|(_, n)| *n == 20), "{shapes:?}");
    assert!(shapes.contains(&(json!([DEMO_FILL, 256, 1, 1, 128]), 20)));
    assert!(shapes.contains(&(json!([DEMO_GEMM, 8, 16, 1, 128]), 20)));
    assert!(shapes.contains(&(json!([DEMO_GEMM, 4, 8, 1, 256]), 20)));

    each_format(|format| {
        let (file, written) = export(&trace, format);
        assert_eq!(
            (
                written.slices,
                written.counters,
                written.flows,
                written.markers
            ),
            (133, 13, 80, 2),
            "{format:?}"
        );
        let arg = |name: &str| format!("extract_arg(arg_set_id, '{}')", format.arg(name));
        let mut checks = common_checks(format, written, &facts);
        checks.extend([
            launch_groups(format, &launches),
            copies(format, &lines),
            ordered(check(
                "copy slices: names with direction and size",
                "select name from slice where category = 'copy' order by ts",
                [
                    "cuMemcpyHtoD_v2 HtoD 4.00 MiB",
                    "cuMemcpyHtoD_v2 HtoD 4.00 MiB",
                    "cuMemcpyHtoD_v2 HtoD 2.00 MiB",
                    "cuMemcpyHtoD_v2 HtoD 20.00 KiB",
                    "cuMemcpyHtoDAsync_v2 HtoD 256.00 KiB",
                    "cuMemcpyDtoHAsync_v2 DtoH 2.50 KiB",
                ]
                .map(|name| json!([name]))
                .to_vec(),
            )),
            ordered(check(
                "device memory values (demo_inference.c's allocations and frees)",
                format!(
                    "select cast(c.value as int) from counter c join counter_track t \
                     on c.track_id = t.id where t.name = '{}' order by c.ts",
                    format.memory_track()
                ),
                [
                    4194304, 8388608, 10485760, 10506240, 10768384, 11030528, 11033088,
                    6838784, 2644480, 547328, 526848, 264704, 262144,
                ]
                .map(|bytes| json!([bytes]))
                .to_vec(),
            )),
            check(
                "the first launch's arguments",
                format!(
                    "select name, {}, {}, {}, {}, {}, {} from slice where category = 'launch' \
                     order by ts limit 1",
                    arg("call"),
                    arg("grid[0]"),
                    arg("block[0]"),
                    arg("shared_mem"),
                    arg("stream"),
                    arg("kernel_mangled"),
                ),
                vec![json!([
                    DEMO_FILL,
                    "cuLaunchKernel",
                    256,
                    128,
                    0,
                    stream,
                    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLi2EEEEviT0_T1_"
                ])],
            ),
            count(
                "synchronisations that four launches arrive at (20 batches)",
                "select count(*) from (select slice_in, count(*) n from flow group by slice_in) \
                 where n = 4",
                20,
            ),
            check(
                "the process, named by the command line",
                "select pid, name from process where pid != 0",
                vec![json!([pid, standin().demo.display().to_string()])],
            ),
            count(
                "categories (API families)",
                "select count(distinct category) from slice",
                8,
            ),
        ]);
        assert_checks(&file, &checks);
    });
}

/// `--launch-entry-only` (trace format 3): launch lines without `ret` and `dur_ns` load as
/// zero-length launch slices, with their arguments, and still flow to the synchronisations.
#[test]
fn an_entry_only_demo_loads_with_zero_length_launch_slices() {
    let Some(_guard) = root() else { return };
    let dir = scratch("perfetto-entry-only");
    let trace = record_demo_with(&dir, &["--launch-entry-only"]);
    let lines = read_trace(&trace);
    assert_complete(&lines);
    assert_eq!(lines[0]["launch_entry_only"], true);
    let untimed = calls(&lines)
        .into_iter()
        .filter(|c| c.get("ret").is_none() && c.get("dur_ns").is_none())
        .count();
    assert_eq!(
        untimed, 80,
        "the demo's 80 launches, and nothing else, are untimed"
    );
    let facts = facts(&lines);
    let launches = launches_of(&lines, |c| c["kernel"].as_str().unwrap().to_owned());

    each_format(|format| {
        let (file, written) = export(&trace, format);
        // The same figures as the demo traced with return probes.
        assert_eq!(
            (
                written.slices,
                written.counters,
                written.flows,
                written.markers
            ),
            (133, 13, 80, 2),
            "{format:?}"
        );
        let mut checks = common_checks(format, written, &facts);
        checks.extend([
            launch_groups(format, &launches),
            count(
                "launch slices of zero length",
                "select count(*) from slice where category = 'launch' and dur = 0",
                80,
            ),
            count(
                "other call slices with a duration",
                "select count(*) from slice where category not in ('launch', 'process', 'lost') \
                 and dur > 0",
                written.slices - 80,
            ),
        ]);
        assert_checks(&file, &checks);
    });
}

#[test]
fn a_kernel_trace_loads_with_its_driver_tracks() {
    let Some(_guard) = root() else { return };
    let program = fake_nvidia();
    let dir = scratch("perfetto-kernel");
    let prefix = format!("{}/nvidia", dir.display());
    let trace = dir.join("kernel.jsonl");
    // A child makes the driver calls, then the shell becomes the demo: two processes, a
    // fork, execs, libcuda calls and driver events.
    let script = format!(
        "{} {prefix} {} && exec {}",
        program.display(),
        dir.join("other-file").display(),
        standin().demo.display()
    );
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--kernel", "--kernel-hooks", "tracepoint"])
        .args(["--kernel-device-prefix", &prefix, "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .args(["--", "/bin/sh", "-c", &script])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let lines = read_trace(&trace);
    assert_complete(&lines);
    let facts = facts(&lines);
    assert_eq!(facts.driver, 4);
    assert_eq!(facts.pids.len(), 2, "the shell and its child");
    let child = *facts.driver_threads.first().unwrap();
    let mmap = lines.iter().find(|l| l["hook"] == "mmap").unwrap();
    assert!(mmap["ret"].as_u64().unwrap() > 0, "{mmap}");
    let launches = launches_of(&lines, |c| c["kernel"].as_str().unwrap().to_owned());
    // The shell is named by the command line (cut at 80 characters), and keeps that name
    // when it execs; the child, forked as `sh`, is renamed by its exec.
    let shell = lines[0]["pids"][0].as_u64().unwrap();
    let command: Vec<&str> = lines[0]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|part| part.as_str().unwrap())
        .collect();
    let command = command.join(" ");
    let shell_name = match command.chars().count() {
        0..=80 => command,
        _ => command.chars().take(79).chain(['…']).collect(),
    };
    let child_exec = lines
        .iter()
        .find(|l| l["event"] == "exec" && l["pid"] == child.0)
        .unwrap()["filename"]
        .as_str()
        .unwrap();
    // Whole: exec file names are kept up to 255 bytes, whatever the checkout's path.
    assert_eq!(child_exec, program.to_str().unwrap());
    let child_name = child_exec.rsplit('/').next().unwrap().to_owned();

    each_format(|format| {
        let (file, written) = export(&trace, format);
        assert_eq!((written.slices, written.flows), (137, 80), "{format:?}");
        let arg = |name: &str| format!("extract_arg(arg_set_id, '{}')", format.arg(name));
        let mut checks = common_checks(format, written, &facts);
        checks.extend([
            launch_groups(format, &launches),
            copies(format, &lines),
            ordered(check(
                "driver slices: name, hook, device, ret",
                format!(
                    "select name, {}, {}, {} from slice where category = 'driver' order by ts",
                    arg("hook"),
                    arg("device"),
                    arg("ret")
                ),
                vec![
                    json!(["NV_ESC_RM_CONTROL", "ioctl", "nvidiactl", -25]),
                    json!(["NV_ESC_RM_ALLOC", "ioctl", "nvidia0", -25]),
                    json!(["UVM_INITIALIZE", "ioctl", "nvidia-uvm", -25]),
                    // mmap returns the address.
                    json!(["mmap nvidia0", "mmap", "nvidia0", mmap["ret"]]),
                ],
            )),
            check(
                "RM parameters as arguments",
                format!(
                    "select {}, {} from slice where category = 'driver' and name = 'NV_ESC_RM_ALLOC'",
                    arg("rm_class"),
                    arg("cmd")
                ),
                vec![json!(["0xc86f", "0xc030462b"])],
            ),
            check(
                "the driver track's name and process",
                match format {
                    Format::Chrome => "select distinct p.pid, t.name from slice s \
                         join thread_track tt on s.track_id = tt.id join thread t using (utid) \
                         join process p using (upid) where s.category = 'driver'"
                        .to_owned(),
                    Format::Perfetto => "select distinct p.pid, t.name from slice s \
                         join process_track t on s.track_id = t.id join process p using (upid) \
                         where s.category = 'driver'"
                        .to_owned(),
                },
                vec![json!([child.0, format!("NVIDIA driver, tid {}", child.1)])],
            ),
            check(
                "process names: the command line, and the child's after its exec",
                "select pid, name from process where pid != 0",
                vec![json!([shell, shell_name]), json!([child.0, child_name])],
            ),
            check(
                "process markers",
                "select name from slice where category = 'process'",
                lines
                    .iter()
                    .filter(|l| l["type"] == "process")
                    .map(|l| match l["event"].as_str().unwrap() {
                        "fork" => json!([format!("fork: pid {}", l["child_pid"])]),
                        "exec" => json!([format!("exec {}", l["filename"].as_str().unwrap())]),
                        other => json!([other]),
                    })
                    .collect(),
            ),
        ]);
        assert_checks(&file, &checks);
    });
}

#[test]
fn a_200k_call_trace_loads_exactly() {
    let iterations = 50_000;
    let trace = write_trace("200k", &traces::with_header(&traces::inference(iterations)));
    let calls = traces::inference_calls(iterations);
    assert_eq!(calls, 200_022);
    let lines = read_trace(&trace);
    let facts = facts(&lines);
    // The trace's launches carry only a function handle: cudatrace names them from the
    // cuModuleGetFunction that returned it.
    let launches = launches_of(&lines, |c| {
        match c["function"].as_str().unwrap() {
            "0x100" => "gemm(float*, float*)",
            "0x101" => "relu(float*)",
            "0x102" => "softmax_kernel",
            other => panic!("function {other}"),
        }
        .to_owned()
    });
    assert_eq!(launches.iter().map(|(_, n)| n).sum::<u64>(), 3 * iterations);

    each_format(|format| {
        let (file, written) = export(&trace, format);
        assert_eq!(
            (
                written.slices,
                written.counters,
                written.flows,
                written.markers
            ),
            (calls, 8, 3 * iterations, 0),
            "{format:?}"
        );
        let mut checks = common_checks(format, written, &facts);
        checks.extend([
            launch_groups(format, &launches),
            copies(format, &lines),
            count(
                "synchronisations that three launches arrive at",
                "select count(*) from (select slice_in, count(*) n from flow group by slice_in) \
                 where n = 3",
                iterations,
            ),
            check(
                "the process, named by the command line",
                "select pid, name from process where pid != 0",
                vec![json!([42, "python3 infer.py"])],
            ),
        ]);
        assert_checks(&file, &checks);
    });
}

#[test]
fn a_trace_with_lost_events_driver_lines_and_two_processes_loads() {
    let trace = write_trace("known", &traces::known());
    let lines = read_trace(&trace);
    let facts = facts(&lines);
    let launches = launches_of(&lines, |c| match c["function"].as_str().unwrap() {
        "0x30" => "vector_add(float const*, float const*, float*, int)".to_owned(),
        // No cuModuleGetFunction returned it: cudatrace says so.
        other => format!("unknown@{other}"),
    });
    each_format(|format| {
        let (file, written) = export(&trace, format);
        let arg = |name: &str| format!("extract_arg(arg_set_id, '{}')", format.arg(name));
        let mut checks = common_checks(format, written, &facts);
        checks.extend([
            launch_groups(format, &launches),
            check(
                "the lost-event marker",
                format!(
                    "select name, {}, {} from slice where category = 'lost'",
                    arg("count"),
                    arg("reason")
                ),
                vec![json!(["lost 3 events (ring_full)", 3, "ring_full"])],
            ),
            check(
                "the failed launch keeps its error in its name",
                "select name from slice where name like '%CUDA_ERROR_INVALID_VALUE'",
                vec![json!([
                    "vector_add(float const*, float const*, float*, int) → CUDA_ERROR_INVALID_VALUE"
                ])],
            ),
        ]);
        assert_checks(&file, &checks);
    });
}

/// Two calls of one thread that overlap without nesting cannot happen in a real trace;
/// in the JSON the trace processor drops one and counts an error, which the harness turns
/// into a failure (exit 3): the `stats` check can fail.
#[test]
fn error_statistics_fail_the_harness() {
    let trace = write_trace(
        "overlap",
        &traces::with_header(
            "{\"type\":\"call\",\"name\":\"cuInit\",\"pid\":42,\"tid\":42,\"ts_ns\":10000,\"dur_ns\":5000,\"ret\":0}\n\
             {\"type\":\"call\",\"name\":\"cuCtxSynchronize\",\"pid\":42,\"tid\":42,\"ts_ns\":12000,\"dur_ns\":5000,\"ret\":0}\n",
        ),
    );
    let (file, written) = export(&trace, Format::Chrome);
    assert_eq!(written.slices, 2);
    let output = trace_processor(&file, &["select count(*) from slice"]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("slice_drop_overlapping_complete_event = 1 (error)"),
        "{}",
        stderr(&output)
    );
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(result["queries"][0]["rows"], json!([[1]]));
}

#[test]
fn truncated_exports_are_rejected() {
    let trace = write_trace("truncated", &traces::known());
    each_format(|format| {
        let (file, _) = export(&trace, format);
        let bytes = std::fs::read(&file).unwrap();
        let cut = file.with_extension(format!("cut.{}", format.extension()));
        std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).unwrap();
        let output = trace_processor(&cut, &["select count(*) from slice"]);
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        let expected = match format {
            // The trace processor's own verdict.
            Format::Chrome => "JSON trace file is incomplete",
            // The trace processor drops a cut packet silently; the harness checks framing.
            Format::Perfetto => "protobuf trace ends inside a field",
        };
        assert!(stderr(&output).contains(expected), "{}", stderr(&output));

        // The whole file loads: the cut is what fails.
        let whole = trace_processor(&file, &[]);
        assert_eq!(whole.status.code(), Some(0), "{}", stderr(&whole));
    });
}

// ---- --power: each GPU's counter tracks ----

/// A GPU's pid in the exports: this plus its NVML index (above any Linux pid).
const GPU_PID_BASE: u64 = 1 << 30;

/// Each power field's counter track, as both formats name it.
const POWER_TRACKS: [(&str, &str); 8] = [
    ("power_mw", "power W"),
    ("power_instant_mw", "instant power W"),
    ("sm_clock_mhz", "SM clock MHz"),
    ("mem_clock_mhz", "memory clock MHz"),
    ("gpu_util_pct", "GPU utilisation %"),
    ("mem_util_pct", "memory utilisation %"),
    ("temperature_c", "temperature C"),
    ("memory_used_bytes", "memory used bytes"),
];

/// The GPUs' groups, their tracks with the number of values each, and the power values
/// (mW, from the JSON's W), all from the trace's lines.
fn power_checks(lines: &[Value]) -> Vec<Check> {
    let base_ns = lines[0]["start_monotonic_ns"].as_u64().unwrap_or(0);
    let devices = lines[0]["power"]["devices"].as_array().unwrap();
    let groups: Vec<Value> = devices
        .iter()
        .map(|d| {
            json!([
                GPU_PID_BASE + d["index"].as_u64().unwrap(),
                format!("GPU {}: {}", d["index"], d["name"].as_str().unwrap())
            ])
        })
        .collect();
    let mut tracks = BTreeMap::<(u64, &str), u64>::new();
    let mut power = BTreeMap::new();
    for line in lines.iter().filter(|l| l["type"] == "power") {
        let pid = GPU_PID_BASE + line["device"].as_u64().unwrap();
        for (field, track) in POWER_TRACKS {
            if line.get(field).is_some() {
                *tracks.entry((pid, track)).or_default() += 1;
            }
        }
        *tracks.entry((pid, "energy J")).or_default() += 1;
        if let Some(mw) = line.get("power_mw") {
            let ts = line["ts_ns"].as_u64().unwrap() - base_ns;
            power.insert((pid, ts), json!([pid, ts, mw]));
        }
    }
    vec![
        check(
            "GPU groups: pid, name",
            format!("select pid, name from process where pid >= {GPU_PID_BASE}"),
            groups,
        ),
        check(
            "GPU counter tracks: pid, name, values",
            format!(
                "select p.pid, t.name, count(*) from counter c \
                 join process_counter_track t on c.track_id = t.id join process p using (upid) \
                 where p.pid >= {GPU_PID_BASE} group by 1, 2"
            ),
            tracks
                .into_iter()
                .map(|((pid, track), n)| json!([pid, track, n]))
                .collect(),
        ),
        ordered(check(
            "power: pid, time since tracing started, mW",
            "select p.pid, c.ts, cast(round(c.value * 1000) as int) from counter c \
             join process_counter_track t on c.track_id = t.id join process p using (upid) \
             where t.name = 'power W' order by p.pid, c.ts",
            power.into_values().collect(),
        )),
    ]
}

#[test]
fn a_power_trace_loads_with_each_gpus_counter_tracks() {
    let trace = write_trace("power", &traces::power());
    let lines = read_trace(&trace);
    let facts = facts(&lines);
    assert_eq!(facts.gpus.len(), 2);
    assert_eq!(facts.power_values, traces::POWER_COUNTERS);
    each_format(|format| {
        let (file, written) = export(&trace, format);
        let mut checks = common_checks(format, written, &facts);
        checks.extend(power_checks(&lines));
        checks.extend([
            ordered(check(
                "GPU 0's energy: its counter less the first reading (10 mJ a sample), in mJ",
                format!(
                    "select cast(round(c.value * 1000) as int) from counter c \
                     join process_counter_track t on c.track_id = t.id join process p \
                     using (upid) where p.pid = {GPU_PID_BASE} and t.name = 'energy J' \
                     order by c.ts"
                ),
                (0..traces::POWER_SAMPLES)
                    .map(|k| json!([k * 10]))
                    .collect(),
            )),
            ordered(check(
                "GPU 1's energy: 250 W integrated (25 mJ a sample), in mJ",
                format!(
                    "select cast(round(c.value * 1000) as int) from counter c \
                     join process_counter_track t on c.track_id = t.id join process p \
                     using (upid) where p.pid = {} and t.name = 'energy J' order by c.ts",
                    GPU_PID_BASE + 1
                ),
                (0..traces::POWER_SAMPLES)
                    .map(|k| json!([k * 25]))
                    .collect(),
            )),
        ]);
        assert_checks(&file, &checks);
    });
}

#[test]
fn a_recorded_power_trace_loads_with_each_gpus_counter_tracks() {
    let Some(_guard) = root() else { return };
    let dir = scratch("perfetto-power");
    let trace = dir.join("power.jsonl");
    // Two stand-in GPUs (NOT NVIDIA's NVML), the second without an energy counter.
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--power=5", "--nvml"])
        .arg(&common::power::nvml_standin().lib)
        .arg("--libcuda")
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(&standin().demo)
        .env("NVML_STANDIN_DEVICES", "2")
        .env("NVML_STANDIN_NO_ENERGY", "1")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let lines = read_trace(&trace);
    assert_complete(&lines);
    let facts = facts(&lines);
    assert_eq!(facts.gpus.len(), 2);
    // 9 values a sample on each GPU: 8 fields and the energy (GPU 1's integrated).
    let samples = lines.iter().filter(|l| l["type"] == "power").count() as u64;
    assert_eq!(facts.power_values, samples * 9);
    each_format(|format| {
        let (file, written) = export(&trace, format);
        let mut checks = common_checks(format, written, &facts);
        checks.extend(power_checks(&lines));
        checks.push(check(
            "every power value is the stand-in's: 100 W and 200 W",
            "select distinct p.pid, cast(round(c.value) as int) from counter c \
             join process_counter_track t on c.track_id = t.id join process p using (upid) \
             where t.name in ('power W', 'instant power W')",
            vec![json!([GPU_PID_BASE, 100]), json!([GPU_PID_BASE + 1, 200])],
        ));
        assert_checks(&file, &checks);
    });
}

// ---- --gpu: a track per GPU and stream, an arrow from each call to its work ----

/// GPU work slices: (GPU, stream track, name, ts, dur), as the format files them: threads
/// of a `GPU N` process in the JSON, child tracks of a `GPU N` track in the protobuf.
fn gpu_slices(format: Format, rows: Vec<Value>) -> Check {
    let sql = match format {
        Format::Chrome => {
            "select p.name, t.name, s.name, s.ts, s.dur from slice s \
             join thread_track tt on s.track_id = tt.id join thread t using (utid) \
             join process p using (upid) where s.category = 'gpu' and s.dur > 0"
        }
        Format::Perfetto => {
            "select g.name, t.name, s.name, s.ts, s.dur from slice s \
             join track t on s.track_id = t.id join track g on t.parent_id = g.id \
             where s.category = 'gpu' and s.dur > 0"
        }
    };
    check("GPU slices: GPU, stream track, name, ts, dur", sql, rows)
}

/// Arrows into GPU work: (the call slice's category and start, the work's name and start).
fn gpu_flows(rows: Vec<Value>) -> Check {
    check(
        "flows from a call to its GPU work",
        "select o.category, o.ts, i.name, i.ts from flow f join slice o on f.slice_out = o.id \
         join slice i on f.slice_in = i.id where i.category = 'gpu'",
        rows,
    )
}

#[test]
fn a_gpu_trace_loads_with_gpu_tracks_and_call_to_gpu_flows() {
    let trace = write_trace("gpu", &traces::gpu());
    let stream = |n: u32| format!("stream {n}, pid 300 (python3 train.py)");
    let vector_add = "vector_add(float const*, float const*, float*, int)";
    let slices: Vec<Value> = [
        (13, "HtoD 1.00 MiB", 7_500, 2_000),
        (13, "memset 3.91 KiB", 9_600, 400),
        (13, vector_add, 11_500, 5_000),
        (14, "gemm()", 15_500, 2_000),
        (13, vector_add, 16_500, 3_000),
        (13, "DtoH 4.00 KiB", 62_000, 1_000),
        (13, vector_add, 64_000, 500),
    ]
    .iter()
    .map(|(s, name, ts, dur)| json!(["GPU 0", stream(*s), name, ts, dur]))
    .collect();
    let flows: Vec<Value> = [
        ("copy", 6_000, "HtoD 1.00 MiB", 7_500),
        ("memset", 9_000, "memset 3.91 KiB", 9_600),
        ("launch", 10_000, vector_add, 11_500),
        ("launch", 12_000, vector_add, 16_500),
        ("launch", 14_000, "gemm()", 15_500),
        ("copy", 60_000, "DtoH 4.00 KiB", 62_000),
    ]
    .iter()
    .map(|(category, ts, name, gpu_ts)| json!([category, ts, name, gpu_ts]))
    .collect();
    each_format(|format| {
        let (file, written) = export(&trace, format);
        // 11 calls and 7 pieces of work; 6 arrows to work and 2 launch → sync.
        assert_eq!((written.slices, written.flows, written.markers), (18, 8, 1));
        assert_checks(
            &file,
            &[
                gpu_slices(format, slices.clone()),
                gpu_flows(flows.clone()),
                count("flows", "select count(*) from flow", 8),
                count(
                    "the recording-start marker",
                    "select count(*) from slice where name = 'GPU recording: CUPTI 130001' \
                     and dur = 0",
                    1,
                ),
                check(
                    "a kernel's arguments",
                    format!(
                        "select extract_arg(arg_set_id, '{}'), extract_arg(arg_set_id, '{}'), \
                         extract_arg(arg_set_id, '{}') from slice where name = 'gemm()'",
                        format.arg("kernel_mangled"),
                        format.arg("queued_ns"),
                        format.arg("call_tid")
                    ),
                    vec![json!(["_Z4gemmv", -200, 301])],
                ),
            ],
        );
    });
}

/// GPU work that starts before the middle of its call (the stand-in's work can) keeps its
/// arrow from the call in both formats: Perfetto's JSON reader drops an
/// arrow that arrives before it leaves, so there it leaves the call earlier (seen in CI: a
/// recorded run's second memset lost its arrow in the JSON export alone).
#[test]
fn gpu_work_that_starts_before_the_middle_of_its_call_keeps_its_arrow() {
    let trace = write_trace("gpu-early", &traces::gpu_early_work());
    let flows = vec![
        json!(["memset", 9_000, "memset 400 B", 9_200]),
        json!(["launch", 12_000, "k()", 12_100]),
    ];
    each_format(|format| {
        let (file, written) = export(&trace, format);
        // Two arrows to GPU work and the launch's to its synchronisation.
        assert_eq!(written.flows, 3);
        assert_checks(
            &file,
            &[
                gpu_flows(flows.clone()),
                count("flows", "select count(*) from flow", 3),
            ],
        );
    });
}

#[test]
fn a_recorded_gpu_run_loads_with_a_track_per_stream() {
    let Some(_guard) = root() else { return };
    let dir = scratch("perfetto-gpu-run");
    let trace = dir.join("gpu.jsonl");
    let cupti = common::gpu::cupti_standin();
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--gpu", "--cupti"])
        .arg(&cupti.lib)
        .arg("--libcuda")
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(&standin().driver)
        .arg("gpu")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let lines = read_trace(&trace);
    let base = lines[0]["start_monotonic_ns"].as_u64().unwrap();
    let pid = lines[0]["pids"][0].as_u64().unwrap();
    let work: Vec<&Value> = lines
        .iter()
        .filter(|l| {
            matches!(
                l["type"].as_str(),
                Some("gpu_kernel" | "gpu_copy" | "gpu_memset")
            )
        })
        .collect();
    assert_eq!(work.len(), 8, "4 kernels, 2 copies, 2 memsets");
    let comm = lines[0]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect::<Vec<_>>()
        .join(" ");
    // The stand-in's work of one stream overlaps (it does not serialise streams): the
    // export puts a slice that starts before the previous one ends on a lane beside it.
    let mut lanes = BTreeMap::<(u64, u64), Vec<u64>>::new();
    let slices: Vec<Value> = work
        .iter()
        .map(|w| {
            let (ts, dur) = (
                w["ts_ns"].as_u64().unwrap() - base,
                w["dur_ns"].as_u64().unwrap(),
            );
            let ends = lanes
                .entry((w["device"].as_u64().unwrap(), w["stream"].as_u64().unwrap()))
                .or_default();
            let lane = ends.iter().position(|end| *end <= ts).unwrap_or_else(|| {
                ends.push(0);
                ends.len() - 1
            });
            ends[lane] = ts + dur;
            let overlapping = match lane {
                0 => String::new(),
                n => format!(", overlapping {n}"),
            };
            let name = match w["type"].as_str().unwrap() {
                "gpu_kernel" => w["kernel"].as_str().unwrap().to_owned(),
                "gpu_copy" if w["bytes"] == 1048576 => {
                    format!("{} 1.00 MiB", w["kind"].as_str().unwrap())
                }
                "gpu_copy" => format!("{} 64.00 KiB", w["kind"].as_str().unwrap()),
                _ => format!("memset {} B", w["bytes"]),
            };
            json!([
                format!("GPU {}", w["device"]),
                format!("stream {}, pid {pid} ({comm}){overlapping}", w["stream"]),
                name,
                w["ts_ns"].as_u64().unwrap() - base,
                w["dur_ns"]
            ])
        })
        .collect();
    let flows: Vec<Value> = work
        .iter()
        .map(|w| {
            let call = calls(&lines)
                .into_iter()
                .find(|c| c["tid"] == w["call_tid"] && c["ts_ns"] == w["call_ts_ns"])
                .expect("every work line links to a call line");
            let name = call["name"].as_str().unwrap();
            let family = if name.starts_with("cuLaunch") {
                "launch"
            } else if name.starts_with("cuMemset") {
                "memset"
            } else {
                "copy"
            };
            json!([
                family,
                call["ts_ns"].as_u64().unwrap() - base,
                slices
                    .iter()
                    .find(|s| s[3] == w["ts_ns"].as_u64().unwrap() - base)
                    .unwrap()[2],
                w["ts_ns"].as_u64().unwrap() - base
            ])
        })
        .collect();
    each_format(|format| {
        let (file, _) = export(&trace, format);
        assert_checks(
            &file,
            &[gpu_slices(format, slices.clone()), gpu_flows(flows.clone())],
        );
    });
}

// ---- --power --gpu: each GPU's streams and counters in one group ----

#[test]
fn a_power_gpu_trace_puts_each_gpus_streams_and_counters_in_one_group() {
    let trace = write_trace("power-gpu", &traces::gpu_power());
    let lines = read_trace(&trace);
    let group = "GPU 0: test GPU A";
    let stream = |n: u32| format!("stream {n}, pid 300 (python3 train.py)");
    let vector_add = "vector_add(float const*, float const*, float*, int)";
    let slices: Vec<Value> = [
        (13, "HtoD 1.00 MiB", 7_500, 2_000),
        (13, "memset 3.91 KiB", 9_600, 400),
        (13, vector_add, 11_500, 5_000),
        (14, "gemm()", 15_500, 2_000),
        (13, vector_add, 16_500, 3_000),
        (13, "DtoH 4.00 KiB", 62_000, 1_000),
        (13, vector_add, 64_000, 500),
    ]
    .iter()
    .map(|(s, name, ts, dur)| json!([group, stream(*s), name, ts, dur]))
    .collect();
    each_format(|format| {
        let (file, _) = export(&trace, format);
        let mut checks = power_checks(&lines);
        checks.push(gpu_slices(format, slices.clone()));
        assert_checks(&file, &checks);
    });
}

/// A collective slice's track: its name and its process's pid (an NCCL rank track is a
/// thread of its process in the JSON, a named track of the process in the protobuf).
fn rank_track_join(format: Format) -> &'static str {
    match format {
        Format::Chrome => {
            "join thread_track tt on s.track_id = tt.id join thread t using (utid) \
             join process p using (upid)"
        }
        Format::Perfetto => "join process_track t on s.track_id = t.id join process p using (upid)",
    }
}

#[test]
fn a_recorded_nccl_trace_has_a_track_per_communicator_and_rank() {
    let Some(_guard) = root() else { return };
    let dir = scratch("perfetto-nccl");
    let lines = common::nccl::trace_nccl_caller(&dir);
    let trace = dir.join("t.jsonl");
    let facts = facts(&lines);
    let pid = lines[0]["pids"][0].as_u64().unwrap();
    assert_eq!(facts.collectives, 18);
    let main = "NCCL rank 1/2 (comm 0001020304050607…)";
    let child_unknown = "NCCL rank ?/? (comm 0x2010)";
    let child = "NCCL rank 0/1 (comm 0x2010)";
    let second = "NCCL rank 1/2 (comm 0x2030)";
    // nccl_caller.c's collectives, in order: the track and the slice's name.
    let expected_names = [
        (main, "AllReduce 3.91 KiB"),
        (main, "AllReduce 3.91 KiB"),
        (main, "AllReduce 3.91 KiB"),
        (main, "AllReduce 20 B"),
        (main, "Broadcast 4.00 KiB"),
        (main, "Bcast 400 B"),
        (main, "Reduce 80 B"),
        (main, "AllGather 512 B"),
        (main, "ReduceScatter 1.00 KiB"),
        (main, "AlltoAll 64 B"),
        (main, "Gather 128 B"),
        (main, "Scatter 128 B"),
        (main, "Send 200 B"),
        (main, "Recv 200 B"),
        (child_unknown, "AllReduce 20 B"),
        (child, "AllReduce 24 B"),
        (second, "AllReduce 32 B"),
        (main, "AllReduce → ncclInvalidArgument"),
    ];
    let mut collectives: Vec<&Value> = calls(&lines)
        .into_iter()
        .filter(|c| COLLECTIVES.contains(&c["name"].as_str().unwrap()))
        .collect();
    // The stand-in's ncclBcast calls ncclBroadcast: that inner call has no rank slice.
    let bcast = collectives
        .iter()
        .position(|c| c["name"] == "ncclBcast")
        .unwrap();
    assert_eq!(collectives[bcast - 1]["name"], "ncclBroadcast");
    collectives.remove(bcast - 1);
    assert_eq!(collectives.len(), expected_names.len());
    // The arguments as the trace has them (null where absent).
    const ARGS: [&str; 11] = [
        "call", "comm", "rank", "nranks", "count", "datatype", "bytes", "op", "root", "peer",
        "group",
    ];
    let rows: Vec<Value> = collectives
        .iter()
        .zip(expected_names)
        .map(|(call, (track, name))| {
            let mut row = vec![json!(track), json!(name)];
            for key in ARGS {
                row.push(match key {
                    "call" => call["name"].clone(),
                    key => call[key].clone(),
                });
            }
            Value::Array(row)
        })
        .collect();

    each_format(|format| {
        let (file, written) = export(&trace, format);
        assert_eq!(written.slices, facts.calls + 18, "{format:?}");
        let join = rank_track_join(format);
        let args: Vec<String> = ARGS
            .iter()
            .map(|key| format!("extract_arg(s.arg_set_id, '{}')", format.arg(key)))
            .collect();
        let mut checks = common_checks(format, written, &facts);
        checks.extend([
            check(
                "rank tracks: pid, name, collectives",
                format!(
                    "select p.pid, t.name, count(*) from slice s {join} \
                     where s.category = 'nccl_rank' group by 1, 2"
                ),
                vec![
                    json!([pid, main, 15]),
                    json!([pid, child_unknown, 1]),
                    json!([pid, child, 1]),
                    json!([pid, second, 1]),
                ],
            ),
            ordered(check(
                "collectives: track, name, call, comm, rank, nranks, count, datatype, bytes, \
                 op, root, peer, group",
                format!(
                    "select t.name, s.name, {} from slice s {join} \
                     where s.category = 'nccl_rank' order by s.ts",
                    args.join(", ")
                ),
                rows.clone(),
            )),
            check(
                "the outer call's rank slice names the inner call",
                {
                    let ran_as = format!("extract_arg(s.arg_set_id, '{}')", format.arg("ran_as"));
                    format!(
                        "select s.name, {ran_as} from slice s where s.category = 'nccl_rank' \
                         and {ran_as} is not null"
                    )
                },
                vec![json!(["Bcast 400 B", "ncclBroadcast"])],
            ),
            count(
                "each collective's rank slice matches its call slice's time",
                "select count(*) from slice c join slice r on c.ts = r.ts and c.dur = r.dur \
                 where r.category = 'nccl_rank' and c.category = 'collective'",
                18,
            ),
        ]);
        assert_checks(&file, &checks);
    });
}

#[test]
fn a_stacks_trace_loads_with_stacks_as_arguments_and_a_layer_track() {
    let trace = write_trace("stacks", &traces::stacks());
    let module = "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py";
    let scale = [
        "Scale.forward (/w/model.py:33)".to_owned(),
        "Block.forward (/w/model.py:13)".to_owned(),
        format!("Module._call_impl ({module}:1784)"),
        format!("Module._wrapped_call_impl ({module}:1773)"),
        "Net.forward (/w/model.py:22)".to_owned(),
        format!("Module._call_impl ({module}:1784)"),
        format!("Module._wrapped_call_impl ({module}:1773)"),
        "<module> (/w/run.py:5)".to_owned(),
    ]
    .join(" ← ");
    each_format(|format| {
        let (file, written) = export(&trace, format);
        // 15 calls, 7 kernels, 3 layer entries.
        assert_eq!(written.slices, 25);
        let layers = match format {
            Format::Chrome => {
                "select t.name, s.name, s.ts, s.dur from slice s join thread_track tt \
                 on s.track_id = tt.id join thread t using (utid) \
                 where s.category = 'python_layer' order by s.ts"
            }
            Format::Perfetto => {
                "select t.name, s.name, s.ts, s.dur from slice s join track t \
                 on s.track_id = t.id where s.category = 'python_layer' order by s.ts"
            }
        };
        let track = "Python layers, tid 500";
        let figures = [
            "calls",
            "launches",
            "time_in_calls_ns",
            "gpu_ns",
            "gpu_kernels",
        ]
        .map(|name| format!("extract_arg(arg_set_id, '{}')", format.arg(name)))
        .join(", ");
        assert_checks(
            &file,
            &[
                ordered(check(
                    "layer entries: track, class, start, duration",
                    layers,
                    vec![
                        json!([track, "Linear", 11_000, 3_000]),
                        json!([track, "Block", 15_000, 5_000]),
                        json!([track, "Linear", 21_000, 8_000]),
                    ],
                )),
                ordered(check(
                    "layer entries' calls, launches, time in calls and GPU time",
                    format!(
                        "select {figures} from slice where category = 'python_layer' order by ts"
                    ),
                    vec![
                        json!([2, 2, 2_000, 30_000, 2]),
                        json!([3, 2, 3_000, 12_000, 2]),
                        json!([2, 0, 3_500, 0, 0]),
                    ],
                )),
                check(
                    "a launch's stack, innermost frame first",
                    format!(
                        "select extract_arg(arg_set_id, '{}') from slice where ts = 15000 \
                         and category = 'launch'",
                        format.arg("stack")
                    ),
                    vec![json!([scale])],
                ),
                count(
                    "calls whose stack is written as frames (all 12 whose stack line is there)",
                    format!(
                        "select count(*) from slice where extract_arg(arg_set_id, '{}') \
                         like '%(/%'",
                        format.arg("stack")
                    ),
                    12,
                ),
            ],
        );
    });
}

// ---- --stacks: the stacks as interned callstacks, calls and GPU time as samples ----

/// The frames of the stacks trace (`traces/stacks.rs`) as the export names them.
fn frame_name(qualname: &str, file: &str, line: u32) -> String {
    format!("{qualname} ({file}:{line})")
}

/// The samples of each thread's calls and GPU time in the stacks trace, as the trace
/// processor reads the Perfetto export: frames, callsites, samples, their threads.
fn stacks_profile_checks(every: Option<u32>) -> Vec<Check> {
    let module = "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py";
    let linear = "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py";
    let threading = "/usr/lib/python3.12/threading.py";
    let frames = [
        ("<module>", "/w/run.py", 3),
        ("<module>", "/w/run.py", 5),
        ("Module._wrapped_call_impl", module, 1773),
        ("Module._call_impl", module, 1784),
        ("Net.forward", "/w/model.py", 22),
        ("Block.forward", "/w/model.py", 12),
        ("Linear.forward", linear, 125),
        ("Block.forward", "/w/model.py", 13),
        ("Scale.forward", "/w/model.py", 33),
        ("Block.forward", "/w/model.py", 14),
        ("Thread.run", threading, 1012),
    ];
    let mut frame_rows: Vec<Value> = frames
        .iter()
        .map(|(qualname, file, line)| json!([frame_name(qualname, file, *line), file, line]))
        .collect();
    frame_rows.push(json!(["(cut at the frame budget)", "", 0]));
    let name = |(qualname, file, line): (&str, &str, u32)| frame_name(qualname, file, line);
    // Each stack from its outermost frame: (depth, frame, parent frame).
    let outer_block = [
        ("<module>", "/w/run.py", 5),
        ("Module._wrapped_call_impl", module, 1773),
        ("Module._call_impl", module, 1784),
        ("Net.forward", "/w/model.py", 22),
        ("Module._wrapped_call_impl", module, 1773),
        ("Module._call_impl", module, 1784),
    ];
    let chain = |inner: &[(&str, &str, u32)]| -> Vec<String> {
        outer_block
            .iter()
            .chain(inner)
            .map(|frame| name(*frame))
            .collect()
    };
    let linear_stack = chain(&[
        ("Block.forward", "/w/model.py", 12),
        ("Module._wrapped_call_impl", module, 1773),
        ("Module._call_impl", module, 1784),
        ("Linear.forward", linear, 125),
    ]);
    let scale_stack = chain(&[
        ("Block.forward", "/w/model.py", 13),
        ("Scale.forward", "/w/model.py", 33),
    ]);
    let block_stack = chain(&[("Block.forward", "/w/model.py", 14)]);
    let run_stack = vec![name(("<module>", "/w/run.py", 3))];
    let thread_stack = vec![
        "(cut at the frame budget)".to_owned(),
        name(("Thread.run", threading, 1012)),
    ];
    // Callsites are shared where stacks share their outer frames.
    let mut callsites = BTreeSet::new();
    for stack in [
        &linear_stack,
        &scale_stack,
        &block_stack,
        &run_stack,
        &thread_stack,
    ] {
        for (depth, frame) in stack.iter().enumerate() {
            let parent = depth.checked_sub(1).map(|up| stack[up].clone());
            callsites.insert((depth, frame.clone(), parent));
        }
    }
    let callsite_rows: Vec<Value> = callsites
        .into_iter()
        .map(|(depth, frame, parent)| json!([depth, frame, parent]))
        .collect();
    let leaf = |stack: &[String]| stack.last().unwrap().clone();
    // Call samples: each call with a stack, at its start (ns since tracing started).
    let calls = [
        (4_000, &run_stack),
        (6_000, &run_stack),
        (8_000, &run_stack),
        (11_000, &linear_stack),
        (13_000, &linear_stack),
        (15_000, &scale_stack),
        (17_000, &block_stack),
        (19_000, &block_stack),
        (21_000, &linear_stack),
        (26_000, &linear_stack),
        (30_000, &run_stack),
    ];
    let mut call_rows: Vec<Value> = calls
        .iter()
        .map(|(ts, stack)| json!([ts, 500, "main thread", leaf(stack)]))
        .collect();
    call_rows.insert(9, json!([22_000, 501, "thread", leaf(&thread_stack)]));
    let sampled = every.map_or(String::new(), |n| format!(", of 1 call in {n} sampled"));
    let gpu_thread = |tid: u32| format!("GPU time of tid {tid}, a sample per 1 µs{sampled}");
    // GPU time: a sample per µs of each stack's kernels on the launching thread, where
    // the sum passes each µs: kernels of 10,000 + 20,000 ns (stack 1), 5,000 (3), 7,000
    // (2) from tid 500, 3,000 (5) from tid 501; tid 502's launch has no stack.
    let gpu_rows = vec![
        json!([
            1_073_742_324,
            gpu_thread(500),
            leaf(&linear_stack),
            30,
            13_000,
            42_000
        ]),
        json!([
            1_073_742_324,
            gpu_thread(500),
            leaf(&scale_stack),
            5,
            43_000,
            47_000
        ]),
        json!([
            1_073_742_324,
            gpu_thread(500),
            leaf(&block_stack),
            7,
            48_000,
            54_000
        ]),
        json!([
            1_073_742_325,
            gpu_thread(501),
            leaf(&thread_stack),
            3,
            55_000,
            57_000
        ]),
    ];
    let timebase = match every {
        Some(n) => format!("Python stacks: 1 call in {n} sampled at random (--stack-every {n})"),
        None => "Python stacks: every call".to_owned(),
    };
    let sample_leaf = "from perf_sample s join thread t using (utid) \
                       join stack_profile_callsite c on s.callsite_id = c.id \
                       join stack_profile_frame f on c.frame_id = f.id";
    vec![
        check(
            "frames: name, file (the mapping), line (rel_pc)",
            "select f.name, m.name, f.rel_pc from stack_profile_frame f \
             join stack_profile_mapping m on f.mapping = m.id",
            frame_rows,
        ),
        count(
            "mappings: one per file (5) and the cut marker's",
            "select count(*) from stack_profile_mapping",
            6,
        ),
        check(
            "callsites: depth, frame, parent's frame",
            "select c.depth, f.name, pf.name from stack_profile_callsite c \
             join stack_profile_frame f on c.frame_id = f.id \
             left join stack_profile_callsite p on c.parent_id = p.id \
             left join stack_profile_frame pf on p.frame_id = pf.id",
            callsite_rows,
        ),
        ordered(check(
            "call samples: time, thread, innermost frame",
            format!(
                "select s.ts, t.tid, t.name, f.name {sample_leaf} \
                 where t.tid < 1073741824 order by s.ts"
            ),
            call_rows,
        )),
        ordered(check(
            "GPU-time samples per thread and stack: count, first and last time",
            format!(
                "select t.tid, t.name, f.name, count(*), min(s.ts), max(s.ts) {sample_leaf} \
                 where t.tid >= 1073741824 group by t.tid, f.name order by t.tid, min(s.ts)"
            ),
            gpu_rows,
        )),
        check(
            "the GPU-time threads are in a process of their own beside the traced one",
            // (A process's main thread, tid = pid, is the trace processor's own.)
            "select t.tid, p.pid, p.name from thread t join process p using (upid) \
             where t.tid >= 1073741824 and t.tid != p.pid",
            vec![
                json!([
                    1_073_742_324,
                    1_090_519_540,
                    "GPU time of python3 run.py (pid 500)"
                ]),
                json!([
                    1_073_742_325,
                    1_090_519_540,
                    "GPU time of python3 run.py (pid 500)"
                ]),
            ],
        ),
        check(
            "processes with samples: the traced one (calls) and its GPU time's",
            "select distinct p.pid from perf_sample s join thread using (utid) \
             join process p using (upid)",
            vec![json!([500]), json!([1_090_519_540])],
        ),
        check(
            "the samples' timebase track says how stacks were taken",
            "select name from perf_counter_track",
            vec![json!([timebase])],
        ),
        count(
            "no CPU-profile samples (calls and GPU time are perf samples)",
            "select count(*) from cpu_profile_stack_sample",
            0,
        ),
    ]
}

#[test]
fn a_stacks_trace_has_its_stacks_as_interned_callstacks_and_samples() {
    let trace = write_trace("stack-samples", &traces::stacks());
    let (file, _) = export(&trace, Format::Perfetto);
    let output = Command::new(CUDATRACE)
        .args(["export", "--format", "perfetto", "-o", "/dev/null"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        stderr(&output).contains(
            "cudatrace: stack samples: 12 calls, 45 of GPU time (a sample per 1 µs; 0 ns of \
             GPU time below a whole sample per thread and stack)"
        ),
        "{}",
        stderr(&output)
    );
    assert_checks(&file, &stacks_profile_checks(None));
    // The JSON has no samples.
    let (json_file, _) = export(&trace, Format::Chrome);
    assert_checks(
        &json_file,
        &[count(
            "no samples or frames in the JSON",
            "select (select count(*) from perf_sample) + (select count(*) from \
             stack_profile_frame)",
            0,
        )],
    );
}

#[test]
fn sampled_stacks_say_so_in_their_track_names() {
    let text = traces::stacks().replacen(r#""depth":64}"#, r#""depth":64,"every":7}"#, 1);
    assert!(text.contains(r#""every":7"#));
    let trace = write_trace("stack-samples-every", &text);
    let (file, _) = export(&trace, Format::Perfetto);
    assert_checks(&file, &stacks_profile_checks(Some(7)));
}

#[test]
fn a_merge_of_two_stacks_traces_keeps_each_ones_samples_and_shares_their_stacks() {
    let host = |name: &str| {
        traces::stacks().replacen(
            r#""start_monotonic_ns":1000000,"#,
            &format!(r#""start_monotonic_ns":1000000,"start_wall_ns":1795400000000000000,"host":"{name}","#),
            1,
        )
    };
    let a = write_trace("stack-merge-a", &host("a"));
    let b = write_trace("stack-merge-b", &host("b"));
    let job = a.with_file_name("job.pftrace");
    let output = Command::new(CUDATRACE)
        .arg("merge")
        .args([&a, &b])
        .arg("-o")
        .arg(&job)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // Trace i's pids and tids are (i + 1) × 2^22 + the trace's; its GPU time's process
    // and threads 2^30 + 2^24 and 2^30 more.
    let mut rows = Vec::new();
    for (index, host) in [(1u64, "a"), (2, "b")] {
        let pid = index * (1 << 22) + 500;
        let process = format!("{host}: python3 run.py (pid 500)");
        let gpu_pid = (1 << 30) + (1 << 24) + pid;
        let gpu_process = format!("GPU time of {process} (pid {pid})");
        rows.push(json!([pid, process, pid, "main thread", 11]));
        rows.push(json!([pid, process, pid + 1, "thread", 1]));
        for (tid, samples) in [(pid, 42), (pid + 1, 3)] {
            let thread = format!("GPU time of tid {tid}, a sample per 1 µs");
            rows.push(json!([
                gpu_pid,
                gpu_process,
                (1 << 30) + tid,
                thread,
                samples
            ]));
        }
    }
    assert_checks(
        &job,
        &[
            check(
                "samples per process and thread",
                "select p.pid, p.name, t.tid, t.name, count(*) from perf_sample s \
                 join thread t using (utid) join process p using (upid) group by p.pid, t.tid",
                rows,
            ),
            count(
                "the traces' stacks, interned once: callsites",
                "select count(*) from stack_profile_callsite",
                16,
            ),
            count("frames", "select count(*) from stack_profile_frame", 12),
        ],
    );
}

#[test]
fn gpu_sample_us_makes_gpu_time_samples_coarser_and_says_what_is_left() {
    let trace = write_trace("stack-samples-coarse", &traces::stacks());
    let file = trace.with_extension("pftrace");
    let export = |flag: &str| {
        Command::new(CUDATRACE)
            .args([
                "export",
                "--format",
                "perfetto",
                "--gpu-sample-us",
                flag,
                "-o",
            ])
            .arg(&file)
            .arg(&trace)
            .output()
            .unwrap()
    };
    assert_eq!(export("0").status.code(), Some(2));
    let output = export("10");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // Stack 1's kernels (10,000 + 20,000 ns) pass 10, 20 and 30 µs at 22, 32 and 42 µs
    // since tracing started; stacks 3 (5,000 ns), 2 (7,000) and 5 (3,000) stay below one.
    assert!(
        stderr(&output).contains(
            "stack samples: 12 calls, 3 of GPU time (a sample per 10 µs; 15000 ns of GPU \
             time below a whole sample per thread and stack)"
        ),
        "{}",
        stderr(&output)
    );
    assert_checks(
        &file,
        &[ordered(check(
            "GPU-time samples: thread, time",
            "select t.name, s.ts from perf_sample s join thread t using (utid) \
             where t.tid >= 1073741824 order by s.ts",
            [22_000, 32_000, 42_000]
                .map(|ts| json!(["GPU time of tid 500, a sample per 10 µs", ts]))
                .to_vec(),
        ))],
    );
}
