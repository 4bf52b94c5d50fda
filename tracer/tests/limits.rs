//! Root tests of full eBPF maps: with a map shrunk to one entry (the hidden
//! `--map-entries`), every insert that finds it full is counted under its own `lost`
//! reason, in the footer, in a `lost` line and on stderr, exactly.

mod common;

use std::process::Command;

use common::*;
use serde_json::{Value, json};

/// The footer's `lost` object with only the non-zero reasons, and the `lost` lines as
/// (reason, count).
fn losses(trace: &[Value]) -> (Value, Vec<(String, u64)>) {
    let lost = trace.last().unwrap()["lost"].as_object().unwrap();
    let nonzero: serde_json::Map<String, Value> = lost
        .iter()
        .filter(|(_, v)| v.as_u64() != Some(0))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let lines = trace
        .iter()
        .filter(|l| l["type"] == "lost")
        .map(|l| {
            (
                l["reason"].as_str().unwrap().to_owned(),
                l["count"].as_u64().unwrap(),
            )
        })
        .collect();
    (Value::Object(nonzero), lines)
}

#[test]
fn a_child_the_traced_set_cannot_hold_is_counted_not_dropped() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("limit-traced").join("trace.jsonl");
    let output = trace_driver(&trace_path, &["--map-entries", "TRACED=1"], &["fork"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    let calls = calls(&trace);
    let parent = trace[0]["pids"][0].as_u64().unwrap();
    // The parent's two calls; the child (cuMemAlloc_v2 of 12345 bytes) went untraced.
    assert_eq!(names(&calls), ["cuInit", "cuMemAlloc_v2"]);
    assert_eq!(calls[1]["bytes"], 54321);
    assert!(calls.iter().all(|c| c["pid"].as_u64() == Some(parent)));
    let fork = trace.iter().find(|l| l["event"] == "fork").unwrap();
    assert_eq!(fork["pid"].as_u64(), Some(parent));
    let (lost, lines) = losses(&trace);
    assert_eq!(lost, json!({"traced_full": 1, "total": 1}));
    assert_eq!(lines, [("traced_full".to_owned(), 1)]);
    assert!(
        stderr(&output).contains("WARNING: 1 events lost (traced_full 1)"),
        "{}",
        stderr(&output)
    );
}

/// Kernels without attach cookies (5.10) tell a probe by the library mapping it fired in:
/// a fork child the mapping table has no room for makes calls nobody can name, and each
/// is counted. Elsewhere the table is not used and every call is seen.
#[test]
fn calls_in_a_process_the_mapping_table_cannot_hold_are_counted() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("limit-mappings").join("trace.jsonl");
    let output = trace_driver(&trace_path, &["--map-entries", "MAPPINGS=1"], &["fork"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    let (lost, lines) = losses(&trace);
    if kernel_at_least(5, 15) {
        assert_eq!(
            names(&calls(&trace)),
            ["cuInit", "cuMemAlloc_v2", "cuMemAlloc_v2"]
        );
        assert_eq!(lost, json!({}));
        return;
    }
    // The parent's entry takes the one slot: the child's cuMemAlloc_v2 of 12345 bytes is
    // lost, and said to be.
    let calls = calls(&trace);
    assert_eq!(names(&calls), ["cuInit", "cuMemAlloc_v2"]);
    assert_eq!(calls[1]["bytes"], 54321);
    assert_eq!(
        lost,
        json!({"unidentified_probe": 1, "calls": 1, "total": 1})
    );
    assert_eq!(lines, [("unidentified_probe".to_owned(), 1)]);
    assert!(
        stderr(&output).contains("WARNING: 1 events lost (unidentified_probe 1)"),
        "{}",
        stderr(&output)
    );
    assert_eq!(trace.last().unwrap()["entries_seen"], 2);
}

/// Whether this kernel's release is `major.minor` or newer.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap());
    (numbers.next().unwrap(), numbers.next().unwrap()) >= (major, minor)
}

#[test]
fn threads_the_frame_map_cannot_hold_are_counted() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("limit-frames").join("trace.jsonl");
    // The main thread's frame stack takes the one entry for the process's life; the four
    // threads' calls find the map full.
    let output = trace_driver(
        &trace_path,
        &["--map-entries", "FRAMES=1"],
        &["threads-main"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    assert_eq!(names(&calls(&trace)), ["cuInit"]);
    let (lost, lines) = losses(&trace);
    assert_eq!(lost, json!({"frames_full": 4, "calls": 4, "total": 4}));
    let counted: u64 = lines.iter().map(|(_, n)| n).sum();
    assert!(lines.iter().all(|(reason, _)| reason == "frames_full"));
    assert_eq!(counted, 4);
    // Seen plus lost is every call made.
    assert_eq!(trace.last().unwrap()["entries_seen"], 5);
}

/// `cudatrace run --kernel` on stand-in device files under `dir`, with `map_entries`.
fn trace_kernel(dir: &std::path::Path, map_entries: &[&str], command: &[&str]) -> Vec<Value> {
    let trace_path = dir.join("trace.jsonl");
    let prefix = format!("{}/nvidia", dir.display());
    let mut run = Command::new(CUDATRACE);
    run.args(["run", "-q", "--kernel", "--kernel-hooks", "tracepoint"])
        .args(["--kernel-device-prefix", &prefix, "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace_path);
    for entries in map_entries {
        run.args(["--map-entries", entries]);
    }
    let output = run.arg("--").args(command).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    trace
}

#[test]
fn device_fds_the_fd_map_cannot_hold_are_counted() {
    let Some(_guard) = root() else { return };
    let program = fake_nvidia();
    let dir = scratch("limit-fds");
    let prefix = format!("{}/nvidia", dir.display());
    let other = dir.join("other-file");
    // nvidiactl takes the one entry; nvidia0 and nvidia-uvm find the map full, so of the
    // program's ioctls and mmap only nvidiactl's RM_CONTROL is seen.
    let trace = trace_kernel(
        &dir,
        &["NV_FDS=1"],
        &[program.to_str().unwrap(), &prefix, other.to_str().unwrap()],
    );
    let driver: Vec<&Value> = trace.iter().filter(|l| l["type"] == "driver").collect();
    assert_eq!(driver.len(), 1, "{driver:#?}");
    assert_eq!(driver[0]["device"], "nvidiactl");
    assert_eq!(driver[0]["escape_name"], "NV_ESC_RM_CONTROL");
    let (lost, lines) = losses(&trace);
    assert_eq!(lost, json!({"fds_full": 2, "total": 2}));
    assert_eq!(lines.iter().map(|(_, n)| n).sum::<u64>(), 2);
}

/// `tests/c/map_limits.c` built into `dir`, with its FIFO; the arguments to run it with.
fn map_limits(dir: &std::path::Path) -> [String; 3] {
    let program = dir.join("map-limits");
    gcc(&[
        "-O2",
        "-Wall",
        "-Werror",
        "-pthread",
        "-o",
        program.to_str().unwrap(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/map_limits.c"),
    ]);
    let fifo = dir.join("fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    [
        program.display().to_string(),
        format!("{}/nvidia", dir.display()),
        fifo.display().to_string(),
    ]
}

#[test]
fn opens_library_discovery_cannot_hold_are_counted() {
    let Some(_guard) = root() else { return };
    let dir = scratch("limit-opening");
    let command = map_limits(&dir);
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    // Discovery's own pending-open map: of the two opens while thread A waits in its own,
    // /dev/null goes unchecked for being a library and is counted with --kernel's; the
    // FIFO's, for writing, loads no library and is let be.
    let trace = trace_kernel(&dir, &["OPENING=1"], &command);
    let (lost, lines) = losses(&trace);
    assert_eq!(lost, json!({"opens_full": 1, "total": 1}));
    assert_eq!(lines, [("opens_full".to_owned(), 1)]);
}

#[test]
fn opens_and_ioctls_the_in_flight_maps_cannot_hold_are_counted() {
    let Some(_guard) = root() else { return };
    let dir = scratch("limit-inflight");
    let command = map_limits(&dir);
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let trace = trace_kernel(&dir, &["PENDING_OPEN=1", "SYSCALLS=1"], &command);
    // Two opens while thread A waited in its own; one ioctl while thread B was in its
    // own. B's ioctl itself is reported.
    let (lost, _) = losses(&trace);
    assert_eq!(
        lost,
        json!({"opens_full": 2, "syscalls_full": 1, "total": 3})
    );
    let driver: Vec<&Value> = trace.iter().filter(|l| l["type"] == "driver").collect();
    assert_eq!(driver.len(), 1, "{driver:#?}");
    assert_eq!(driver[0]["hook"], "ioctl");
    assert_eq!(driver[0]["device"], "nvidiactl");
    assert_eq!(driver[0]["cmd"], "0x5421", "FIONBIO");
    assert_ne!(driver[0]["tid"], driver[0]["pid"], "from thread B");
}

#[test]
fn map_sizes_are_checked() {
    for (value, message) in [
        ("FRAMES", "\"FRAMES\" is not MAP=N"),
        ("EVENTS=4", "\"EVENTS\" is not one of TRACED, FRAMES"),
        ("TRACED=0", "a map needs at least 1 entry"),
    ] {
        let output = Command::new(CUDATRACE)
            .args(["run", "--map-entries", value, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{value}");
        assert!(stderr(&output).contains(message), "{}", stderr(&output));
    }
}
