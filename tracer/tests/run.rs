//! Root tests of `cudatrace run` against the stand-in libcuda: exact calls, arguments,
//! process trees, exit codes, signals, loss accounting and error paths.

mod common;

use std::{
    os::unix::fs::MetadataExt,
    process::{Command, Stdio},
    time::Duration,
};

use common::*;
use serde_json::{Value, json};

/// The arguments every call of `cudatrace-driver sequence` must carry, in order.
fn expected_sequence() -> Vec<(&'static str, Value)> {
    let ctx = "0x1000";
    let d_a = "0x7f0000000000";
    let d_b = "0x7f0000100000";
    let stream = "0x1010";
    vec![
        ("cuInit", json!({"flags": 0})),
        ("cuDeviceGet", json!({"device": 0})),
        (
            "cuDevicePrimaryCtxRetain",
            json!({"context": ctx, "device": 0}),
        ),
        ("cuCtxSetCurrent", json!({"context": ctx})),
        ("cuMemAlloc_v2", json!({"bytes": 1048576, "dptr": d_a})),
        ("cuMemAlloc_v2", json!({"bytes": 4096, "dptr": d_b})),
        (
            "cuMemAlloc_v2",
            json!({"bytes": 0, "ret": 1, "ret_name": "CUDA_ERROR_INVALID_VALUE"}),
        ),
        (
            "cuMemcpyHtoD_v2",
            json!({"kind": "HtoD", "bytes": 1048576, "dst": d_a}),
        ),
        ("cuStreamCreate", json!({"stream": stream, "flags": 0})),
        (
            "cuMemcpyHtoDAsync_v2",
            json!({"kind": "HtoD", "bytes": 4096, "dst": d_b, "stream": stream}),
        ),
        ("cuModuleLoadData", json!({"module": "0x1020"})),
        (
            "cuModuleGetFunction",
            json!({"function": "0x1030", "module": "0x1020", "symbol": "_Z10vector_addPKfS0_Pfi"}),
        ),
        (
            "cuLaunchKernel",
            json!({"function": "0x1030", "grid": [4096, 2, 1], "block": [256, 1, 3],
                   "shared_mem": 1024, "stream": stream}),
        ),
        (
            "cuLaunchKernelEx",
            json!({"function": "0x1030", "grid": [128, 64, 2], "block": [32, 8, 4],
                   "shared_mem": 2048, "stream": stream}),
        ),
        (
            "cuLibraryLoadData",
            json!({"library": "0x1040", "count": 0}),
        ),
        (
            "cuLibraryGetKernel",
            json!({"kernel_handle": "0x1050", "library": "0x1040",
                   "symbol": "_ZN5torch6native10add_kernelEPKfS2_Pfi"}),
        ),
        (
            "cuKernelGetFunction",
            json!({"function": "0x1060", "kernel_handle": "0x1050"}),
        ),
        (
            "cuLaunchKernel",
            json!({"function": "0x1050", "grid": [7, 1, 1], "block": [64, 1, 1],
                   "shared_mem": 0, "stream": stream}),
        ),
        ("cuStreamSynchronize", json!({"stream": stream})),
        (
            "cuMemcpyDtoH_v2",
            json!({"kind": "DtoH", "bytes": 4096, "src": d_b}),
        ),
        (
            "cuMemcpyDtoHAsync_v2",
            json!({"kind": "DtoH", "bytes": 65536, "src": d_a, "stream": stream}),
        ),
        (
            "cuMemcpyDtoD_v2",
            json!({"kind": "DtoD", "bytes": 512, "src": d_a, "dst": d_b}),
        ),
        (
            "cuMemcpy2D_v2",
            json!({"kind": "HtoD", "bytes": 4096, "width": 256, "height": 16, "dst": d_b}),
        ),
        (
            "cuMemsetD8_v2",
            json!({"dptr": d_a, "value": 171, "count": 777, "bytes": 777}),
        ),
        ("cuCtxSynchronize", json!({})),
        ("cuMemFree_v2", json!({"dptr": d_b})),
        ("cuMemFree_v2", json!({"dptr": d_a})),
        ("cuDevicePrimaryCtxRelease_v2", json!({"device": 0})),
    ]
}

