//! Root tests of `--kernel`. The tracepoint path runs on every kernel through the same
//! code as on the GPU machine, with stand-in device files; the kprobe path runs where the
//! kernel has kprobes (`cargo xtask vm-test` boots one) and otherwise must refuse clearly.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

fn driver_lines(trace: &[Value]) -> Vec<&Value> {
    trace.iter().filter(|l| l["type"] == "driver").collect()
}

#[test]
fn tracepoints_report_nvidia_ioctls_and_mmaps_with_rm_parameters() {
    let Some(_guard) = root() else { return };
    let program = fake_nvidia();
    let dir = scratch("kernel-tp");
    let prefix = format!("{}/nvidia", dir.display());
    let other = dir.join("other-file");
    let trace_path = dir.join("trace.jsonl");
    // The traced command waits a second, so an untraced run of the same program on the
    // same "devices" happens while the hooks are attached: it must not show up.
    let script = format!(
        "sleep 1; exec {} {prefix} {}",
        program.display(),
        other.display()
    );
    let tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "--kernel", "--kernel-hooks", "tracepoint"])
        .args(["--kernel-device-prefix", &prefix, "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace_path)
        .args(["--", "/bin/sh", "-c", &script])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_trace(&trace_path, HEADER);
    let untraced = Command::new(&program)
        .arg(&prefix)
        .arg(&other)
        .status()
        .unwrap();
    assert!(untraced.success());
    let output = tracer.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let hooks = &trace[0]["kernel_hooks"];
    assert_eq!(hooks["mechanism"], "tracepoint");
    assert_eq!(hooks["device_prefix"], prefix.as_str());
    let pid = trace[0]["pids"][0].as_u64().unwrap();

    let driver = driver_lines(&trace);
    assert_eq!(driver.len(), 4, "{driver:#?}");
    assert!(driver.iter().all(|d| d["pid"].as_u64() == Some(pid)));
    let enotty = -25;

    let control = driver[0];
    assert_eq!(control["hook"], "ioctl");
    assert_eq!(control["device"], "nvidiactl");
    assert_eq!(control["cmd"], "0xc020462a");
    assert_eq!(control["escape"], 0x2a);
    assert_eq!(control["escape_name"], "NV_ESC_RM_CONTROL");
    assert_eq!(control["rm_control_cmd"], "0x20800102");
    assert_eq!(control["ret"], enotty);

    let alloc = driver[1];
    assert_eq!(alloc["device"], "nvidia0");
    assert_eq!(alloc["escape_name"], "NV_ESC_RM_ALLOC");
    assert_eq!(alloc["cmd"], "0xc030462b");
    assert_eq!(alloc["rm_class"], "0xc86f");

    let uvm = driver[2];
    assert_eq!(uvm["device"], "nvidia-uvm");
    assert_eq!(uvm["uvm_cmd"], 0x3000_0001u64);
    assert_eq!(uvm["uvm_name"], "UVM_INITIALIZE");
    assert!(uvm.get("escape").is_none());

    let mmap = driver[3];
    assert_eq!(mmap["hook"], "mmap");
    assert_eq!(mmap["device"], "nvidia0");
    assert_eq!(
        (mmap["length"].as_u64(), mmap["offset"].as_u64()),
        (Some(8192), Some(4096))
    );
    assert_eq!(mmap["prot"], 1, "PROT_READ");
    assert!(mmap["addr"].as_str().unwrap().starts_with("0x7"), "{mmap}");
    for line in &driver {
        assert!(line["dur_ns"].as_u64().unwrap() > 0);
    }
    assert_eq!(trace.last().unwrap()["events"]["driver"], 4);

    let summary = Command::new(CUDATRACE)
        .args(["summary", "--json"])
        .arg(&trace_path)
        .output()
        .unwrap();
    assert!(summary.status.success(), "{}", stderr(&summary));
    let summary: Value = serde_json::from_slice(&summary.stdout).unwrap();
    let driver = &summary["driver"];
    assert_eq!(driver["events"], 4);
    let rows = driver["by_call"].as_array().unwrap();
    let row = |what: &str| {
        rows.iter()
            .find(|r| r["what"] == what)
            .unwrap_or_else(|| panic!("{what}: {rows:?}"))
    };
    assert_eq!(
        (
            row("NV_ESC_RM_CONTROL")["count"].as_u64(),
            row("NV_ESC_RM_CONTROL")["errors"].as_u64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(row("NV_ESC_RM_ALLOC")["count"], 1);
    assert_eq!(row("UVM_INITIALIZE")["count"], 1);
    assert_eq!(row("mmap nvidia0")["errors"], 0);
    assert_eq!(driver["rm_alloc_classes"][0]["what"], "0xc86f");
}

#[test]
fn kprobes_time_named_kernel_functions_or_are_refused_clearly() {
    let Some(_guard) = root() else { return };
    let program = fake_nvidia();
    let dir = scratch("kernel-kp");
    let prefix = format!("{}/nvidia", dir.display());
    let trace_path = dir.join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args([
            "run",
            "-q",
            "--kernel",
            "--kernel-hooks",
            "__x64_sys_ioctl,nv_ioctl",
        ])
        .args(["--kernel-device-prefix", &prefix, "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace_path)
        .arg("--")
        .arg(&program)
        .arg(&prefix)
        .arg(dir.join("other-file"))
        .output()
        .unwrap();
    let has_kprobes = std::path::Path::new("/sys/bus/event_source/devices/kprobe").exists();
    if !has_kprobes {
        assert_eq!(output.status.code(), Some(70), "{}", stderr(&output));
        assert!(
            stderr(&output).contains("this kernel has no kprobes"),
            "{}",
            stderr(&output)
        );
        let trace = read_trace(&trace_path);
        assert_complete(&trace);
        assert!(
            trace.last().unwrap()["error"]
                .as_str()
                .unwrap()
                .contains("no kprobes")
        );
        return;
    }
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let hooks = &trace[0]["kernel_hooks"];
    assert_eq!(hooks["mechanism"], "kprobe");
    // nv_ioctl is an alias of nvidia_unlocked_ioctl, absent without the NVIDIA module.
    assert_eq!(hooks["functions"], serde_json::json!(["__x64_sys_ioctl"]));
    let calls: Vec<&Value> = driver_lines(&trace)
        .into_iter()
        .filter(|d| d["hook"] == "kprobe" && d["function"] == "__x64_sys_ioctl")
        .collect();
    assert_eq!(calls.len(), 5, "five ioctls: {calls:#?}");
    assert!(
        calls
            .iter()
            .all(|c| c["ret"] == -25 && c["dur_ns"].as_u64().unwrap() > 0)
    );
}
