//! Root tests of `cudatrace run`'s modes and policies: --all, --missing-probes.

mod common;

use std::process::Command;

use common::*;

#[test]
fn all_traces_processes_outside_the_command_tree() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("all").join("trace.jsonl");
    let mut other = Command::new(&standin().driver)
        .arg("wait-signal")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = [0u8; 6];
    std::io::Read::read_exact(other.stdout.as_mut().unwrap(), &mut ready).unwrap();
    let other_pid = other.id();
    let header_path = trace_path.clone();
    let signaller = std::thread::spawn(move || {
        // Probes are attached once the header is written (attaching is slow in the VM).
        wait_for_trace(&header_path, HEADER);
        unsafe { libc::kill(other_pid as i32, libc::SIGUSR1) };
        other.wait().unwrap()
    });
    let output = trace_driver(&trace_path, &["--all"], &["sleep", "2"]);
    assert!(signaller.join().unwrap().success());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    assert_eq!(trace[0]["mode"], "all");
    // This test's stand-in only: --all also traces other test runs' stand-ins on a shared
    // machine.
    let ours = std::fs::canonicalize(&standin().lib).unwrap();
    let our_libs: Vec<&serde_json::Value> = trace
        .iter()
        .filter(|l| {
            l["type"] == "library"
                && l["path"]
                    .as_str()
                    .and_then(|p| std::fs::canonicalize(p).ok())
                    .is_some_and(|p| p == ours)
        })
        .map(|l| &l["id"])
        .collect();
    assert_eq!(our_libs.len(), 1, "one library line for the stand-in");
    let allocs: Vec<_> = calls(&trace)
        .into_iter()
        .filter(|c| c["name"] == "cuMemAlloc_v2" && our_libs.contains(&&c["lib"]))
        .map(|c| (c["pid"].as_u64().unwrap(), c["bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        allocs,
        [(u64::from(other_pid), 4242)],
        "the outside process is traced"
    );
}

#[test]
fn missing_probes_policy_decides_between_error_warning_and_silence() {
    let Some(_guard) = root() else { return };
    let dir = scratch("missing");
    // The stand-in lacks the 32-bit legacy cuMemAlloc and friends.
    let trace_path = dir.join("error.jsonl");
    let output = trace_driver(&trace_path, &["--missing-probes", "error"], &["exit", "0"]);
    assert_eq!(output.status.code(), Some(78), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("not exported by libcuda: cuMemAlloc,"),
        "{}",
        stderr(&output)
    );
    assert!(
        !trace_path.exists(),
        "nothing written before the policy check"
    );

    let trace_path = dir.join("warn.jsonl");
    let output = trace_driver(&trace_path, &["--missing-probes", "warn"], &["exit", "0"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(stderr(&output).contains("functions not exported by libcuda"));
    let trace = read_trace(&trace_path);
    let missing = trace[0]["missing_functions"].as_array().unwrap();
    assert!(missing.iter().any(|m| m == "cuMemAlloc"), "{missing:?}");

    let trace_path = dir.join("ignore.jsonl");
    let output = trace_driver(&trace_path, &["--missing-probes", "ignore"], &["exit", "0"]);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        !stderr(&output).contains("not exported"),
        "{}",
        stderr(&output)
    );
    assert_eq!(
        read_trace(&trace_path)[0]["missing_functions"],
        trace[0]["missing_functions"]
    );
}
