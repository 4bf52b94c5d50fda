//! Root: `cudatrace run --gpu` end to end against the stand-in libcuda and libcupti
//! (standin/README.md has their rules: GPU start = API end + 1000 ns, kernel duration =
//! gridX*gridY*gridZ ns, copy and memset duration = bytes ns). Exact GPU lines and their
//! links to the call lines, the clock conversion, counted drops, every error with its exit
//! code and message, and nothing injected without `--gpu`.

mod common;

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use common::{gpu::cupti_standin, *};
use serde_json::{Value, json};

/// `cudatrace run --gpu -q --libcuda STANDIN [extra] -o TRACE -- CMD...` with `envs`.
fn run_gpu(trace: &Path, extra: &[&str], envs: &[(&str, &str)], command: &[&str]) -> Output {
    let mut run = Command::new(CUDATRACE);
    // The stand-in leaves out the legacy 32-bit entry points on purpose.
    run.args([
        "run",
        "--gpu",
        "-q",
        "--missing-probes",
        "ignore",
        "--libcuda",
    ])
    .arg(&standin().lib)
    .args(extra)
    .arg("-o")
    .arg(trace)
    .arg("--")
    .args(command)
    .env_remove("CUDA_INJECTION64_PATH")
    .env_remove("CUPTI_STANDIN_DROPPED")
    .env_remove("CUPTI_STANDIN_ENABLE_ERROR");
    for (key, value) in envs {
        run.env(key, value);
    }
    run.output().expect("running cudatrace")
}

/// `cudatrace run --gpu --cupti STANDIN -- cudatrace-driver gpu`, with `cupti` and `envs`.
fn trace_gpu(name: &str, cupti: &Path, envs: &[(&str, &str)]) -> (Output, Vec<Value>) {
    trace_gpu_with(name, cupti, &[], envs)
}

/// [`trace_gpu`] with `extra` flags.
fn trace_gpu_with(
    name: &str,
    cupti: &Path,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> (Output, Vec<Value>) {
    let trace = scratch(name).join("trace.jsonl");
    let driver = standin().driver.display().to_string();
    let mut flags = vec!["--cupti", cupti.to_str().unwrap()];
    flags.extend_from_slice(extra);
    let output = assert_no_probe_outlives(|| run_gpu(&trace, &flags, envs, &[&driver, "gpu"]));
    (output, read_trace(&trace))
}

/// The trace path [`trace_gpu`] writes for `name`.
fn scratch_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}", std::process::id()))
        .join("trace.jsonl")
}

fn of_type<'a>(trace: &'a [Value], kind: &str) -> Vec<&'a Value> {
    trace.iter().filter(|l| l["type"] == kind).collect()
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{value} is not a u64"))
}

/// The 1,500- and 5,000-byte names of `cudatrace-driver gpu`; the second as the first
/// 4 KiB that reach cudatrace.
fn long_names() -> (String, String) {
    let [_, long, huge] = common::gpu::driver_kernel_names();
    (long, huge[..4096].to_owned())
}

