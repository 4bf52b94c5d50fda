//! Root: `cudatrace run -p PID --gpu` on programs that started untraced and loop on the
//! stand-in libcuda (standin/README.md: kernel duration = gridX ns, GPU start = API end +
//! 1000 ns). The library goes in through the program's own `dlopen`, records for the
//! window, and leaves: exact counts in the window, and the program finishing by itself
//! with its own output and exit code, nothing of cudatrace's left recording.

mod common;

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Output, Stdio},
    sync::OnceLock,
};

use common::{gpu::cupti_standin, *};
use serde_json::{Value, json};

/// `tests/c/attach_loop.c`, built next to the stand-in libcuda.
fn attach_loop() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let dir = &standin().dir;
        cupti_standin();
        let program = dir.join("attach-loop");
        gcc(&[
            "-O2",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            program.to_str().unwrap(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/attach_loop.c"),
            &format!("-L{}", dir.display()),
            "-l:libcuda.so.1",
            "-Wl,-rpath,$ORIGIN",
        ]);
        program
    })
}

/// A program started untraced, once it said "ready".
struct Target {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Target {
    fn start(command: &mut Command) -> Target {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("CUDA_INJECTION64_PATH")
            .spawn()
            .expect("starting the target");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        Target { child, stdout }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the program to end by itself: its exit code and the rest of its output.
    fn finish(mut self) -> (i32, String, String) {
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        let status = self.child.wait().unwrap();
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        (status.code().unwrap_or(-1), rest, stderr)
    }
}

/// `cudatrace run -p PID --gpu --cupti STANDIN --libcuda STANDIN -o TRACE [extra]`.
fn attach(pid: u32, trace: &Path, extra: &[&str]) -> Output {
    Command::new(CUDATRACE)
        .args(["run", "--gpu", "--missing-probes", "ignore", "--cupti"])
        .arg(&cupti_standin().lib)
        .arg("--libcuda")
        .arg(&standin().lib)
        .arg("-p")
        .arg(pid.to_string())
        .arg("-o")
        .arg(trace)
        .args(extra)
        .output()
        .expect("running cudatrace")
}

fn of_type<'a>(trace: &'a [Value], kind: &str) -> Vec<&'a Value> {
    trace.iter().filter(|l| l["type"] == kind).collect()
}

/// The mean launch times the program printed ("at I: MEAN ns").
fn means(output: &str) -> Vec<u64> {
    output
        .lines()
        .filter_map(|line| line.strip_prefix("at "))
        .filter_map(|rest| rest.split(": ").nth(1)?.strip_suffix(" ns")?.parse().ok())
        .collect()
}

/// Every launch of the window: its kernel, linked by correlation id, or a counted reason;
/// the program's own ending unchanged.
#[test]
fn a_c_program_is_attached_for_the_window_and_finishes_by_itself() {
    let Some(_root) = root() else { return };
    let mut command = Command::new(attach_loop());
    command.args(["4000", "1000"]);
    let target = Target::start(&mut command);
    let pid = target.pid();
    let trace_path = scratch("attach-c").join("trace.jsonl");
    let output = assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "2s"]));
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!("cudatrace: --gpu: attached to process {pid}")),
        "{said}"
    );
    let (code, rest, program_stderr) = target.finish();
    assert_eq!(code, 7, "{program_stderr}");
    assert!(
        rest.ends_with("done 4000 launches, 0 failed\nrecording 0\n"),
        "{rest}"
    );
    assert_eq!(program_stderr, "");

    assert_window(&trace_path, pid, "_Z9attach_mev");
    // "ready" came before the first of them: the first is before the attach.
    let means = means(&rest);
    assert_eq!(means.len(), 40, "{rest}");
    let before = means[0];
    let after = means[means.len() - 5..].iter().min().copied().unwrap();
    assert!(
        after <= 2 * before + 200,
        "launches took {before} ns before the attach, {after} ns after it: {means:?}"
    );
}

