//! Root test of `cudatrace doctor`: its answers match what the kernel really offers.

mod common;

use std::{path::Path, process::Command};

use common::*;
use serde_json::Value;

#[test]
fn doctor_reports_what_this_kernel_allows() {
    let Some(_guard) = root() else { return };
    let output = Command::new(CUDATRACE)
        .args(["doctor", "--json", "--libcuda"])
        .arg(&standin().lib)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ready"], true);
    let check = |name: &str| -> &Value {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
    };
    assert_eq!(check("privileges")["ok"], true);
    assert_eq!(check("uprobes")["ok"], true, "{}", check("uprobes"));
    assert_eq!(check("syscall_tracepoints")["ok"], true);
    assert_eq!(
        check("kprobes")["ok"],
        Path::new("/sys/bus/event_source/devices/kprobe").exists(),
        "{}",
        check("kprobes")
    );
    assert_eq!(
        check("nvidia_module")["ok"],
        Path::new("/sys/module/nvidia").exists()
    );
    assert_eq!(
        check("btf")["ok"],
        Path::new("/sys/kernel/btf/vmlinux").exists()
    );
    let libcuda = check("libcuda")["detail"].as_str().unwrap();
    assert!(
        libcuda.contains("STAND-IN") && libcuda.contains("134 probe points"),
        "{libcuda}"
    );

    let missing = Command::new(CUDATRACE)
        .args(["doctor", "--libcuda", "/nonexistent/libcuda.so.1"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let text = String::from_utf8_lossy(&missing.stdout);
    assert!(text.contains("FAIL libcuda"), "{text}");
    assert!(text.contains("cannot trace here"), "{text}");
}

#[test]
fn doctor_finds_its_uprobe_target_in_a_stripped_binary() {
    let Some(_guard) = root() else { return };
    // Distribution packages strip binaries: the self-test target has no symbol then.
    let stripped = scratch("stripped").join("cudatrace");
    std::fs::copy(CUDATRACE, &stripped).unwrap();
    let status = Command::new("strip").arg(&stripped).status().unwrap();
    assert!(status.success());
    let symbols = Command::new("nm").arg(&stripped).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&symbols.stdout).contains("cudatrace_doctor_target"),
        "strip left the symbol"
    );
    let output = Command::new(&stripped)
        .args(["doctor", "--json", "--libcuda"])
        .arg(&standin().lib)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ready"], true);
    let uprobes = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "uprobes")
        .unwrap();
    assert_eq!(uprobes["ok"], true, "{uprobes}");
    assert_eq!(
        uprobes["detail"],
        "3 calls seen at entry and return through the ring buffer; aya-log works"
    );
}