#[test]
fn sequence_gives_exactly_the_calls_made_with_their_arguments() {
    let Some(_guard) = root() else { return };
    let dir = scratch("sequence");
    let trace_path = dir.join("trace.jsonl");
    let output = assert_no_probe_outlives(|| trace_driver(&trace_path, &[], &["sequence"]));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);

    let header = &trace[0];
    assert_eq!(header["format"], "cudatrace");
    assert_eq!(header["version"], 4);
    assert_eq!(header["mode"], "command");
    assert!(header.get("launch_entry_only").is_none(), "{header}");
    assert!(
        header["probes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p.get("entry_only").is_none())
    );
    assert_eq!(header["libcuda"]["standin"], true);
    assert_eq!(
        header["libcuda"]["path"],
        standin().lib.canonicalize().unwrap().to_str().unwrap()
    );
    assert!(header["probes"].as_array().unwrap().len() > 90);
    let pid = header["pids"][0].as_u64().unwrap();

    let calls = calls(&trace);
    let expected = expected_sequence();
    assert_eq!(
        names(&calls),
        expected
            .iter()
            .map(|(name, _)| name.to_string())
            .collect::<Vec<_>>()
    );
    let start_ns = header["start_monotonic_ns"].as_u64().unwrap();
    let mut last_ts = 0;
    for (call, (name, fields)) in calls.iter().zip(&expected) {
        for (key, value) in fields.as_object().unwrap() {
            assert_eq!(&call[key], value, "{name}.{key} in {call}");
        }
        if !fields.as_object().unwrap().contains_key("ret") {
            assert_eq!(call["ret"], 0, "{call}");
            assert!(call.get("ret_name").is_none(), "{call}");
        }
        assert_eq!(call["pid"].as_u64(), Some(pid));
        assert_eq!(call["tid"].as_u64(), Some(pid), "single-threaded driver");
        let ts = call["ts_ns"].as_u64().unwrap();
        assert!(ts > start_ns && ts > last_ts, "timestamps increase: {call}");
        let dur = call["dur_ns"].as_u64().unwrap();
        assert!(dur > 0 && dur < 1_000_000_000, "{call}");
        last_ts = ts;
    }
    let footer = trace.last().unwrap();
    assert_eq!(footer["exit_code"], 0);
    assert_eq!(footer["lost"]["total"], 0);
    assert_eq!(footer["entries_seen"], 28);
    assert_eq!(footer["calls_by_name"]["cuMemAlloc_v2"], 3);
    assert_eq!(footer["calls_by_name"]["cuLaunchKernel"], 2);
    let processes: Vec<&Value> = trace.iter().filter(|l| l["type"] == "process").collect();
    assert_eq!(processes.len(), 2);
    assert_eq!(processes[0]["event"], "exec");
    assert_eq!(processes[0]["filename"], standin().driver.to_str().unwrap());
    assert_eq!(processes[1]["event"], "exit");
}

/// The launches `--launch-entry-only` probes at entry alone, as `cudatrace-driver
/// sequence` calls them.
const ENTRY_ONLY: &[&str] = &["cuLaunchKernel", "cuLaunchKernelEx"];

