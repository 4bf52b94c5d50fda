//! Root test: the build's eBPF toolchain, uprobes, uretprobes, the ring buffer and
//! aya-log work end to end on this kernel.

mod common;

use std::process::Command;

use common::{CUDATRACE, gcc, root, scratch};
use serde_json::Value;

#[test]
fn uprobe_and_uretprobe_see_every_call_with_its_arguments() {
    let Some(_guard) = root() else { return };
    let dir = scratch("selftest");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c");
    let lib = dir.join("libselftest.so");
    let main = dir.join("selftest-main");
    gcc(&[
        "-shared",
        "-fPIC",
        "-O2",
        "-o",
        lib.to_str().unwrap(),
        &format!("{src}/selftest_lib.c"),
    ]);
    gcc(&[
        "-O2",
        "-o",
        main.to_str().unwrap(),
        &format!("{src}/selftest_main.c"),
        &format!("-L{}", dir.display()),
        "-lselftest",
        "-Wl,-rpath,$ORIGIN",
    ]);
    const N: u64 = 16;
    let output = Command::new(CUDATRACE)
        .args([
            "selftest",
            "--library",
            lib.to_str().unwrap(),
            "--symbol",
            "cudatrace_selftest_add",
            "--",
        ])
        .arg(&main)
        .arg(N.to_string())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        report["exit_code"], 0,
        "the test program checks the return values itself"
    );
    let entries = report["entries"].as_array().unwrap();
    let returns = report["returns"].as_array().unwrap();
    assert_eq!(entries.len() as u64, N);
    assert_eq!(returns.len() as u64, N);
    for (i, (entry, ret)) in entries.iter().zip(returns).enumerate() {
        let i = i as u64;
        assert_eq!(entry["arg0"], i);
        assert_eq!(entry["arg1"], 1000 + i);
        assert_eq!(ret["ret"], 1000 + 2 * i);
        assert_eq!(entry["pid"], ret["pid"]);
    }
    let logs: Vec<&str> = report["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(logs.len() as u64, N, "one aya-log line per call: {logs:?}");
    assert_eq!(logs[0], "selftest entry arg0=0 arg1=1000");
    assert_eq!(logs[15], "selftest entry arg0=15 arg1=1015");
}
