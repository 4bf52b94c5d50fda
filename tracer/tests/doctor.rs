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
    // Debian's 5.10 lacks the attach cookie helper (Linux 5.15): run takes another path there.
    let cookies = kernel_at_least(5, 15);
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
    let fork_children = check("fork_children");
    assert_eq!(fork_children["ok"], true, "{fork_children}");
    let hook = if cfg!(target_arch = "aarch64") {
        "caught at its first rseq:rseq_update (arm64's way"
    } else {
        "caught at its clone's return (syscalls:sys_exit_clone)"
    };
    assert!(
        fork_children["detail"].as_str().unwrap().starts_with(hook),
        "{fork_children}"
    );
    assert_eq!(
        check("attach_cookie")["ok"],
        cookies,
        "{}",
        check("attach_cookie")
    );
    assert_eq!(check("func_ip")["ok"], cookies, "{}", check("func_ip"));
    if !cookies {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let release = release.trim();
        assert_eq!(
            check("attach_cookie")["detail"],
            format!(
                "kernel {release} lacks the BPF helper bpf_get_attach_cookie (Linux 5.15): run \
                 tells its uprobes apart by the address they fire at instead, within the \
                 library mappings recorded at mmap"
            )
        );
        assert_eq!(
            check("func_ip")["detail"],
            format!(
                "kernel {release} lacks the BPF helper bpf_get_func_ip (Linux 5.15), needed by \
                 --kernel kprobes, which name their function by address: use a 5.15 or newer \
                 kernel"
            )
        );
    }
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

/// Without attach cookies (5.10) `run` traces by address; `--kernel`'s kprobes, which need
/// `bpf_get_func_ip`, are refused naming the kernel and the helper.
#[test]
fn run_works_without_attach_cookies_and_kprobes_name_the_helper_they_lack() {
    let Some(_guard) = root() else { return };
    let output = Command::new(CUDATRACE)
        .args(["run", "-o", "-", "--libcuda"])
        .arg(&standin().lib)
        .arg("--")
        .arg(&standin().driver)
        .arg("sequence")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let calls = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.contains(r#""type":"call""#))
        .count();
    assert_eq!(calls, 28, "{}", stderr(&output));
    assert!(!stderr(&output).contains("lacks the BPF helper"));

    let kprobes = Path::new("/sys/bus/event_source/devices/kprobe").exists();
    if kernel_at_least(5, 15) || !kprobes {
        return;
    }
    let output = Command::new(CUDATRACE)
        .args([
            "run",
            "-o",
            "-",
            "--kernel",
            "--kernel-hooks",
            "kprobe",
            "--libcuda",
        ])
        .arg(&standin().lib)
        .args(["--", "true"])
        .output()
        .unwrap();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let refusal = format!(
        "kernel {} lacks the BPF helper bpf_get_func_ip (Linux 5.15)",
        release.trim()
    );
    assert_eq!(output.status.code(), Some(70), "{}", stderr(&output));
    assert!(stderr(&output).contains(&refusal), "{}", stderr(&output));
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
    // Debian's 5.10 lacks the attach cookie helper (Linux 5.15) every `run` uprobe reads.
    let cookies = kernel_at_least(5, 15);
    assert_eq!(
        output.status.code(),
        Some(if cookies { 0 } else { 1 }),
        "{}",
        stderr(&output)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["ready"], cookies);
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