/// Every check of the GPU lines of `cudatrace-driver gpu`, whatever the clock they came on.
fn assert_driver_gpu_lines(trace: &[Value]) {
    assert_complete(trace);
    let header = &trace[0];
    let footer = trace.last().unwrap();
    let pid = u(&header["pids"][0]);
    let vector_add = "vector_add(float const*, float const*, float*, int)";
    let (long, huge) = long_names();

    // (correlation id, name, mangled, grid, block, dynamic shared memory, stream, duration)
    let kernels: Vec<Value> = of_type(trace, "gpu_kernel")
        .iter()
        .map(|k| {
            assert_eq!(
                (
                    &k["pid"],
                    &k["device"],
                    &k["context"],
                    &k["static_shared_mem"],
                    &k["registers_per_thread"]
                ),
                (&json!(pid), &json!(0), &json!(1), &json!(512), &json!(40)),
                "{k}"
            );
            json!([
                k["correlation_id"],
                k["kernel"],
                k["kernel_mangled"],
                k["grid"],
                k["block"],
                k["dynamic_shared_mem"],
                k["stream"],
                k["dur_ns"],
                k["warnings"]
            ])
        })
        .collect();
    assert_eq!(
        kernels,
        [
            json!([
                2,
                vector_add,
                "_Z10vector_addPKfS0_Pfi",
                [4096, 2, 1],
                [256, 1, 3],
                1024,
                0x1010,
                8192,
                null
            ]),
            json!([
                3,
                vector_add,
                "_Z10vector_addPKfS0_Pfi",
                [128, 64, 2],
                [32, 8, 4],
                2048,
                0x1010,
                16384,
                null
            ]),
            json!([4, long, null, [7, 1, 1], [64, 1, 1], 0, 7, 7, null]),
            json!([
                5,
                huge,
                null,
                [1, 1, 1],
                [32, 1, 1],
                0,
                0x1010,
                1,
                ["name_truncated"]
            ]),
        ]
    );
    // (correlation id, kind, bytes, source, destination, async, stream, duration)
    let copies: Vec<Value> = of_type(trace, "gpu_copy")
        .iter()
        .map(|c| {
            json!([
                c["correlation_id"],
                c["kind"],
                c["bytes"],
                c["src_kind"],
                c["dst_kind"],
                c["async"],
                c["stream"],
                c["dur_ns"]
            ])
        })
        .collect();
    assert_eq!(
        copies,
        [
            json!([1, "HtoD", 1048576, "pageable", "device", null, 7, 1048576]),
            json!([9, "DtoH", 65536, "device", "pageable", true, 0x1010, 65536]),
        ]
    );
    // (correlation id, bytes, value, memory, async, stream, duration)
    let memsets: Vec<Value> = of_type(trace, "gpu_memset")
        .iter()
        .map(|m| {
            json!([
                m["correlation_id"],
                m["bytes"],
                m["value"],
                m["memory"],
                m["async"],
                m["stream"],
                m["dur_ns"]
            ])
        })
        .collect();
    assert_eq!(
        memsets,
        [
            json!([7, 777, 171, "device", null, 7, 777]),
            json!([8, 400, 7, "device", true, 0x1010, 400]),
        ]
    );

    // Each piece of work links to the call that issued it: correlation ids follow the
    // driver's calls in order (standin/cudatrace_driver.c).
    let issuing = [
        (1, "cuMemcpyHtoD_v2", 0),
        (2, "cuLaunchKernel", 0),
        (3, "cuLaunchKernelEx", 0),
        (4, "cuLaunchKernel", 1),
        (5, "cuLaunchKernel", 2),
        (7, "cuMemsetD8_v2", 0),
        (8, "cuMemsetD32Async", 0),
        (9, "cuMemcpyDtoHAsync_v2", 0),
    ];
    let calls = calls(trace);
    let start = u(&header["start_monotonic_ns"]);
    let end = start + u(&footer["duration_ns"]);
    let mut work: Vec<&Value> = trace
        .iter()
        .filter(|l| {
            matches!(
                l["type"].as_str(),
                Some("gpu_kernel" | "gpu_copy" | "gpu_memset")
            )
        })
        .collect();
    work.sort_by_key(|w| u(&w["correlation_id"]));
    assert_eq!(work.len(), issuing.len());
    for (line, (correlation, name, nth)) in work.iter().zip(issuing) {
        let call = calls
            .iter()
            .filter(|c| c["name"] == name)
            .nth(nth)
            .unwrap_or_else(|| panic!("no call {name} #{nth}"));
        assert_eq!(u(&line["correlation_id"]), correlation);
        assert_eq!(
            (&line["call_tid"], &line["call_ts_ns"], &line["unlinked"]),
            (&call["tid"], &call["ts_ns"], &Value::Null),
            "{line} links to {call}"
        );
        // The GPU starts 1000 ns after CUPTI's end of the call, inside the call's return.
        assert_eq!(line["queued_ns"], 1000, "{line}");
        let (ts, call_ts) = (u(&line["ts_ns"]), u(&call["ts_ns"]));
        assert!(call_ts + 1000 < ts, "{line} starts after {call}");
        // A launch probed at entry alone (--launch-entry-only) has no duration.
        if let Some(dur) = call["dur_ns"].as_u64() {
            assert!(ts <= call_ts + dur + 1000, "{line} vs {call}");
        }
        assert!(
            start < ts && ts + u(&line["dur_ns"]) < end,
            "{line} in the run"
        );
    }

    let info = of_type(trace, "gpu_info");
    assert_eq!(info.len(), 1);
    assert_eq!(info[0]["pid"], pid);
    assert_eq!(info[0]["cupti_version"], 130001);
    assert!(of_type(trace, "gpu_error").is_empty());

    let events = &footer["events"];
    assert_eq!(
        (
            &events["gpu_kernel"],
            &events["gpu_copy"],
            &events["gpu_memset"],
            &events["gpu_info"]
        ),
        (&json!(4), &json!(2), &json!(2), &json!(1))
    );
    // Every launch, copy and memset accounted for: 8 with their work, the NULL launch failed
    // (CUPTI's record says 400, where launches are probed at entry alone).
    assert_eq!(
        footer["gpu"],
        json!({"api_records": 9, "linked": 8, "processes": 1, "fatal_errors": 0,
               "unlinked": {"no_api_record": 0, "no_call": 0, "beyond_window": 0},
               "issuing": {"calls": 9, "with_work": 8, "captured": 0, "failed": 1, "empty": 0,
                           "cupti_held": 0, "no_api_record": 0, "not_flushed": 0, "not_recorded": 0, "missing": 0},
               "name_mismatches": 0, "graph_nodes": {"linked": 0, "unlinked": 0}, "gaps": 0})
    );
    let failed: Vec<(&Value, &Value)> = calls
        .iter()
        .filter(|c| c["function"] == "0x0")
        .map(|c| (&c["ret"], &c["ret_name"]))
        .collect();
    assert_eq!(failed, [(&json!(400), &json!("CUDA_ERROR_INVALID_HANDLE"))]);
    // The injection library as a probe set of its own, listed with the libcuda probes.
    let probes = header["probes"].as_array().unwrap();
    let delivery: Vec<&Value> = probes
        .iter()
        .filter(|p| p["family"] == "gpu_records")
        .collect();
    assert_eq!(delivery.len(), 1);
    assert_eq!(delivery[0]["symbol"], "cudatrace_gpu_records");
}