#[test]
fn launch_entry_only_drops_ret_and_dur_of_launches_alone() {
    let Some(_guard) = root() else { return };
    let dir = scratch("sequence-entry-only");
    let trace_path = dir.join("trace.jsonl");
    let output = assert_no_probe_outlives(|| {
        trace_driver(&trace_path, &["--launch-entry-only"], &["sequence"])
    });
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let header = &trace[0];
    assert_eq!(header["launch_entry_only"], true);
    let mut entry_only: Vec<&str> = header["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["entry_only"] == true)
        .map(|p| p["symbol"].as_str().unwrap())
        .collect();
    entry_only.sort_unstable();
    assert_eq!(
        entry_only,
        [
            "cuGraphLaunch",
            "cuGraphLaunch_ptsz",
            "cuLaunchCooperativeKernel",
            "cuLaunchCooperativeKernel_ptsz",
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cuLaunchKernelEx_ptsz",
            "cuLaunchKernel_ptsz",
        ]
    );

    // The same calls in the same order, with the same arguments (grid, block, shared
    // memory, stream, function; cuLaunchKernelEx's from its CUlaunchConfig, read at entry).
    let calls = calls(&trace);
    let expected = expected_sequence();
    assert_eq!(
        names(&calls),
        expected
            .iter()
            .map(|(name, _)| name.to_string())
            .collect::<Vec<_>>()
    );
    let mut last_ts = 0;
    for (call, (name, fields)) in calls.iter().zip(&expected) {
        for (key, value) in fields.as_object().unwrap() {
            assert_eq!(&call[key], value, "{name}.{key} in {call}");
        }
        let ts = call["ts_ns"].as_u64().unwrap();
        assert!(ts > last_ts, "timestamps increase: {call}");
        last_ts = ts;
        if ENTRY_ONLY.contains(name) {
            for key in ["ret", "dur_ns", "ret_name", "warnings"] {
                assert!(call.get(key).is_none(), "{key} in {call}");
            }
        } else {
            assert!(call["ret"].is_u64(), "{call}");
            assert!(call["dur_ns"].as_u64().unwrap() > 0, "{call}");
        }
    }
    let kernels: Vec<&Value> = calls
        .iter()
        .filter(|c| ENTRY_ONLY.contains(&c["name"].as_str().unwrap()))
        .map(|c| &c["kernel"])
        .collect();
    assert_eq!(
        kernels,
        [
            "vector_add(float const*, float const*, float*, int)",
            "vector_add(float const*, float const*, float*, int)",
            "torch::native::add_kernel(float const*, float const*, float*, int)"
        ]
    );
    let footer = trace.last().unwrap();
    assert_eq!(footer["lost"]["total"], 0);
    assert_eq!(footer["entries_seen"], 28);
    assert_eq!(footer["calls_by_name"]["cuLaunchKernel"], 2);
    assert_eq!(footer["calls_by_name"]["cuLaunchKernelEx"], 1);
}

fn alloc_sizes_by_pid(trace: &[Value]) -> Vec<(u64, u64)> {
    calls(trace)
        .iter()
        .filter(|c| c["name"] == "cuMemAlloc_v2")
        .map(|c| (c["pid"].as_u64().unwrap(), c["bytes"].as_u64().unwrap()))
        .collect()
}

#[test]
fn children_are_followed_through_fork_and_exec() {
    let Some(_guard) = root() else { return };
    let dir = scratch("children");
    let trace_path = dir.join("fork.jsonl");
    let output = trace_driver(&trace_path, &[], &["fork"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let parent = trace[0]["pids"][0].as_u64().unwrap();
    let allocs = alloc_sizes_by_pid(&trace);
    assert_eq!(allocs.len(), 2, "{allocs:?}");
    let child = allocs
        .iter()
        .find(|(_, bytes)| *bytes == 12345)
        .expect("child's call")
        .0;
    assert_ne!(child, parent);
    assert!(allocs.contains(&(parent, 54321)));
    let fork = trace
        .iter()
        .find(|l| l["event"] == "fork")
        .expect("fork line");
    assert_eq!(fork["pid"].as_u64(), Some(parent));
    assert_eq!(fork["child_pid"].as_u64(), Some(child));

    let trace_path = dir.join("forkexec.jsonl");
    let driver = standin().driver.to_str().unwrap();
    let output = trace_driver(&trace_path, &[], &["forkexec", driver]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    let sizes: Vec<u64> = alloc_sizes_by_pid(&trace).iter().map(|(_, b)| *b).collect();
    assert!(sizes.contains(&2222), "exec'd child traced: {sizes:?}");
    assert!(sizes.contains(&54321), "{sizes:?}");
    let inits = calls(&trace)
        .iter()
        .filter(|c| c["name"] == "cuInit")
        .count();
    assert_eq!(inits, 2, "cuInit in the parent and in the exec'd child");
}

#[test]
fn threads_are_reported_with_their_own_tids() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("threads").join("trace.jsonl");
    let output = trace_driver(&trace_path, &[], &["threads"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    let mut allocs: Vec<(u64, u64)> = calls(&trace)
        .iter()
        .filter(|c| c["name"] == "cuMemAlloc_v2")
        .map(|c| (c["bytes"].as_u64().unwrap(), c["tid"].as_u64().unwrap()))
        .collect();
    allocs.sort();
    assert_eq!(
        allocs.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        [1000, 1001, 1002, 1003]
    );
    let mut tids: Vec<u64> = allocs.iter().map(|(_, t)| *t).collect();
    tids.dedup();
    assert_eq!(tids.len(), 4, "four distinct threads");
}

/// A process waiting for SIGUSR1, after which it calls cuMemAlloc_v2(4242) and exits.
fn start_waiting_process() -> std::process::Child {
    let mut child = Command::new(&standin().driver)
        .arg("wait-signal")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut ready).unwrap();
    assert_eq!(&ready, b"ready\n");
    child
}

#[test]
fn other_processes_are_ignored_and_dash_p_attaches() {
    let Some(_guard) = root() else { return };
    let dir = scratch("others");
    // Not ours: runs while we trace `exit 0`, must not appear.
    let mut other = start_waiting_process();
    let trace_path = dir.join("others.jsonl");
    let mut tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace_path)
        .arg("--")
        .arg(&standin().driver)
        .args(["sleep", "1"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    unsafe { libc::kill(other.id() as i32, libc::SIGUSR1) };
    assert!(other.wait().unwrap().success());
    assert!(tracer.wait().unwrap().success());
    let trace = read_trace(&trace_path);
    assert!(
        alloc_sizes_by_pid(&trace).is_empty(),
        "the other process's call leaked in"
    );
    assert!(
        calls(&trace)
            .iter()
            .all(|c| c["pid"] == trace[0]["pids"][0])
    );

    // With -p it is traced, and the run ends when it exits.
    let mut target = start_waiting_process();
    let trace_path = dir.join("pid.jsonl");
    let mut tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace_path)
        .args(["-p", &target.id().to_string()])
        .spawn()
        .unwrap();
    wait_for_trace(&trace_path, HEADER);
    unsafe { libc::kill(target.id() as i32, libc::SIGUSR1) };
    assert!(target.wait().unwrap().success());
    assert!(tracer.wait().unwrap().success());
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    assert_eq!(trace[0]["mode"], "pid");
    assert_eq!(alloc_sizes_by_pid(&trace), [(u64::from(target.id()), 4242)]);
}

#[test]
fn the_commands_exit_code_is_returned() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("exitcode").join("trace.jsonl");
    let output = trace_driver(&trace_path, &[], &["exit", "7"]);
    assert_eq!(output.status.code(), Some(7), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    assert_eq!(trace.last().unwrap()["exit_code"], 7);
    assert_eq!(names(&calls(&trace)), ["cuInit"]);
}

#[test]
fn sigterm_mid_run_leaves_a_complete_trace() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("sigterm").join("trace.jsonl");
    let before = cudatrace_program_ids();
    let mut tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace_path)
        .arg("--")
        .arg(&standin().driver)
        .args(["sleep", "30"])
        .spawn()
        .unwrap();
    // A call line, not the header (whose probe list names cuCtxSynchronize too).
    wait_for_trace(&trace_path, r#""type":"call","name":"cuCtxSynchronize""#);
    unsafe { libc::kill(tracer.id() as i32, libc::SIGTERM) };
    let status = tracer.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let footer = trace.last().unwrap();
    assert_eq!(footer["stopped_by"], "SIGTERM");
    let syncs = calls(&trace)
        .iter()
        .filter(|c| c["name"] == "cuCtxSynchronize")
        .count() as u64;
    assert!(syncs >= 1);
    assert_eq!(footer["calls_by_name"]["cuCtxSynchronize"], syncs);
    let left = programs_left_since(&before);
    assert!(
        left.is_empty(),
        "programs {left:?} outlived a SIGTERM'd cudatrace"
    );
}

#[test]
fn more_events_than_the_ring_holds_are_counted_as_lost() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("loss").join("trace.jsonl");
    const TRIGGERED: u64 = 200_000;
    // An 8 KiB ring holds about 56 call events.
    let output = trace_driver(
        &trace_path,
        &["--ring-kib", "8"],
        &["loop", &TRIGGERED.to_string()],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    let footer = trace.last().unwrap();
    let seen = calls(&trace).len() as u64;
    let lost = footer["lost"]["calls"].as_u64().unwrap();
    assert_eq!(seen + lost, TRIGGERED, "seen {seen} + lost {lost}");
    let process_lost = footer["lost"]["process_ring_full"].as_u64().unwrap();
    assert_eq!(
        footer["lost"]["total"].as_u64().unwrap(),
        lost + process_lost
    );
    assert!(lost > 0, "the tiny ring must overflow");
    assert_eq!(footer["entries_seen"], TRIGGERED);
    let lost_lines: u64 = trace
        .iter()
        .filter(|l| l["type"] == "lost")
        .map(|l| l["count"].as_u64().unwrap())
        .sum();
    assert_eq!(
        lost_lines,
        lost + process_lost,
        "lost lines add up to the footer"
    );
    assert!(
        stderr(&output).contains(&format!("{} events lost", lost + process_lost)),
        "{}",
        stderr(&output)
    );
}

#[test]
fn the_command_runs_as_the_sudo_user_who_owns_the_trace() {
    let Some(_guard) = root() else { return };
    // The trace is written as the user: a folder of theirs, which they can reach wherever
    // the checkout is.
    let dir = std::env::temp_dir().join(format!("cudatrace-test-sudo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let trace_path = dir.join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace_path)
        .args(["--", "/usr/bin/id", "-u"])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .env("SUDO_USER", "nobody")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "65534");
    let meta = std::fs::metadata(&trace_path).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    assert_eq!(meta.mode() & 0o777, 0o644);

    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--as-root", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace_path)
        .args(["--", "/usr/bin/id", "-u"])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "0");
}

#[test]
fn dash_o_dash_writes_the_trace_to_stdout() {
    let Some(_guard) = root() else { return };
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "-o", "-", "--libcuda"])
        .arg(&standin().lib)
        .arg("--")
        .arg(&standin().driver)
        .args(["exit", "0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_complete(&lines);
    assert_eq!(names(&calls(&lines)), ["cuInit"]);
}

#[test]
fn errors_have_distinct_exit_codes_and_leave_no_footerless_file() {
    let Some(_guard) = root() else { return };
    let dir = scratch("errors");
    let trace_path = dir.join("trace.jsonl");
    let run = |args: &[&str]| {
        Command::new(CUDATRACE)
            .arg("run")
            .args(args)
            .output()
            .expect("running cudatrace")
    };
    let lib = standin().lib.to_str().unwrap().to_owned();
    let out = trace_path.to_str().unwrap().to_owned();

    let output = run(&["--libcuda", &lib, "-o", &out, "--", "no-such-command-xyz"]);
    assert_eq!(output.status.code(), Some(127));
    assert!(
        stderr(&output).contains("command not found: no-such-command-xyz"),
        "{}",
        stderr(&output)
    );
    assert!(!trace_path.exists());

    let output = run(&[
        "--libcuda",
        "/nonexistent/libcuda.so.1",
        "-o",
        &out,
        "--",
        "true",
    ]);
    assert_eq!(output.status.code(), Some(69));
    assert!(
        stderr(&output).contains("--libcuda /nonexistent/libcuda.so.1"),
        "{}",
        stderr(&output)
    );
    assert!(!trace_path.exists());

    let output = run(&[
        "--libcuda",
        &lib,
        "-o",
        "/nonexistent-dir/t.jsonl",
        "--",
        "true",
    ]);
    assert_eq!(output.status.code(), Some(73));
    assert!(
        stderr(&output).contains("/nonexistent-dir/t.jsonl"),
        "{}",
        stderr(&output)
    );

    let output = run(&["--libcuda", &lib, "-o", &out, "-p", "999999999"]);
    assert_eq!(output.status.code(), Some(66));

    let output = run(&["--libcuda", &lib, "-o", &out]);
    assert_eq!(output.status.code(), Some(2));

    let output = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            CUDATRACE,
            "run",
            "--libcuda",
            &lib,
        ])
        .args(["-o", "/tmp/never.jsonl", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(77), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("run it with sudo"),
        "{}",
        stderr(&output)
    );
    assert!(!trace_path.exists());
}

/// `cudatrace summary --json TRACE`, which must succeed.
fn summary_json(trace: &std::path::Path) -> Value {
    let output = Command::new(CUDATRACE)
        .args(["summary", "--json"])
        .arg(trace)
        .output()
        .expect("running cudatrace summary");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    serde_json::from_slice(&output.stdout).expect("summary --json is JSON")
}

/// Per stage: (name, calls, launches, htod_bytes, dtoh_bytes); the durations add up to
/// the span of the process's calls.
fn stage_rows(summary: &Value) -> Vec<(String, u64, u64, u64, u64)> {
    let stages = summary["stages"][0]["stages"].as_array().unwrap();
    let total: u64 = stages
        .iter()
        .map(|s| s["duration_ns"].as_u64().unwrap())
        .sum();
    assert_eq!(total, summary["span_ns"].as_u64().unwrap());
    stages
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["calls"].as_u64().unwrap(),
                s["launches"].as_u64().unwrap(),
                s["htod_bytes"].as_u64().unwrap(),
                s["dtoh_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn rows(expected: &[(&str, u64, u64, u64, u64)]) -> Vec<(String, u64, u64, u64, u64)> {
    expected
        .iter()
        .map(|(name, a, b, c, d)| (name.to_string(), *a, *b, *c, *d))
        .collect()
}

#[test]
fn launches_carry_kernel_names_and_memory_calls_live_bytes() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("kernel-names").join("trace.jsonl");
    let output = trace_driver(&trace_path, &[], &["sequence"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let calls = calls(&trace);

    let vector_add = (
        "vector_add(float const*, float const*, float*, int)",
        "_Z10vector_addPKfS0_Pfi",
    );
    let add_kernel = (
        "torch::native::add_kernel(float const*, float const*, float*, int)",
        "_ZN5torch6native10add_kernelEPKfS2_Pfi",
    );
    let launches: Vec<(&str, &str, &str)> = calls
        .iter()
        .filter(|c| c.get("grid").is_some())
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["kernel"].as_str().unwrap(),
                c["kernel_mangled"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        launches,
        [
            ("cuLaunchKernel", vector_add.0, vector_add.1),
            ("cuLaunchKernelEx", vector_add.0, vector_add.1),
            // Launched through the CUkernel handle 0x1050.
            ("cuLaunchKernel", add_kernel.0, add_kernel.1),
        ]
    );
    for call in &calls {
        if call.get("grid").is_none() {
            assert!(call.get("kernel").is_none(), "{call}");
        }
    }

    let live: Vec<(&str, Value)> = calls
        .iter()
        .filter(|c| c["name"] == "cuMemAlloc_v2" || c["name"] == "cuMemFree_v2")
        .map(|c| (c["name"].as_str().unwrap(), c["live_bytes"].clone()))
        .collect();
    assert_eq!(
        live,
        [
            ("cuMemAlloc_v2", json!(1048576)),
            ("cuMemAlloc_v2", json!(1052672)),
            ("cuMemAlloc_v2", Value::Null), // failed: nothing changed
            ("cuMemFree_v2", json!(1048576)),
            ("cuMemFree_v2", json!(0)),
        ]
    );
    let memory = &trace.last().unwrap()["memory"]["processes"];
    assert_eq!(memory.as_array().unwrap().len(), 1);
    assert_eq!(memory[0]["pid"], trace[0]["pids"][0]);
    assert_eq!(memory[0]["peak_device_bytes"], 1052672);
    assert_eq!(memory[0]["final_device_bytes"], 0);
    assert_eq!(memory[0]["allocations"], 2);
    assert_eq!(memory[0]["frees"], 2);
    assert_eq!(memory[0]["leak_count"], 0);
    assert_eq!(memory[0]["leaks"], json!([]));

    let summary = summary_json(&trace_path);
    assert_eq!(summary["trace"]["complete"], true);
    assert_eq!(summary["calls"], 28);
    assert_eq!(summary["errors"], 1);
    assert_eq!(summary["kernel_launches"], 3);
    let kernels: Vec<(&str, u64)> = summary["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["kernel"].as_str().unwrap(),
                k["launches"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(kernels, [(vector_add.0, 2), (add_kernel.0, 1)]);
    assert_eq!(
        summary["kernels"][0]["shapes"],
        json!([
            {"grid": [128, 64, 2], "block": [32, 8, 4], "launches": 1},
            {"grid": [4096, 2, 1], "block": [256, 1, 3], "launches": 1},
        ])
    );
    assert_eq!(
        summary["copies"],
        json!([
            {"kind": "DtoD", "count": 1, "bytes": 512},
            {"kind": "DtoH", "count": 2, "bytes": 4096 + 65536},
            {"kind": "HtoD", "count": 3, "bytes": 1048576 + 4096 + 4096},
        ])
    );
    let alloc = summary["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "cuMemAlloc_v2")
        .unwrap();
    assert_eq!((&alloc["count"], &alloc["errors"]), (&json!(3), &json!(1)));
    assert_eq!(alloc["bytes"], 1048576 + 4096);
    assert_eq!(summary["memory"], *memory, "summary and footer agree");
    assert_eq!(
        stage_rows(&summary),
        rows(&[
            ("initialisation", 4, 0, 0, 0),
            ("weight loading", 5, 0, 1048576, 0),
            ("input preparation", 3, 0, 4096, 0),
            ("inference", 7, 3, 0, 0),
            ("output retrieval", 6, 0, 4096, 4096 + 65536),
            ("cleanup", 3, 0, 0, 0),
        ])
    );
}

#[test]
fn the_demo_summary_names_kernels_finds_the_leak_and_the_stages() {
    let Some(_guard) = root() else { return };
    let standin = standin();
    let trace_path = scratch("demo-summary").join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "--libcuda"])
        .arg(&standin.lib)
        .arg("-o")
        .arg(&trace_path)
        .arg("--")
        .arg(&standin.demo)
        .output()
        .expect("running cudatrace");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let err = stderr(&output);
    // The short summary follows the final line.
    let final_line = err.find("cudatrace: 133 calls, 0 lost").expect(&err);
    for needle in [
        "cudatrace: time in calls: ",
        "cudatrace: 80 launches of 3 kernels: sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_w… ×40 (50%)",
        "cudatrace: copies: DtoH 2.50 KiB ×1, HtoD 10.27 MiB ×5",
        "peak 10.52 MiB, final 256.00 KiB, 1 leak (256.00 KiB)",
        "cudatrace: stages, pid ",
    ] {
        let at = err
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in\n{err}"));
        assert!(at > final_line, "{needle:?} before the final line");
    }

    let gemm = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_\
                execute_segment_k_off_kernel__5x_cublas";
    let fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, \
                std::array<char*, 2> >(int, at::native::FillFunctor<float>, std::array<char*, 2>)";
    let trace = read_trace(&trace_path);
    let launch_names: std::collections::BTreeMap<&str, usize> = calls(&trace)
        .iter()
        .filter_map(|c| c["kernel"].as_str())
        .fold(Default::default(), |mut counts, name| {
            *counts.entry(name).or_default() += 1;
            counts
        });
    assert_eq!(launch_names.len(), 3);
    assert_eq!(launch_names[gemm], 40);
    assert_eq!(launch_names[fill], 20);
    assert!(
        calls(&trace)
            .iter()
            .filter(|c| c["kernel"] == gemm)
            .all(|c| c.get("kernel_mangled").is_none()),
        "cuBLAS names are not mangled"
    );

    let summary = summary_json(&trace_path);
    assert_eq!(summary["calls"], 133);
    assert_eq!(summary["kernel_launches"], 80);
    let kernels = summary["kernels"].as_array().unwrap();
    assert_eq!(kernels[0]["kernel"], gemm);
    assert_eq!(kernels[0]["launches"], 40);
    assert_eq!(kernels[0]["share"], 0.5);
    assert_eq!(
        kernels[0]["shapes"],
        json!([
            {"grid": [4, 8, 1], "block": [256, 1, 1], "launches": 20},
            {"grid": [8, 16, 1], "block": [128, 1, 1], "launches": 20},
        ])
    );
    assert!(
        kernels[1]["kernel"]
            .as_str()
            .unwrap()
            .starts_with("void at::native::elementwise_kernel<128, 2, ")
    );
    assert_eq!(kernels[2]["kernel"], fill);
    assert_eq!(
        kernels[2]["kernel_mangled"],
        "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLi2EEEEviT0_T1_"
    );
    assert_eq!(kernels[2]["shapes"][0]["grid"], json!([256, 1, 1]));

    let weights: u64 = 2 * 1024 * 1024 * 4 + 1024 * 512 * 4 + 512 * 10 * 4;
    assert_eq!(weights, 10_506_240);
    assert_eq!(
        summary["copies"],
        json!([
            {"kind": "DtoH", "count": 1, "bytes": 2560},
            {"kind": "HtoD", "count": 5, "bytes": weights + 262144},
        ])
    );
    let memory = &summary["memory"][0];
    assert_eq!(memory["peak_device_bytes"], weights + 2 * 262144 + 2560);
    assert_eq!(memory["final_device_bytes"], 262144);
    assert_eq!(memory["allocations"], 7);
    assert_eq!(memory["frees"], 6);
    assert_eq!(memory["leak_count"], 1);
    let leak = &memory["leaks"][0];
    assert_eq!(leak["kind"], "device");
    assert_eq!(leak["bytes"], 262144);
    // The bump allocator: the weights, then d_in (262144 B), then the leaked d_act.
    assert_eq!(
        leak["dptr"],
        format!("{:#x}", 0x7f00_0000_0000u64 + weights + 262144)
    );
    assert_eq!(leak["call"], "cuMemAlloc_v2");
    assert_eq!(trace.last().unwrap()["memory"]["processes"][0], *memory);

    assert_eq!(
        stage_rows(&summary),
        rows(&[
            ("initialisation", 4, 0, 0, 0),
            ("weight loading", 16, 0, weights, 0),
            ("input preparation", 4, 0, 262144, 0),
            ("inference", 100, 80, 0, 0),
            ("output retrieval", 2, 0, 0, 2560),
            ("cleanup", 7, 0, 0, 0),
        ])
    );
    let text = Command::new(CUDATRACE)
        .arg("summary")
        .arg(&trace_path)
        .output()
        .unwrap();
    assert_eq!(text.status.code(), Some(0));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(fill), "{text}");
    assert!(
        text.contains("262144 B device 0x7f0000a45000 from cuMemAlloc_v2"),
        "{text}"
    );
}
