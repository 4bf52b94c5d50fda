//! `cargo xtask build-ebpf`: builds tracer-ebpf's programs for bpfel-unknown-none.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;
use std::{env, fs};

use anyhow::{Context, Result, ensure};

use crate::{
    cmd,
    toolchain::{self, BPF_TARGET, CoreSource, PrepareOptions},
};

/// The CPU architecture whose `struct pt_regs` and calling convention the probes read
/// (`--cfg bpf_target_arch`, which aya-ebpf and tracer-common's `arch::TARGET` follow). The
/// bytecode runs anywhere; the offsets it reads are the architecture's.
#[derive(clap::ValueEnum, Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    #[default]
    #[value(name = "x86_64")]
    X86_64,
    #[value(name = "aarch64")]
    Aarch64,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// Cargo's target directory for this architecture's objects: x86-64's where it always
    /// was, each other beside it.
    fn target_dir(self, root: &Path) -> PathBuf {
        match self {
            Arch::X86_64 => root.join("target/ebpf"),
            other => root.join(format!("target/ebpf-{}", other.name())),
        }
    }
}

#[derive(clap::Args, Debug, Default, Clone)]
pub struct BuildEbpfOptions {
    /// Rebuild the cached bpf-linker and core sysroot under target/ebpf-toolchain.
    #[arg(long)]
    pub force: bool,
    /// Pass -v to cargo.
    #[arg(long, short)]
    pub verbose: bool,
    /// The architecture the probes are for (its `pt_regs`): x86_64 (default) or aarch64.
    #[arg(long, value_enum, default_value_t)]
    pub arch: Arch,
    /// Build this eBPF crate instead of tracer-ebpf (to test the build itself).
    #[arg(long, hide = true)]
    pub crate_dir: Option<PathBuf>,
}

/// Where the objects of [`build_ebpf`] for `arch` land: `<dir>/<bin name>`. `tracer/build.rs`
/// embeds the ones of the architecture it is built for from here.
pub fn object_dir(root: &Path, arch: Arch) -> PathBuf {
    arch.target_dir(root).join(BPF_TARGET).join("release")
}

/// Prepares the toolchain, then builds the eBPF crate's binaries into [`object_dir`].
pub fn build_ebpf(opts: &BuildEbpfOptions) -> Result<()> {
    let root = cmd::workspace_root();
    let crate_dir = opts
        .crate_dir
        .clone()
        .unwrap_or_else(|| root.join("tracer-ebpf"));
    ensure!(
        crate_dir.join("Cargo.toml").is_file(),
        "no eBPF crate at {}",
        crate_dir.display()
    );

    let toolchain = toolchain::prepare(
        &root,
        &PrepareOptions {
            force: opts.force,
            verbose: opts.verbose,
        },
    )?;

    let target_dir = opts.arch.target_dir(&root);
    let mut rustflags: Vec<OsString> = Vec::new();
    if let CoreSource::Sysroot { path, rebuilt } = &toolchain.core {
        rustflags.push(flag("--sysroot=", path));
        // cargo does not fingerprint the sysroot: drop what was compiled against the old core.
        let stale = target_dir.join(BPF_TARGET);
        if *rebuilt && stale.exists() {
            fs::remove_dir_all(&stale).with_context(|| format!("removing {}", stale.display()))?;
        }
    }
    rustflags.push(flag("-Clinker=", &toolchain.linker));
    rustflags.push(format!("--cfg=bpf_target_arch=\"{}\"", opts.arch.name()).into());
    rustflags.push("-Cdebuginfo=2".into());
    // bpf-linker emits BTF only when asked; aya needs it for maps and aya-log.
    rustflags.push("-Clink-arg=--btf".into());

    let mut cargo = cmd::cargo();
    cargo
        .current_dir(&crate_dir)
        .args(["build", "--release", "--target", BPF_TARGET])
        .arg("--target-dir")
        .arg(&target_dir)
        .arg("--message-format=json-render-diagnostics");
    if matches!(toolchain.core, CoreSource::BuildStd) {
        cargo.arg("-Zbuild-std=core");
    }
    if opts.verbose {
        cargo.arg("-v");
    }
    toolchain::clean_cargo_env(&mut cargo);
    // aya-ebpf needs nightly features (asm_experimental_arch); so does -Z build-std.
    cargo
        .env("RUSTC_BOOTSTRAP", "1")
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            rustflags.join(OsString::from("\x1f").as_os_str()),
        )
        .stdout(Stdio::piped());

    eprintln!(
        "building {} for {BPF_TARGET} ({} probes)...",
        crate_dir.display(),
        opts.arch.name()
    );
    if let Some(cut) = env::var_os("CUDATRACE_EBPF_CUT").filter(|cut| !cut.is_empty()) {
        ensure!(
            ["1", "2", "3"].contains(&cut.to_string_lossy().as_ref()),
            "CUDATRACE_EBPF_CUT={}: the step to stop walks after is 1 (the hand-off), 2 \
             (the thread state) or 3 (the frames)",
            cut.to_string_lossy()
        );
        eprintln!(
            "  a measuring build: CUDATRACE_EBPF_CUT={} stops every stack walk after that \
             step (BENCHMARKS.md); not for tracing",
            cut.to_string_lossy()
        );
    }
    if opts.verbose {
        eprintln!("  {cargo:?}");
    }
    let started = Instant::now();
    let mut child = cargo.spawn().context("starting cargo")?;
    let stdout = child.stdout.take().expect("stdout is piped");
    let mut objects = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's messages")?;
        if let Some(object) = built_executable(&line) {
            objects.push(object);
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    ensure!(
        status.success(),
        "building the eBPF crate failed ({status})"
    );
    ensure!(!objects.is_empty(), "cargo built no eBPF binaries");

    let shown_dir = object_dir(&root, opts.arch);
    println!(
        "eBPF objects in {} ({:.1} s):",
        shown_dir
            .strip_prefix(&root)
            .unwrap_or(&shown_dir)
            .display(),
        started.elapsed().as_secs_f64()
    );
    for object in objects {
        let size = fs::metadata(&object)
            .with_context(|| format!("reading {}", object.display()))?
            .len();
        let name = object.file_name().unwrap_or(object.as_os_str());
        println!("  {} ({size} bytes)", name.display());
    }
    Ok(())
}

fn flag(name: &str, path: &Path) -> OsString {
    let mut flag = OsString::from(name);
    flag.push(path);
    flag
}

/// The linked binary named by one of cargo's `compiler-artifact` JSON messages, if any.
fn built_executable(line: &str) -> Option<PathBuf> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" {
        return None;
    }
    message["executable"].as_str().map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_executables_from_cargo_messages() {
        let bin = r#"{"reason":"compiler-artifact","executable":"/t/release/probe","fresh":true}"#;
        let lib = r#"{"reason":"compiler-artifact","executable":null}"#;
        assert_eq!(
            built_executable(bin),
            Some(PathBuf::from("/t/release/probe"))
        );
        assert_eq!(built_executable(lib), None);
        assert_eq!(
            built_executable(r#"{"reason":"build-finished","success":true}"#),
            None
        );
        assert_eq!(built_executable("not json"), None);
    }
}
