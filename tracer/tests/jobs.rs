//! One job traced on every node: two ranks on the stand-in libnccl (standin/, NOT NVIDIA's
//! NCCL), each process under its own `cudatrace run` (two "hosts"), meeting at each
//! all-reduce (the stand-in's rendezvous), the last rank late on purpose before every
//! third. Then `cudatrace summary A B` (who waited for whom, exactly as the traces' own
//! times say), the clocks fitted on the kernels' ends with one trace's wall clock shifted
//! by a known offset, `cudatrace merge` read by Perfetto's trace processor, the window
//! (`--start-at`, `--duration`), `-o`'s patterns, and the refusals of bad input.

mod common;

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Child, Command, Output},
};

use common::{gpu::cupti_standin, nccl::nccl_standin, trace_processor, *};
use serde_json::{Value, json};

/// All-reduces per rank, and the last rank's sleep before numbers 3, 6 and 9.
const COUNT: u64 = 9;
const LATE_US: u64 = 100_000;

/// `cudatrace run [--gpu] -o DIR/%h-%r.jsonl -- nccl_caller LIB job RANK 2 ...` with RANK
/// in the environment (as a launcher sets it).
fn start_rank(dir: &Path, rendezvous: &Path, rank: u32, gpu: bool) -> Child {
    let nccl = nccl_standin();
    let mut command = Command::new(CUDATRACE);
    command
        .env("RANK", rank.to_string())
        .env("SLURM_JOB_ID", "4242")
        .env("NCCL_STANDIN_RENDEZVOUS", rendezvous)
        .args(["run", "-q", "-o"])
        .arg(dir.join("%h-%r.jsonl"));
    let libcuda = if gpu {
        command
            .arg("--gpu")
            .arg("--cupti")
            .arg(&cupti_standin().lib)
            .arg("--libcuda")
            .arg(&standin().lib);
        standin().lib.display().to_string()
    } else {
        "-".to_owned()
    };
    command
        .arg("--")
        .arg(&nccl.caller)
        .arg(&nccl.lib)
        .args(["job", &rank.to_string(), "2", &COUNT.to_string()])
        .arg(LATE_US.to_string())
        .arg(libcuda);
    command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running cudatrace")
}

/// Both ranks traced; their traces' paths (named by the host and the launcher's rank).
fn trace_job(dir: &Path, gpu: bool) -> [PathBuf; 2] {
    let rendezvous = dir.join("rendezvous");
    std::fs::create_dir_all(&rendezvous).unwrap();
    let children = [0, 1].map(|rank| start_rank(dir, &rendezvous, rank, gpu));
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");
    }
    let host = host_name();
    [0, 1].map(|rank| {
        let path = dir.join(format!("{host}-{rank}.jsonl"));
        let lines = read_trace(&path);
        assert_complete(&lines);
        // The launcher's job, as cudatrace's environment gives it.
        assert_eq!(lines[0]["job_ids"], json!({"SLURM_JOB_ID": "4242"}));
        path
    })
}

