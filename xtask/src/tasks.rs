//! `cargo xtask test` and `cargo xtask demo`: the README's two commands.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{
    cmd::{self, cargo, run},
    ebpf, imports, pythons, standin, vm,
};

#[derive(clap::Args, Debug, Default, Clone)]
pub struct TestOptions {
    /// Skip `vm-test` (root suites again on Debian's 5.10, 6.1 and 6.12 kernels under QEMU).
    #[arg(long)]
    pub no_vm: bool,
}

/// Runs every test: unit tests, the root tests that load and attach real probes, and the
/// root tests again on Debian's 5.10, 6.1 and 6.12 kernels under QEMU (`vm-test`).
pub fn test(opts: &TestOptions) -> Result<()> {
    imports::check_imports()?;
    ebpf::build_ebpf(&ebpf::BuildEbpfOptions::default())?;
    if !cmd::is_root() {
        bail!(
            "the root tests load eBPF programs: run `sudo -E cargo xtask test` \
             (or set CUDATRACE_SKIP_ROOT_TESTS=1 to run only the unprivileged ones)"
        );
    }
    // The --stacks tests trace Debian trixie's CPython 3.13 and sid's 3.14 too (and a
    // free-threaded 3.13t where `cargo xtask pythons --free-threaded` made one).
    pythons::ensure_all(false)?;
    run(
        cargo().args(["test", "--workspace", "--locked"]),
        "cargo test --workspace",
    )?;
    keep_host_record()?;
    if opts.no_vm {
        eprintln!("xtask: --no-vm: not running the tests on the QEMU guests");
        return Ok(());
    }
    vm::vm_test(&vm::VmTestOptions::default())?;
    // The README's kernel table must be what this run found.
    vm::support::check(&cmd::workspace_root())
}

/// Every suite passed here: the host's row of the kernel table, with its doctor (which
/// exits 1 where `run` cannot trace; its JSON says why either way).
fn keep_host_record() -> Result<()> {
    let root = cmd::workspace_root();
    let output = std::process::Command::new(root.join("target/debug/cudatrace"))
        .args(["doctor", "--json"])
        .output()
        .context("running cudatrace doctor --json")?;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    let kernel: Vec<&str> = release.trim().split(['.', '-']).take(2).collect();
    vm::support::keep(
        &root,
        &vm::support::Record {
            kernel: kernel.join("."),
            arch: std::env::consts::ARCH.to_owned(),
            place: "host".to_owned(),
            doctor: vm::support::doctor_checks(&String::from_utf8_lossy(&output.stdout)),
            suites: None,
            every_stack: true,
            failed: 0,
            ran: None,
            pythons: None,
        },
    )
}

/// Builds everything and records a demo trace: the real GPU workload where there is one,
/// else the bundled demo against the stand-in libcuda.
pub fn demo() -> Result<()> {
    let root = cmd::workspace_root();
    ebpf::build_ebpf(&ebpf::BuildEbpfOptions::default())?;
    run(
        cargo()
            .args(["build", "--release", "--locked", "-p", "cudatrace"])
            .current_dir(&root),
        "cargo build --release -p cudatrace",
    )?;
    let cudatrace = root.join("target/release/cudatrace");
    let trace = root.join("traces/demo.jsonl");
    let mut args: Vec<String> = vec!["run".into(), "-o".into(), trace.display().to_string()];
    if has_gpu() {
        eprintln!("xtask: NVIDIA GPU found: tracing workloads/simple_inference.py");
        args.extend([
            "--".into(),
            "python3".into(),
            "workloads/simple_inference.py".into(),
        ]);
    } else {
        let out = standin::out_dir(&root);
        standin::build(&root, &out)?;
        eprintln!(
            "xtask: no NVIDIA GPU here: tracing the bundled demo against the STAND-IN libcuda \
             (a fake driver, labelled as such in the trace)"
        );
        args.extend([
            // The stand-in leaves out the legacy 32-bit entry points on purpose.
            "--missing-probes".into(),
            "ignore".into(),
            "--libcuda".into(),
            out.join("libcuda.so.1").display().to_string(),
            "--".into(),
            out.join("cudatrace-demo").display().to_string(),
        ]);
    }
    let mut command = if cmd::is_root() {
        Command::new(&cudatrace)
    } else {
        eprintln!("xtask: loading eBPF needs root: running cudatrace through sudo");
        let mut sudo = Command::new("sudo");
        sudo.arg(&cudatrace);
        sudo
    };
    command.args(&args).current_dir(&root);
    run(&mut command, "cudatrace run")?;
    eprintln!("xtask: demo trace written to {}", trace.display());
    Ok(())
}

/// A usable NVIDIA driver: the device node and a libcuda in the usual places.
fn has_gpu() -> bool {
    Path::new("/dev/nvidia0").exists()
        && [
            "/usr/local/nvidia/lib64/libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        ]
        .iter()
        .map(PathBuf::from)
        .any(|p| p.exists())
}
