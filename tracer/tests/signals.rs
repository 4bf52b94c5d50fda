//! Root tests of how tracing ends: a signal under a load the reader cannot keep up with,
//! SIGHUP and SIGQUIT, and `-p` with several processes.

mod common;

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::*;
use serde_json::Value;

/// `cudatrace run -q ... -- ARGS` in the background, writing `trace`.
fn start(trace: &std::path::Path, args: &[&std::ffi::OsStr]) -> Child {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(CUDATRACE);
    // SIGHUP at its default, whatever this test inherited (under `nohup` it is ignored,
    // and an ignored signal stays ignored across exec: the traced command would survive
    // the SIGHUP cudatrace passes on, as it should under nohup).
    // SAFETY: signal(2) is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_DFL);
            Ok(())
        });
    }
    command
        .args(["run", "-q", "--missing-probes", "ignore", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .args(args)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

fn kill(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(pid as i32, signal) };
}

#[test]
fn sigint_under_a_flat_out_multithreaded_loop_ends_promptly_with_a_footer() {
    let Some(_guard) = root() else { return };
    const THREADS: u64 = 4;
    let trace_path = scratch("sigint-load").join("trace.jsonl");
    // Four threads calling as fast as they can on a 2-core machine: more producing CPUs
    // than the reader gets, so its ring is never empty.
    let mut tracer = start(
        &trace_path,
        &[
            standin().bench_loop.as_os_str(),
            "1000000000".as_ref(),
            "0".as_ref(),
            THREADS.to_string().as_ref(),
        ],
    );
    wait_for_trace(&trace_path, r#""type":"call","name":"cuCtxSynchronize""#);
    // Long enough for the ring to fill and the reader to fall behind.
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Instant::now();
    kill(tracer.id(), libc::SIGINT);
    let status = tracer.wait().unwrap();
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(130));
    // An unbounded drain would never end under this loop; a bounded one (50 ms a drain,
    // then detach and the footer) ends in about 0.25 s on an idle 2-core machine. 5 s keeps
    // the bound's meaning on a loaded one (1.18 s was seen while other builds ran).
    assert!(took < Duration::from_secs(5), "SIGINT took {took:?}");

    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    let footer = trace.last().unwrap();
    assert_eq!(footer["stopped_by"], "SIGINT");
    // Every call that entered is a line or counted lost, but for those in flight (one per
    // thread) when tracing stopped.
    let entries = footer["entries_seen"].as_u64().unwrap();
    let accounted =
        footer["events"]["call"].as_u64().unwrap() + footer["lost"]["calls"].as_u64().unwrap();
    assert!(
        accounted <= entries && accounted + THREADS >= entries,
        "{accounted} written or lost, {entries} entered"
    );
    eprintln!("SIGINT to exit: {took:?}; {}", footer["lost"]);
    // The loop keeps running after cudatrace: it was not signalled.
    kill(trace[0]["pids"][0].as_u64().unwrap() as u32, libc::SIGKILL);
}

#[test]
fn sighup_and_sigquit_end_tracing_with_a_footer_and_their_own_codes() {
    let Some(_guard) = root() else { return };
    for (signal, name, code, passed_on) in [
        (libc::SIGHUP, "SIGHUP", 129, true),
        (libc::SIGQUIT, "SIGQUIT", 131, false),
    ] {
        let trace_path = scratch(&format!("signal-{name}")).join("trace.jsonl");
        let mut tracer = start(
            &trace_path,
            &[
                standin().driver.as_os_str(),
                "sleep".as_ref(),
                "30".as_ref(),
            ],
        );
        wait_for_trace(&trace_path, r#""type":"call","name":"cuCtxSynchronize""#);
        kill(tracer.id(), signal);
        let status = tracer.wait().unwrap();
        assert_eq!(status.code(), Some(code), "{name}");
        let trace = read_trace(&trace_path);
        assert_complete(&trace);
        assert_eq!(trace.last().unwrap()["stopped_by"], name);
        let command = trace[0]["pids"][0].as_u64().unwrap() as u32;
        // SIGHUP is passed on like SIGTERM; SIGQUIT, like Ctrl-C, comes from the
        // terminal to the command too, so cudatrace leaves it alone.
        let alive = || {
            Path::new(&format!("/proc/{command}")).exists()
                && !std::fs::read_to_string(format!("/proc/{command}/stat"))
                    .unwrap_or_default()
                    .contains(") Z ")
        };
        // A signal passed on is delivered, not awaited: the command may take a moment
        // to die after cudatrace has exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while passed_on && alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(alive(), !passed_on, "{name}: command alive");
        kill(command, libc::SIGKILL);
    }
}

use std::path::Path;

/// A process waiting for SIGUSR1, after which it calls cuMemAlloc_v2(4242) and exits.
fn waiting_process() -> Child {
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
fn every_dash_p_process_is_watched_and_tracing_ends_with_the_last() {
    let Some(_guard) = root() else { return };
    let mut first = waiting_process();
    let mut second = waiting_process();
    let trace_path = scratch("two-pids").join("trace.jsonl");
    let mut tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "--missing-probes", "ignore", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace_path)
        .args([
            "-p",
            &first.id().to_string(),
            "-p",
            &second.id().to_string(),
        ])
        .spawn()
        .unwrap();
    wait_for_trace(&trace_path, HEADER);
    kill(first.id(), libc::SIGUSR1);
    assert!(first.wait().unwrap().success());
    // The first one's exit does not end tracing: the second is still watched.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        tracer.try_wait().unwrap().is_none(),
        "stopped at the first exit"
    );
    kill(second.id(), libc::SIGUSR1);
    assert!(second.wait().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = tracer.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "did not end with the last process"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    assert_eq!(
        trace[0]["pids"],
        serde_json::json!([first.id(), second.id()])
    );
    let allocs: Vec<(u64, u64)> = calls(&trace)
        .iter()
        .filter(|c| c["name"] == "cuMemAlloc_v2")
        .map(|c| (c["pid"].as_u64().unwrap(), c["bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        allocs,
        [
            (u64::from(first.id()), 4242),
            (u64::from(second.id()), 4242)
        ]
    );
    let exits: Vec<&Value> = trace.iter().filter(|l| l["event"] == "exit").collect();
    assert_eq!(exits.len(), 2);
}