/// The header's injection library: written into a `cudatrace-gpu-*` directory, gone now.
fn assert_library_removed(header: &Value) -> PathBuf {
    let library = PathBuf::from(header["gpu"]["library"].as_str().unwrap());
    assert_eq!(library.file_name().unwrap(), "libcudatrace_inject.so");
    let dir = library.parent().unwrap();
    assert!(
        dir.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("cudatrace-gpu-"),
        "{}",
        dir.display()
    );
    assert!(!dir.exists(), "{} outlived the run", dir.display());
    library
}

#[test]
fn gpu_lines_are_exact_and_linked_to_their_calls() {
    let Some(_guard) = root() else { return };
    let cupti = cupti_standin();
    let (output, trace) = trace_gpu("gpu-run-exact", &cupti.lib, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_driver_gpu_lines(&trace);
    let info = of_type(&trace, "gpu_info");
    assert_eq!(info[0]["clock"], "monotonic", "CUPTI stamps with our clock");
    let real = std::fs::canonicalize(&cupti.lib).unwrap();
    assert_eq!(info[0]["libcupti"], real.display().to_string());
    assert_eq!(
        (
            &trace[0]["gpu"]["libcupti"],
            &trace[0]["gpu"]["libcupti_from"]
        ),
        (&json!(real.display().to_string()), &json!("--cupti"))
    );
    let footer = trace.last().unwrap();
    assert_eq!(
        footer["lost"],
        json!({"ring_full": 0, "too_deep": 0, "frames_full": 0, "process_ring_full": 0,
               "driver_ring_full": 0, "gpu_ring_full": 0, "gpu_read_failed": 0,
               "cupti_dropped": 0, "gpu_cupti_held": 0, "gpu_no_api_record": 0, "gpu_not_flushed": 0,
               "gpu_not_recorded": 0, "gpu_missing": 0, "traced_full": 0, "fds_full": 0,
               "opens_full": 0,
               "syscalls_full": 0, "kfuncs_full": 0, "attach_ring_full": 0, "not_drained": 0,
               "calls": 0, "total": 0})
    );
    let injected = assert_library_removed(&trace[0]);
    // The injection library is a library like libcuda: its own line, its one probe.
    let libraries = of_type(&trace, "library");
    let injection: Vec<&&Value> = libraries
        .iter()
        .filter(|l| l["set"] == "libcudatrace_inject")
        .collect();
    assert_eq!(injection.len(), 1, "{libraries:#?}");
    assert_eq!(
        (
            &injection[0]["found"],
            &injection[0]["path"],
            &injection[0]["probes"][0]["symbol"],
            &injection[0]["probes"][0]["family"],
        ),
        (
            &json!("written"),
            &json!(injected.display().to_string()),
            &json!("cudatrace_gpu_records"),
            &json!("gpu_records"),
        )
    );
    assert_eq!(injection[0]["probes"].as_array().unwrap().len(), 1);
    // The driver's 22 calls, and the injection library's CUPTI calls (its flushes: as many
    // as the run lasted periods).
    let cupti_calls = calls(&trace)
        .iter()
        .filter(|c| c["name"].as_str().unwrap().starts_with("cupti"))
        .count() as u64;
    assert_eq!(footer["events"]["call"], 22 + cupti_calls);
    assert_eq!(
        stderr(&output),
        format!(
            "cudatrace: {} calls, 0 lost, 2 process events -> {} (command exited with 0)\n",
            22 + cupti_calls,
            scratch_path("gpu-run-exact").display()
        ),
        "-q: the closing line only"
    );
}

#[test]
fn launches_probed_at_entry_alone_still_link_every_piece_of_work() {
    let Some(_guard) = root() else { return };
    let cupti = cupti_standin();
    let (output, trace) = trace_gpu_with(
        "gpu-run-entry-only",
        &cupti.lib,
        &["--launch-entry-only"],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // The same 8 pieces of work, each linked to the same call as without the flag (--gpu
    // probes launches at entry alone anyway).
    assert_driver_gpu_lines(&trace);
    assert_eq!(trace[0]["launch_entry_only"], true);
    assert_eq!(trace[0]["gpu"]["launch_results"], "cupti");
    let probes = trace[0]["probes"].as_array().unwrap();
    let entry_only: Vec<&str> = probes
        .iter()
        .filter(|p| p["entry_only"] == true)
        .map(|p| p["symbol"].as_str().unwrap())
        .collect();
    assert!(entry_only.contains(&"cuLaunchKernel") && entry_only.contains(&"cuGraphLaunch"));
    let launches: Vec<(&Value, &Value, bool)> = calls(&trace)
        .iter()
        .filter(|c| c["name"].as_str().unwrap().starts_with("cuLaunchKernel"))
        .map(|c| (&c["name"], &c["ret"], c["dur_ns"].as_u64().is_some()))
        .collect();
    // Four launches and the failed one: result and duration from CUPTI's records.
    assert_eq!(
        launches,
        [
            (&json!("cuLaunchKernel"), &json!(0), true),
            (&json!("cuLaunchKernelEx"), &json!(0), true),
            (&json!("cuLaunchKernel"), &json!(0), true),
            (&json!("cuLaunchKernel"), &json!(0), true),
            (&json!("cuLaunchKernel"), &json!(400), true),
        ]
    );
    let memset = calls(&trace)
        .into_iter()
        .find(|c| c["name"] == "cuMemsetD8_v2")
        .unwrap();
    assert_eq!(memset["ret"], 0);
    assert!(u(&memset["dur_ns"]) > 0, "{memset}");
}

#[test]
fn without_the_timestamp_callback_cupti_times_are_converted_to_the_trace_clock() {
    let Some(_guard) = root() else { return };
    let cupti = cupti_standin();
    let (output, trace) = trace_gpu("gpu-run-clock", &cupti.without_timestamp_callback, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // The same exact lines: durations, links, and GPU starts 1000 ns after the calls'
    // ends, all on CLOCK_MONOTONIC inside the run, from CUPTI's CLOCK_REALTIME.
    assert_driver_gpu_lines(&trace);
    assert_eq!(of_type(&trace, "gpu_info")[0]["clock"], "converted");
}

#[test]
fn cupti_drops_are_counted_like_every_loss() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("gpu-run-drops").join("trace.jsonl");
    let driver = standin().driver.display().to_string();
    let output = run_gpu(
        &trace_path,
        &["--cupti", cupti_standin().lib.to_str().unwrap()],
        &[("CUPTI_STANDIN_DROPPED", "7")],
        &[&driver, "gpu"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    let lost = of_type(&trace, "lost");
    assert_eq!(lost.len(), 1);
    assert_eq!(
        (&lost[0]["reason"], &lost[0]["count"], &lost[0]["total"]),
        (&json!("cupti_dropped"), &json!(7), &json!(7))
    );
    let footer = trace.last().unwrap();
    assert_eq!(
        (&footer["lost"]["cupti_dropped"], &footer["lost"]["total"]),
        (&json!(7), &json!(7))
    );
    // What CUPTI did keep is all there.
    assert_eq!(of_type(&trace, "gpu_kernel").len(), 4);
    let err = stderr(&output);
    assert!(
        // CUPTI's own drops: a larger ring would not help, so no --ring-kib hint.
        err.contains("cudatrace: WARNING: 7 events lost (cupti_dropped 7)\n"),
        "{err}"
    );
}

#[test]
fn a_cupti_refusal_is_a_gpu_error_and_exit_code_82_unless_the_command_failed() {
    let Some(_guard) = root() else { return };
    let cupti = cupti_standin().lib.to_str().unwrap().to_owned();
    let driver = standin().driver.display().to_string();
    let refuse = [("CUPTI_STANDIN_ENABLE_ERROR", "35")];
    let trace_path = scratch("gpu-run-refused").join("trace.jsonl");
    let output = run_gpu(
        &trace_path,
        &["--cupti", &cupti],
        &refuse,
        &[&driver, "gpu"],
    );
    assert_eq!(output.status.code(), Some(82), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    let pid = u(&trace[0]["pids"][0]);
    let errors = of_type(&trace, "gpu_error");
    assert_eq!(errors.len(), 1);
    let message = "CUPTI refused to record kernel activity: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES \
                   (GPU profiling is restricted to admin users: run as root, or load the nvidia \
                   module with NVreg_RestrictProfilingToAdminUsers=0): GPU activity is not recorded";
    assert_eq!(
        (
            &errors[0]["pid"],
            &errors[0]["stage"],
            &errors[0]["result"],
            &errors[0]["fatal"],
            &errors[0]["message"]
        ),
        (
            &json!(pid),
            &json!("enable_activity"),
            &json!(35),
            &json!(true),
            &json!(message)
        )
    );
    assert!(of_type(&trace, "gpu_kernel").is_empty());
    let footer = trace.last().unwrap();
    assert_eq!(footer["gpu"]["fatal_errors"], 1);
    assert_eq!(footer["exit_code"], 0);
    // Nothing recorded: the 8 launches, copies and memsets that would have run and the
    // failed launch (its result unknown without CUPTI) are lost, not silently missing.
    assert_eq!(
        footer["gpu"]["issuing"],
        json!({"calls": 9, "with_work": 0, "captured": 0, "failed": 0, "empty": 0,
               "cupti_held": 0, "no_api_record": 0, "not_flushed": 0, "not_recorded": 9, "missing": 0})
    );
    let calls = footer["events"]["call"].as_u64().unwrap();
    assert_eq!(
        stderr(&output),
        format!(
            "cudatrace: GPU recording, pid {pid} (enable_activity): {message}\n\
             cudatrace: {calls} calls, 9 lost, 2 process events -> {} (command exited with 0)\n\
             cudatrace: WARNING: 9 events lost (gpu_not_recorded 9)\n\
             cudatrace: GPU recording failed in 1 process (see the gpu_error lines): exit code 82\n",
            trace_path.display()
        ),
        "one line for the error, one for the loss, one for the exit code; the library's own stays quiet"
    );

    // The command's own failure wins: its code, not 82.
    let output = run_gpu(
        &trace_path,
        &["--cupti", &cupti],
        &refuse,
        &[&driver, "exit", "3"],
    );
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert_eq!(of_type(&read_trace(&trace_path), "gpu_error").len(), 1);
}

#[test]
fn errors_before_the_command_starts_have_their_exit_codes() {
    let Some(_guard) = root() else { return };
    let dir = scratch("gpu-run-errors");
    let trace = dir.join("trace.jsonl");
    let driver = standin().driver.display().to_string();
    let expect = |output: Output, code: i32, message: &str| {
        assert_eq!(output.status.code(), Some(code), "{}", stderr(&output));
        let err = stderr(&output);
        assert!(err.starts_with(message), "{err}");
        assert_eq!(err.lines().count(), 1, "one clear line: {err}");
        assert!(!trace.exists(), "no trace file when nothing started");
    };

    let mut all = Command::new(CUDATRACE);
    all.args(["run", "--gpu", "-o"]).arg(&trace).arg("--all");
    expect(
        all.output().unwrap(),
        2,
        "cudatrace: error: --gpu with --all: cudatrace does not put its library into every \
         process; name them with -p PID (attach) or start the command under it",
    );
    // Attaching to a process without libcuda (this test): refused, untouched (exit 83).
    let me = std::process::id();
    let mut attach = Command::new(CUDATRACE);
    attach
        .args(["run", "--gpu", "-o"])
        .arg(&trace)
        .args(["-p", &me.to_string()]);
    expect(
        attach.output().unwrap(),
        83,
        &format!(
            "cudatrace: error: --gpu: cannot attach to process {me}: process {me} has not \
             loaded libcuda: nothing to record; attach once it uses CUDA (or start it under \
             `cudatrace run --gpu -- CMD`)"
        ),
    );
    // A user's own library is chained (gpu_clients.rs); cudatrace's own is refused.
    expect(
        run_gpu(
            &trace,
            &["--cupti", cupti_standin().lib.to_str().unwrap()],
            &[(
                "CUDA_INJECTION64_PATH",
                "/tmp/cudatrace-gpu-x/libcudatrace_inject.so",
            )],
            &[&driver, "gpu"],
        ),
        81,
        "cudatrace: error: CUDA_INJECTION64_PATH is already set to \
         /tmp/cudatrace-gpu-x/libcudatrace_inject.so (cudatrace's own: a cudatrace run --gpu \
         inside another)",
    );
    expect(
        run_gpu(
            &trace,
            &["--cupti", "/nonexistent/libcupti.so.13"],
            &[],
            &[&driver, "gpu"],
        ),
        80,
        "cudatrace: error: --cupti /nonexistent/libcupti.so.13: No such file or directory",
    );
    // No Python on PATH, no toolkit, nothing in the loader's search: nothing to load.
    if machine_has_cupti() {
        eprintln!("skipped the no-libcupti case: this machine has CUPTI");
    } else {
        expect(
            run_gpu(
                &trace,
                &[],
                &[("PATH", "/nonexistent"), ("LD_LIBRARY_PATH", "")],
                &[&driver, "gpu"],
            ),
            80,
            "cudatrace: error: no libcupti found for --gpu (looked in /usr/local/cuda*/",
        );
    }
    // --cupti means nothing without --gpu.
    let output = Command::new(CUDATRACE)
        .args(["run", "--cupti", "/x", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("--gpu"), "{}", stderr(&output));
}

/// A CUDA toolkit or a libcupti in the ldconfig cache, which the search would find first.
fn machine_has_cupti() -> bool {
    let toolkit = ["/usr/local", "/opt"].iter().any(|root| {
        std::fs::read_dir(root).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("cuda"))
        })
    });
    let ldconfig = ["/sbin/ldconfig", "/usr/sbin/ldconfig"].iter().any(|bin| {
        Command::new(bin)
            .arg("-p")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("libcupti"))
    });
    toolkit || ldconfig
}

/// A stand-in Python in `dir/bin`: asked for its `sys.path` (`-c ...`) it names `site`;
/// otherwise it runs `cudatrace-driver gpu`.
fn fake_python(dir: &Path, site: &Path) -> PathBuf {
    let python = dir.join("bin/python3");
    std::fs::create_dir_all(python.parent().unwrap()).unwrap();
    std::fs::write(
        &python,
        format!(
            "#!/bin/sh\nif [ \"$1\" = -c ]; then echo {}; exit 0; fi\nexec {} gpu\n",
            site.display(),
            standin().driver.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    python
}

#[test]
fn libcupti_is_found_in_the_commands_python_wheels_then_the_library_path() {
    let Some(_guard) = root() else { return };
    let dir = scratch("gpu-run-wheels");
    let site = dir.join("site-packages");
    let wheel = site.join("nvidia/cu13/lib");
    std::fs::create_dir_all(&wheel).unwrap();
    std::fs::copy(&cupti_standin().lib, wheel.join("libcupti.so.13")).unwrap();
    let python = fake_python(&dir, &site);
    let trace_path = dir.join("trace.jsonl");
    let output = run_gpu(
        &trace_path,
        &[],
        &[("PATH", "/nonexistent"), ("LD_LIBRARY_PATH", "")],
        &[python.to_str().unwrap(), "train.py"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_eq!(
        (
            &trace[0]["gpu"]["libcupti"],
            &trace[0]["gpu"]["libcupti_from"]
        ),
        (
            &json!(wheel.join("libcupti.so.13").display().to_string()),
            &json!(format!("the NVIDIA wheels of {}", python.display()))
        )
    );
    assert_eq!(of_type(&trace, "gpu_kernel").len(), 4);
    assert_eq!(trace.last().unwrap()["gpu"]["linked"], 8);

    // Not a Python, none on PATH: the command's LD_LIBRARY_PATH (after the toolkit and the
    // ldconfig cache, which CI lacks).
    if machine_has_cupti() {
        eprintln!("skipped the LD_LIBRARY_PATH case: this machine has CUPTI");
        return;
    }
    let driver = standin().driver.display().to_string();
    let output = run_gpu(
        &trace_path,
        &[],
        &[
            ("PATH", "/nonexistent"),
            ("LD_LIBRARY_PATH", wheel.to_str().unwrap()),
        ],
        &[&driver, "gpu"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_eq!(trace[0]["gpu"]["libcupti_from"], "LD_LIBRARY_PATH");
    assert_eq!(of_type(&trace, "gpu_kernel").len(), 4);
}

/// The variables cudatrace puts into the command for `--gpu`.
const INJECTED: [&str; 3] = [
    "CUDA_INJECTION64_PATH",
    "CUDATRACE_CUPTI",
    "CUDATRACE_INJECT_STDERR",
];

/// Runs `sh -c 'env; stat ...'` under `cudatrace run [extra]`, returns the command's
/// output lines and the trace.
fn command_environment(name: &str, extra: &[&str]) -> (Vec<String>, Vec<Value>) {
    let trace = scratch(name).join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--libcuda"])
        .arg(&standin().lib)
        .args(extra)
        .arg("-o")
        .arg(&trace)
        .args(["--", "sh", "-c"])
        .arg(
            "env; if [ -n \"$CUDA_INJECTION64_PATH\" ]; then \
             stat -c 'mode %a %U' \"$(dirname \"$CUDA_INJECTION64_PATH\")\" \"$CUDA_INJECTION64_PATH\"; fi",
        )
        .env_remove("CUDA_INJECTION64_PATH")
        .env_remove("CUDATRACE_CUPTI")
        .env_remove("CUDATRACE_INJECT_STDERR")
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let lines = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    (lines, read_trace(&trace))
}

#[test]
fn nothing_is_injected_without_gpu() {
    let Some(_guard) = root() else { return };
    let (env, trace) = command_environment("gpu-run-no-inject", &[]);
    for var in INJECTED {
        assert!(
            !env.iter().any(|line| line.starts_with(&format!("{var}="))),
            "{var} in the command's environment without --gpu"
        );
    }
    assert!(env.iter().any(|line| line.starts_with("PATH=")), "env ran");
    assert!(trace[0].get("gpu").is_none());
    assert!(trace.last().unwrap().get("gpu").is_none());
    let probes = trace[0]["probes"].as_array().unwrap();
    assert!(probes.iter().all(|p| p["family"] != "gpu_records"));

    // With --gpu: exactly these, the library readable by all and writable by its owner only.
    let cupti = cupti_standin().lib.to_str().unwrap().to_owned();
    let (env, trace) = command_environment("gpu-run-inject", &["--gpu", "--cupti", &cupti]);
    let library = assert_library_removed(&trace[0]);
    let get = |var: &str| {
        env.iter()
            .find_map(|line| line.strip_prefix(&format!("{var}=")))
            .unwrap_or_else(|| panic!("no {var}"))
            .to_owned()
    };
    assert_eq!(get("CUDA_INJECTION64_PATH"), library.display().to_string());
    assert_eq!(
        get("CUDATRACE_CUPTI"),
        std::fs::canonicalize(&cupti).unwrap().display().to_string()
    );
    assert_eq!(get("CUDATRACE_INJECT_STDERR"), "0");
    let modes: Vec<&String> = env.iter().filter(|l| l.starts_with("mode ")).collect();
    assert_eq!(modes, ["mode 755 root", "mode 644 root"]);
    // The shell never called cuInit: no GPU recording, said in the footer.
    assert_eq!(trace.last().unwrap()["gpu"]["processes"], 0);
}

#[test]
fn the_library_is_removed_when_a_signal_stops_tracing() {
    let Some(_guard) = root() else { return };
    let trace = scratch("gpu-run-signal").join("trace.jsonl");
    let mut child = Command::new(CUDATRACE)
        .args(["run", "-q", "--gpu", "--cupti"])
        .arg(&cupti_standin().lib)
        .arg("--libcuda")
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(&standin().driver)
        .args(["sleep", "30"])
        .env_remove("CUDA_INJECTION64_PATH")
        .spawn()
        .unwrap();
    wait_for_trace(&trace, "gpu_info");
    let header = read_trace(&trace)[0].clone();
    let library = PathBuf::from(header["gpu"]["library"].as_str().unwrap());
    assert!(library.is_file(), "the library exists while tracing");
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    std::thread::sleep(Duration::from_millis(10));
    assert_library_removed(&header);
}