/// Every launch of the window: its kernel, linked by correlation id, or a counted reason.
fn assert_window(trace_path: &Path, pid: u32, mangled: &str) {
    let trace = read_trace(trace_path);
    assert_complete(&trace);
    let footer = trace.last().unwrap();
    let launches: Vec<&Value> = of_type(&trace, "call")
        .into_iter()
        .filter(|c| c["name"] == "cuLaunchKernel")
        .collect();
    let kernels = of_type(&trace, "gpu_kernel");
    assert!(launches.len() > 500, "{} launches", launches.len());
    let gpu = &footer["gpu"];
    let issuing = &gpu["issuing"];
    // Each kernel is its launch's (the call it names is a launch line of the trace, with
    // the grid it asked for; its duration is grid X ns), correlation ids 1, 2, 3, ...
    let launch_at: std::collections::HashMap<u64, &Value> =
        launches.iter().map(|c| (u(&c["ts_ns"]), *c)).collect();
    for (index, kernel) in kernels.iter().enumerate() {
        let call = launch_at[&u(&kernel["call_ts_ns"])];
        assert_eq!(kernel["grid"], call["grid"], "{kernel}");
        assert_eq!(u(&kernel["dur_ns"]), u(&kernel["grid"][0]), "{kernel}");
        assert_eq!(u(&kernel["correlation_id"]), index as u64 + 1);
        assert_eq!(
            (&kernel["pid"], &kernel["kernel_mangled"]),
            (&json!(pid), &json!(mangled))
        );
    }
    // The launches of the window, in order: those made before CUPTI recorded (between the
    // probes and the library's start), then one per kernel line, then those whose kernel
    // ran after the window's end (analysed, not written). Counted: with work, or
    // `not_recorded` (with the launches after the window), none missing.
    let before = launches
        .iter()
        .position(|call| call["ts_ns"] == kernels[0]["call_ts_ns"])
        .unwrap();
    assert!(
        launches[before..]
            .iter()
            .zip(&kernels)
            .all(|(call, kernel)| call["ts_ns"] == kernel["call_ts_ns"]),
        "one kernel line for each launch from the first recorded one"
    );
    let beyond = launches.len() - before - kernels.len();
    let after_window = u(&issuing["calls"]) - launches.len() as u64;
    assert!(
        beyond <= 5,
        "{beyond} launches with their kernel after the window"
    );
    // The launches after the window were made while the library still recorded (until it
    // heard the window ended) or after: with work, or not recorded.
    let (with_work, not_recorded) = (u(&issuing["with_work"]), u(&issuing["not_recorded"]));
    assert_eq!(
        (
            with_work + not_recorded,
            u(&issuing["missing"]) + u(&issuing["not_flushed"]) + u(&issuing["no_api_record"])
        ),
        (u(&issuing["calls"]), 0),
        "{issuing}"
    );
    let recorded_after = with_work - (kernels.len() + beyond) as u64;
    assert_eq!(
        recorded_after + (not_recorded - before as u64),
        after_window,
        "{issuing}"
    );
    assert_eq!(u(&gpu["linked"]), u(&issuing["with_work"]));
    assert_eq!(
        footer["lost"]["gpu_not_recorded"], issuing["not_recorded"],
        "counted as lost, by reason"
    );
    assert_eq!(of_type(&trace, "gpu_info").len(), 1);
    assert!(of_type(&trace, "gpu_error").is_empty());
    // The speed after the window is the speed before it (within the noise of a shared
    // machine: the program's own means of 100 launches).
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{value} is not a u64"))
}

/// The same through ctypes: a Python program's main thread sleeps in `clock_nanosleep`
/// between launches, where the trampoline runs; its own output and exit code after.
#[test]
fn a_python_program_is_attached_the_same_way() {
    let Some(_root) = root() else { return };
    let mut command = Command::new("python3");
    command
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/attach_loop.py"
        ))
        .arg(&standin().lib)
        .arg("3000");
    cupti_standin();
    let target = Target::start(&mut command);
    let pid = target.pid();
    let trace_path = scratch("attach-python").join("trace.jsonl");
    let output = assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "2s"]));
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(said.contains("(in clock_nanosleep)"), "{said}");
    let (code, rest, program_stderr) = target.finish();
    assert_eq!(
        (code, rest.as_str(), program_stderr.as_str()),
        (5, "done 3000 launches, 0 failed\n", "")
    );
    assert_window(&trace_path, pid, "_Z9attach_pyv");
}

/// SIGKILL of cudatrace while a thread is stopped, once it points at the trampoline, and
/// during the window: the program runs on to its own end each time (the kernel lets a
/// dead tracer's threads go; the library stops recording once it finds cudatrace gone).
#[test]
fn killing_cudatrace_at_any_phase_leaves_the_program_to_end_normally() {
    let Some(_root) = root() else { return };
    // (phase, what the program says at its end of the stand-in libcupti)
    for (phase, recording) in [
        ("stopped", "recording -1"),
        ("pointed", "recording 0"),
        ("window", "recording 0"),
    ] {
        let mut command = Command::new(attach_loop());
        command.args(["1500", "1000"]);
        let target = Target::start(&mut command);
        let pid = target.pid();
        let trace_path = scratch(&format!("attach-kill-{phase}")).join("trace.jsonl");
        let mut cudatrace = Command::new(CUDATRACE);
        cudatrace
            .args([
                "run",
                "--gpu",
                "-q",
                "--missing-probes",
                "ignore",
                "--cupti",
            ])
            .arg(&cupti_standin().lib)
            .arg("--libcuda")
            .arg(&standin().lib)
            .args(["-p", &pid.to_string(), "-o"])
            .arg(&trace_path)
            .stderr(Stdio::null());
        if phase != "window" {
            cudatrace.env("CUDATRACE_TEST_ATTACH_PAUSE", format!("{phase}:5000"));
        }
        let mut cudatrace = cudatrace.spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let reached = || {
            if phase == "window" {
                return std::fs::read_to_string(&trace_path)
                    .is_ok_and(|text| text.contains(r#""type":"gpu_kernel""#));
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            !status.contains("TracerPid:\t0\n")
        };
        while !reached() {
            assert!(std::time::Instant::now() < deadline, "{phase} never came");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if phase == "pointed" {
            // The registers are set at once after the stop; the pause follows.
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        cudatrace.kill().unwrap();
        cudatrace.wait().unwrap();
        let (code, rest, program_stderr) = target.finish();
        assert_eq!(code, 7, "{phase}: {program_stderr}");
        assert!(
            rest.ends_with(&format!("done 1500 launches, 0 failed\n{recording}\n")),
            "{phase}: {rest}"
        );
        assert_eq!(program_stderr, "", "{phase}");
    }
}