fn host_name() -> String {
    let output = Command::new("uname").arg("-n").output().unwrap();
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

fn cudatrace(args: &[&str]) -> Output {
    Command::new(CUDATRACE)
        .args(args)
        .output()
        .expect("running cudatrace")
}

fn summary_json(traces: &[&Path]) -> Value {
    let mut args = vec!["summary", "--json"];
    args.extend(traces.iter().map(|p| p.to_str().unwrap()));
    let output = cudatrace(&args);
    assert!(output.status.success(), "{}", stderr(&output));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Per trace: its header's wall ns minus monotonic ns, and its all-reduces' (call ts,
/// GPU start, GPU end) by number, on its own clock.
struct Rank {
    wall_minus_mono: i128,
    all_reduces: Vec<(i128, Option<i128>, Option<i128>)>,
}

fn rank_times(path: &Path) -> Rank {
    let lines = read_trace(path);
    let header = &lines[0];
    let wall_minus_mono = header["start_wall_ns"].as_i64().unwrap() as i128
        - header["start_monotonic_ns"].as_i64().unwrap() as i128;
    let calls: Vec<&Value> = calls(&lines)
        .into_iter()
        .filter(|c| c["name"] == "ncclAllReduce")
        .collect();
    let kernel = |call: &Value| {
        let (ts, end) = (
            call["ts_ns"].as_u64().unwrap(),
            call["dur_ns"].as_u64().unwrap(),
        );
        lines.iter().find(|l| {
            l["type"] == "gpu_kernel"
                && (ts..=ts + end).contains(&l["call_ts_ns"].as_u64().unwrap_or(0))
        })
    };
    let all_reduces = calls
        .iter()
        .enumerate()
        .map(|(n, call)| {
            assert_eq!(call["comm_seq"], n as u64 + 1);
            assert_eq!(call["comm_id"], "a0a1a2a3a4a5a6a7");
            let k = kernel(call);
            let start = k.map(|k| k["ts_ns"].as_i64().unwrap() as i128);
            let end =
                k.map(|k| (k["ts_ns"].as_u64().unwrap() + k["dur_ns"].as_u64().unwrap()) as i128);
            (call["ts_ns"].as_i64().unwrap() as i128, start, end)
        })
        .collect();
    Rank {
        wall_minus_mono,
        all_reduces,
    }
}

/// The report's waits per collective: (number, last rank, [wait of rank 0, of rank 1]).
fn waits(comm: &Value) -> Vec<(u64, i64, [u64; 2])> {
    comm["collectives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let wait = |rank: i64| {
                c["ranks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["rank"] == rank)
                    .unwrap()["wait_ns"]
                    .as_u64()
                    .unwrap()
            };
            (
                c["seq"].as_u64().unwrap(),
                c["last_rank"].as_i64().unwrap(),
                [wait(0), wait(1)],
            )
        })
        .collect()
}

/// The waits the analysis must find, from the ranks' ready times (`ready[rank][n]`).
fn expected_waits(ready: [Vec<i128>; 2]) -> Vec<(u64, i64, [u64; 2])> {
    (0..COUNT as usize)
        .map(|n| {
            let (a, b) = (ready[0][n], ready[1][n]);
            let last = if b > a { 1 } else { 0 };
            let latest = a.max(b);
            (
                n as u64 + 1,
                last,
                [(latest - a) as u64, (latest - b) as u64],
            )
        })
        .collect()
}

#[test]
fn two_ranks_under_their_own_cudatrace_are_matched_and_the_late_one_named_exactly() {
    let Some(_guard) = root() else { return };
    let dir = scratch("jobs-calls");
    let [a, b] = trace_job(&dir, false);
    let report = summary_json(&[&a, &b]);
    assert_eq!(report["notes"], json!([]));
    let [ra, rb] = [rank_times(&a), rank_times(&b)];
    // No --gpu: ready when called, on each header's wall clock (the same host: no offset).
    assert_eq!(report["traces"][1]["clock"]["method"], "wall clock");
    let ready = [&ra, &rb].map(|r| {
        r.all_reduces
            .iter()
            .map(|(ts, _, _)| r.wall_minus_mono + ts)
            .collect::<Vec<i128>>()
    });
    let comm = &report["communicators"][0];
    assert_eq!(comm["comm_id"], "a0a1a2a3a4a5a6a7");
    assert_eq!(
        (&comm["nranks"], &comm["ready_from"], &comm["matched"]),
        (&json!(2), &json!("calls"), &json!(COUNT))
    );
    let expected = expected_waits(ready);
    assert_eq!(waits(comm), expected);
    // The sleeps (100 ms, far above scheduling delays): rank 1 last in 3, 6 and 9.
    for n in [3, 6, 9] {
        let (_, last, wait) = expected[n - 1];
        assert_eq!(last, 1, "all-reduce {n}: {wait:?}");
    }
    // Rank 1 held rank 0 back for the sum of its waits: the first straggler.
    let caused: u64 = expected.iter().filter(|w| w.1 == 1).map(|w| w.2[0]).sum();
    assert_eq!(comm["stragglers"][0], 1);
    assert_eq!(comm["ranks"][1]["caused_wait_ns"], caused);
    assert_eq!(comm["ranks"][0]["waited_ns"], caused);
    let text = cudatrace(&["summary", a.to_str().unwrap(), b.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("stragglers, most waited for first: rank 1"),
        "{text}"
    );
}

#[test]
fn clocks_are_fitted_on_the_kernel_ends_and_the_merge_loads_in_perfetto() {
    let Some(_guard) = root() else { return };
    let dir = scratch("jobs-gpu");
    let [a, b] = trace_job(&dir, true);
    // Host b's wall clock off by a known offset (as NTP might leave it).
    const SHIFT: i64 = 1_234_567_891;
    let shifted = dir.join("b-shifted.jsonl");
    let text = std::fs::read_to_string(&b).unwrap();
    let (header, rest) = text.split_once('\n').unwrap();
    let mut header: Value = serde_json::from_str(header).unwrap();
    header["start_wall_ns"] = json!(header["start_wall_ns"].as_i64().unwrap() + SHIFT);
    std::fs::write(&shifted, format!("{header}\n{rest}")).unwrap();

    let report = summary_json(&[&a, &shifted]);
    assert_eq!(report["notes"], json!([]));
    let [ra, rb] = [rank_times(&a), rank_times(&shifted)];
    // The two processes share one CLOCK_MONOTONIC: the kernels' ends agree on it, so the
    // true offset is what maps b's monotonic times onto a's wall clock.
    let truth = ra.wall_minus_mono - rb.wall_minus_mono;
    assert!((truth + SHIFT as i128).abs() < 1_000_000, "{truth}");
    let clock = &report["traces"][1]["clock"];
    assert_eq!(
        (&clock["method"], &clock["collectives_used"]),
        (&json!("collectives"), &json!(COUNT))
    );
    let fitted = clock["offset_ns"].as_i64().unwrap() as i128;
    assert!(
        (fitted - truth).abs() <= 1_000,
        "fitted {fitted}, true {truth}"
    );
    assert_eq!(clock["uncertainty_ns"], 0);

    // Ready when each rank's kernel starts; the transfer, the stand-in's 100 µs.
    let comm = &report["communicators"][0];
    assert_eq!(comm["ready_from"], "gpu");
    let ready = [&ra, &rb].map(|r| {
        r.all_reduces
            .iter()
            .map(|(_, start, _)| start.unwrap())
            .collect::<Vec<i128>>()
    });
    assert_eq!(waits(comm), expected_waits(ready));
    for collective in comm["collectives"].as_array().unwrap() {
        assert_eq!(collective["transfer_ns"], 100_000);
        // 4 MiB all-reduced by 2 ranks in 100 µs: 2(n-1)/n x 41.94304 GB/s.
        assert_eq!(collective["algbw_gb_s"], 41.94304);
        assert_eq!(collective["busbw_gb_s"], 41.94304);
    }
    assert_eq!(comm["stragglers"][0], 1);

    // The merge: clean in the trace processor, both ranks named, the kernels of each
    // all-reduce ending at one instant on the merged clock.
    let merged = dir.join("job.pftrace");
    let output = cudatrace(&[
        "merge",
        a.to_str().unwrap(),
        shifted.to_str().unwrap(),
        "-o",
        merged.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let said = stderr(&output);
    assert!(said.contains("the reference clock"), "{said}");
    assert!(
        said.contains("± 0 ns (fitted on 9 collectives' kernel ends, to "),
        "{said}"
    );
    let rows = trace_processor::query(
        &merged,
        &[
            "select name from process where name like '% rank %' order by name",
            "select count(*) from slice where name like 'ncclDevKernel%' and dur > 0 and \
             track_id not in (select id from thread_track)",
            "select count(*) from slice where category = 'clock'",
        ],
    );
    let host = host_name();
    let names: Vec<&str> = rows[0].iter().map(|r| r[0].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2);
    assert!(
        names[0].starts_with(&format!("{host} rank 0/2: ")),
        "{names:?}"
    );
    assert!(
        names[1].starts_with(&format!("{host} rank 1/2: ")),
        "{names:?}"
    );
    let gpu_ends = trace_processor::query(
        &merged,
        &[
            "select ts + dur as end_ns, count(*) as n from slice where name like \
           'ncclDevKernel%' and track_id not in (select id from thread_track) \
           group by end_ns order by end_ns",
        ],
    );
    assert_eq!(gpu_ends[0].len(), COUNT as usize, "{:?}", gpu_ends[0]);
    assert!(
        gpu_ends[0].iter().all(|row| row[1] == 2),
        "{:?}",
        gpu_ends[0]
    );
    assert_eq!(rows[1][0][0], 2 * COUNT);
    assert_eq!(rows[2][0][0], 2);
    // The JSON format loads too.
    let merged_json = dir.join("job.json");
    let output = cudatrace(&[
        "merge",
        a.to_str().unwrap(),
        shifted.to_str().unwrap(),
        "-o",
        merged_json.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let rows = trace_processor::query(
        &merged_json,
        &["select count(*) from process where name like '% rank %'"],
    );
    assert_eq!(rows[0][0][0], 2);
}

#[test]
fn a_window_records_its_lines_and_the_command_runs_on_with_its_exit_code() {
    let Some(_guard) = root() else { return };
    let dir = scratch("jobs-window");
    let trace = dir.join("w.jsonl");
    let standin = standin();
    // The driver calls cuCtxSynchronize every 10 ms for 4 s, then the shell exits 7.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--libcuda"])
        .arg(&standin.lib)
        .args([
            "--start-at",
            &format!("{:.3}", now + 1.5),
            "--duration",
            "1s",
            "-o",
        ])
        .arg(&trace)
        .args(["--", "sh", "-c"])
        .arg(format!("{} sleep 4; exit 7", standin.driver.display()))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(7), "{}", stderr(&output));
    let lines = read_trace(&trace);
    assert_complete(&lines);
    let window = &lines[0]["window"];
    let (start, end) = (
        window["start_monotonic_ns"].as_u64().unwrap(),
        window["end_monotonic_ns"].as_u64().unwrap(),
    );
    assert_eq!(end - start, 1_000_000_000);
    assert_eq!(window["duration_ns"], 1_000_000_000u64);
    assert_eq!(
        window["end_wall_ns"].as_u64().unwrap() - window["start_wall_ns"].as_u64().unwrap(),
        1_000_000_000
    );
    let timed: Vec<u64> = lines
        .iter()
        .filter(|l| l["type"] == "call" || l["type"] == "process")
        .map(|l| l["ts_ns"].as_u64().unwrap())
        .collect();
    assert!(!timed.is_empty());
    assert!(
        timed.iter().all(|ts| (start..end).contains(ts)),
        "{timed:?}"
    );
    let footer = lines.last().unwrap();
    // The window closed while the command ran: no exit code in the footer; cudatrace
    // waited for the command and exited with its code (7, above).
    assert_eq!(footer["window"]["closed"], true);
    assert!(footer["window"]["lines_before"].as_u64().unwrap() > 0);
    assert!(footer.get("exit_code").is_none());

    // A window already over is a usage error, before anything runs.
    let output = Command::new(CUDATRACE)
        .args([
            "run",
            "-q",
            "--start-at",
            "2020-01-01T00:00:00Z",
            "--duration",
            "1s",
        ])
        .args(["-o", "/dev/null", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("ended"), "{}", stderr(&output));
    // %r with no launcher's rank in the environment is a usage error.
    let output = Command::new(CUDATRACE)
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("PMI_RANK")
        .args(["run", "-q", "-o"])
        .arg(dir.join("t-%r.jsonl"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("none of RANK, SLURM_PROCID"),
        "{}",
        stderr(&output)
    );
}

// ---- bad input (no root: hand-written traces) ----

fn write(dir: &Path, name: &str, lines: &[Value]) -> PathBuf {
    let path = dir.join(name);
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path
}

fn job_trace(host: &str, version: u32, id: &str, rank: i32, footer: bool) -> Vec<Value> {
    let mut lines = vec![
        json!({"type": "header", "format": "cudatrace", "version": version, "host": host,
               "start_wall_ns": 1_000_000_000u64 + rank as u64, "start_monotonic_ns": 5_000,
               "command": ["train.py"], "pids": [10]}),
        json!({"type": "call", "name": "ncclCommInitRank", "pid": 10, "tid": 10, "ts_ns": 6_000,
               "dur_ns": 10, "ret": 0, "comm": "0x2000", "unique_id": id, "rank": rank,
               "nranks": 2}),
        json!({"type": "call", "name": "ncclAllReduce", "pid": 10, "tid": 10, "ts_ns": 7_000,
               "dur_ns": 10, "ret": 0, "comm": "0x2000", "bytes": 64}),
    ];
    if footer {
        lines.push(json!({"type": "footer", "events": {}}));
    }
    lines
}

#[test]
fn bad_input_is_refused_or_said_with_its_exit_code() {
    let dir = scratch("jobs-bad");
    let id = "00112233445566778899aabbccddeeff";
    let a = write(&dir, "a.jsonl", &job_trace("a", 3, id, 0, true));
    let b = write(&dir, "b.jsonl", &job_trace("b", 3, id, 1, true));
    let run = |args: &[&Path]| {
        let mut command = Command::new(CUDATRACE);
        command.arg("summary").args(args);
        command.output().unwrap()
    };
    // The same trace twice, by name or as a copy.
    let output = run(&[&a, &a]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("are the same file"),
        "{}",
        stderr(&output)
    );
    let copy = dir.join("copy.jsonl");
    std::fs::copy(&a, &copy).unwrap();
    let output = run(&[&a, &copy]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("the same trace (a copy"),
        "{}",
        stderr(&output)
    );
    // Different jobs: no shared communicator, said; still summarised.
    let other = write(
        &dir,
        "other.jsonl",
        &job_trace("c", 3, "ffeeddccbbaa99887766", 1, true),
    );
    let output = run(&[&a, &other]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("no communicator is shared"),
        "{}",
        stderr(&output)
    );
    // A trace without its footer: said.
    let cut = write(&dir, "cut.jsonl", &job_trace("d", 3, id, 1, false));
    let output = run(&[&a, &cut]);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        stderr(&output).contains("cut.jsonl has no footer"),
        "{}",
        stderr(&output)
    );
    // Mixed versions are read alike, and said; a newer one is refused.
    let old = write(&dir, "old.jsonl", &job_trace("e", 2, id, 1, true));
    let output = run(&[&a, &old]);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        stderr(&output).contains("format versions 2 and 3"),
        "{}",
        stderr(&output)
    );
    let newer = write(&dir, "newer.jsonl", &job_trace("f", 5, id, 1, true));
    let output = run(&[&a, &newer]);
    assert_eq!(output.status.code(), Some(65));
    assert!(
        stderr(&output).contains("trace format version 5"),
        "{}",
        stderr(&output)
    );
    // Not a trace; no file.
    let text = write(&dir, "text.jsonl", &[json!({"hello": 1})]);
    assert_eq!(run(&[&a, &text]).status.code(), Some(65));
    assert_eq!(run(&[&a, &dir.join("none.jsonl")]).status.code(), Some(74));
    // The matched pair: one collective, rank 1 later by the headers' 1 ns.
    let output = Command::new(CUDATRACE)
        .args(["summary", "--json", "--job"])
        .arg(&dir)
        .output()
        .unwrap();
    // --job takes every *.jsonl of the folder: here the copy makes it refuse.
    assert_eq!(output.status.code(), Some(2));
    let report = summary_json(&[&a, &b]);
    assert_eq!(report["communicators"][0]["collectives"][0]["last_rank"], 1);
    assert_eq!(
        report["communicators"][0]["collectives"][0]["max_wait_ns"],
        1
    );
    // merge says the same, and its output cannot be written through a link.
    let link = dir.join("link.pftrace");
    std::os::unix::fs::symlink(dir.join("target.pftrace"), &link).unwrap();
    let output = Command::new(CUDATRACE)
        .arg("merge")
        .args([&a, &b])
        .arg("-o")
        .arg(&link)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(73), "{}", stderr(&output));
}

#[test]
fn empty_cut_and_skipped_traces_of_a_job_are_read_and_said() {
    let dir = scratch("jobs-odd");
    let id = "00112233445566778899aabbccddeeff";
    let a = write(&dir, "a.jsonl", &job_trace("a", 3, id, 0, true));
    // Rank 1, killed in its last line; a malformed line before it.
    let mut cut: String = job_trace("b", 3, id, 1, false)
        .iter()
        .map(|l| format!("{l}\n"))
        .collect();
    cut.insert_str(cut.find('\n').unwrap() + 1, "not json\n");
    cut.push_str(r#"{"type":"call","name":"ncclAllRed"#);
    std::fs::write(dir.join("b.jsonl"), cut).unwrap();
    std::fs::write(dir.join("empty.jsonl"), "").unwrap();
    let run = |extra: &[&str]| {
        Command::new(CUDATRACE)
            .args(["summary", "--json"])
            .args(extra)
            .arg("--job")
            .arg(&dir)
            .output()
            .unwrap()
    };
    let output = run(&[]);
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("b.jsonl:2: expected ident at column 2"),
        "{}",
        stderr(&output)
    );
    let output = run(&["--skip-bad-lines"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let (b, empty) = (dir.join("b.jsonl"), dir.join("empty.jsonl"));
    assert_eq!(
        stderr(&output),
        format!(
            "cudatrace: note: {empty} is empty (its tracer wrote nothing, or was killed before \
             its header was whole): a rank with nothing, left out\n\
             cudatrace: skipped 1 malformed lines of {b}\n\
             cudatrace:   {b}:2: expected ident at column 2\n\
             cudatrace: note: {b} has no footer (cut short, its line 5 cut mid-line): \
             collectives after the cut are missing from it\n",
            empty = empty.display(),
            b = b.display()
        )
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["traces"].as_array().unwrap().len(), 2);
    assert_eq!(report["traces"][1]["skipped_lines"], 1);
    assert_eq!(report["communicators"][0]["matched"], 1);
    // The merge reads them alike.
    let output = Command::new(CUDATRACE)
        .args(["merge", "--skip-bad-lines", "--job"])
        .arg(&dir)
        .arg("-o")
        .arg(dir.with_extension("merged.json"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    drop(a);
}

#[test]
fn traces_of_different_runs_are_refused_or_summarised_apart() {
    let dir = scratch("jobs-runs");
    // NCCL_COMM_ID set: every run's communicator has the same id.
    let id = "00112233445566778899aabbccddeeff";
    let a = write(&dir, "a.jsonl", &job_trace("a", 3, id, 0, true));
    let mut later = job_trace("b", 3, id, 1, true);
    // The next run, 19 s later.
    later[0]["start_wall_ns"] = json!(20_000_000_001u64);
    let later = write(&dir, "later.jsonl", &later);
    let mut bigger = job_trace("c", 3, id, 1, true);
    bigger[1]["nranks"] = json!(4);
    let bigger = write(&dir, "bigger.jsonl", &bigger);
    let run = |args: &[&str], traces: [&Path; 2]| {
        Command::new(CUDATRACE)
            .args(args)
            .args(traces)
            .output()
            .unwrap()
    };
    let apart = format!(
        "{} and {} are not of one run: {} starts 19.000 s after {} ends (their wall clocks; \
         one run's traces overlap in time)",
        a.display(),
        later.display(),
        later.display(),
        a.display()
    );
    let output = run(&["summary"], [&a, &later]);
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        format!(
            "cudatrace: error: {apart}; pass --separate-runs to summarise each run on its own\n"
        )
    );
    assert!(output.stdout.is_empty());
    let merged = dir.join("job.json");
    let output = run(&["merge", "-o", merged.to_str().unwrap()], [&a, &later]);
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        format!("cudatrace: error: {apart}; merge each run's traces on their own\n")
    );
    assert!(!merged.exists());
    // Overlapping, but of two Slurm jobs.
    let mut other_job = job_trace("d", 3, id, 1, true);
    other_job[0]["job_ids"] = json!({"SLURM_JOB_ID": "8", "PBS_JOBID": "x"});
    let other_job = write(&dir, "other-job.jsonl", &other_job);
    let mut slurm = job_trace("a", 3, id, 0, true);
    slurm[0]["job_ids"] = json!({"SLURM_JOB_ID": "7"});
    let slurm = write(&dir, "slurm.jsonl", &slurm);
    let output = run(&["summary"], [&slurm, &other_job]);
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        format!(
            "cudatrace: error: {0} and {1} are not of one run: their launcher's jobs differ \
             (SLURM_JOB_ID 7 in {0}, 8 in {1}); pass --separate-runs to summarise each run on \
             its own\n",
            slurm.display(),
            other_job.display()
        )
    );
    // A job id on one side only says nothing.
    assert_eq!(run(&["summary"], [&a, &other_job]).status.code(), Some(0));
    let output = run(&["summary"], [&a, &bigger]);
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        format!(
            "cudatrace: error: {0} and {1} are not of one run: communicator 0011223344556677 has 2 ranks \
             in {0} and 4 in {1}; pass --separate-runs to summarise each run on its own\n",
            a.display(),
            bigger.display()
        )
    );
    // Apart: each run on its own, each with its one rank.
    let output = run(&["summary", "--json", "--separate-runs"], [&a, &later]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for (run, trace) in runs.iter().zip([&a, &later]) {
        assert_eq!(run["traces"].as_array().unwrap().len(), 1);
        assert_eq!(run["traces"][0]["file"], trace.to_str().unwrap());
        assert_eq!(run["communicators"][0]["matched"], 0);
    }
    let output = run(&["summary", "--separate-runs"], [&a, &later]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.starts_with("Run 1 of 2\nJob: 1 traces\n"), "{text}");
    assert!(text.contains("\nRun 2 of 2\nJob: 1 traces\n"), "{text}");
}

#[test]
fn an_unreadable_trace_exits_74_and_a_bad_line_65_in_summary_and_merge() {
    let dir = scratch("jobs-unreadable");
    let id = "00112233445566778899aabbccddeeff";
    let a = write(&dir, "a.jsonl", &job_trace("a", 3, id, 0, true));
    let missing = dir.join("none.jsonl");
    let folder = dir.join("folder.jsonl");
    std::fs::create_dir(&folder).unwrap();
    let b = write(&dir, "b.jsonl", &job_trace("b", 3, id, 1, true));
    let mut bad_text = std::fs::read_to_string(&b).unwrap();
    std::fs::remove_file(&b).unwrap();
    bad_text.insert_str(bad_text.find('\n').unwrap() + 1, "not json\n");
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, bad_text).unwrap();
    let merged = dir.join("job.pftrace");
    let run = |args: &[&OsStr]| Command::new(CUDATRACE).args(args).output().unwrap();
    for command in [
        vec![OsStr::new("summary")],
        vec![OsStr::new("merge"), OsStr::new("-o"), merged.as_os_str()],
    ] {
        for (trace, why) in [
            (&missing, "No such file or directory (os error 2)"),
            (&folder, "folder"),
        ] {
            let output = run(&[&command[..], &[a.as_os_str(), trace.as_os_str()]].concat());
            assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
            assert_eq!(
                stderr(&output),
                if why == "folder" {
                    common::folder_refused(trace.display())
                } else {
                    format!(
                        "cudatrace: error: cannot open the trace {}: {why}\n",
                        trace.display()
                    )
                }
            );
        }
        let output = run(&[&command[..], &[a.as_os_str(), bad.as_os_str()]].concat());
        assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
        assert!(
            stderr(&output).ends_with(&format!(
                "cudatrace: error: {}:2: expected ident at column 2 (--skip-bad-lines reads \
                 past malformed lines)\n",
                bad.display()
            )),
            "{}",
            stderr(&output)
        );
    }
    assert!(!merged.exists());
    // --job: a folder that cannot be read, or that holds no trace.
    let empty = dir.join("empty");
    std::fs::create_dir(&empty).unwrap();
    for (job, why) in [
        (
            &missing,
            format!(
                "cannot read the folder {}: No such file or directory (os error 2)",
                missing.display()
            ),
        ),
        (
            &empty,
            format!("{} holds no *.jsonl trace", empty.display()),
        ),
    ] {
        let output = run(&[OsStr::new("summary"), OsStr::new("--job"), job.as_os_str()]);
        assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
        assert_eq!(stderr(&output), format!("cudatrace: error: {why}\n"));
    }
}
