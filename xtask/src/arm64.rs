//! `cargo xtask build-arm64`: `cudatrace` for aarch64-unknown-linux-gnu (GH200, GB200 hosts),
//! the userspace binary and the injection library it embeds, cross-compiled with Debian's
//! gcc-aarch64-linux-gnu as linker. It embeds the eBPF objects built for arm64's `pt_regs`
//! (`cargo xtask build-ebpf --arch aarch64`, into target/ebpf-aarch64).

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    cmd::{self, cargo, run},
    ebpf,
};

pub const TARGET: &str = "aarch64-unknown-linux-gnu";
const LINKER: &str = "aarch64-linux-gnu-gcc";
/// Debian's cross compiler and the arm64 C library it links against.
const PACKAGES: &[&str] = &["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"];
/// ELF `e_machine` of AArch64.
const EM_AARCH64: u16 = 183;

/// Installs the Rust target and the cross linker where missing, builds, and checks that the
/// binary is an AArch64 ELF.
pub fn build_arm64() -> Result<()> {
    ensure_toolchain()?;
    ebpf::build_ebpf(&ebpf::BuildEbpfOptions {
        arch: ebpf::Arch::Aarch64,
        ..Default::default()
    })?;
    run(
        cargo()
            .args(["build", "--release", "--locked", "-p", "cudatrace"])
            .args(["--target", TARGET])
            .envs(cross_env())
            .current_dir(cmd::workspace_root()),
        &format!("cargo build --release -p cudatrace --target {TARGET}"),
    )?;
    let binary = cmd::workspace_root().join(format!("target/{TARGET}/release/cudatrace"));
    let machine = elf_machine(&binary)?;
    ensure!(
        machine == EM_AARCH64,
        "{} is not an AArch64 ELF (e_machine {machine})",
        binary.display()
    );
    eprintln!("xtask: build-arm64: {} (AArch64 ELF)", binary.display());
    Ok(())
}

/// The Rust target and the cross linker, installed where missing.
pub fn ensure_toolchain() -> Result<()> {
    ensure_target()?;
    ensure_linker()
}

/// What cargo needs to link (and the `cc` crate to compile) for [`TARGET`].
pub fn cross_env() -> [(String, &'static str); 2] {
    let env_target = TARGET.to_uppercase().replace('-', "_");
    [
        (format!("CARGO_TARGET_{env_target}_LINKER"), LINKER),
        (format!("CC_{}", TARGET.replace('-', "_")), LINKER),
    ]
}

/// `rustup target add`, with what to do where it cannot download.
fn ensure_target() -> Result<()> {
    let installed = cmd::stdout(Command::new("rustup").args(["target", "list", "--installed"]))
        .context("asking rustup for the installed targets")?;
    if installed.lines().any(|l| l.trim() == TARGET) {
        return Ok(());
    }
    let status = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status()
        .context("running rustup")?;
    if !status.success() {
        bail!(
            "rustup could not install the {TARGET} standard library ({status}): it downloads \
             it from static.rust-lang.org; on a machine without that, cudatrace cannot be \
             built for arm64 here"
        );
    }
    Ok(())
}

fn ensure_linker() -> Result<()> {
    if Command::new(LINKER).arg("--version").output().is_ok() {
        return Ok(());
    }
    cmd::apt_install(PACKAGES)
}

/// The `e_machine` field of the ELF file at `path`.
fn elf_machine(path: &PathBuf) -> Result<u16> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    machine_of(&bytes).with_context(|| format!("{} is not an ELF file", path.display()))
}

fn machine_of(bytes: &[u8]) -> Option<u16> {
    if bytes.get(..4)? != b"\x7fELF" {
        return None;
    }
    // e_machine: 2 bytes at offset 18, in the file's byte order (EI_DATA, 1 = little).
    let field = [*bytes.get(18)?, *bytes.get(19)?];
    Some(match bytes.get(5)? {
        1 => u16::from_le_bytes(field),
        _ => u16::from_be_bytes(field),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_elf_machine_tells_arm64_from_x86_64() {
        let mut header = vec![0u8; 64];
        header[..4].copy_from_slice(b"\x7fELF");
        header[5] = 1;
        header[18..20].copy_from_slice(&183u16.to_le_bytes());
        assert_eq!(machine_of(&header), Some(EM_AARCH64));
        header[18..20].copy_from_slice(&62u16.to_le_bytes());
        assert_eq!(machine_of(&header), Some(62));
        assert_eq!(machine_of(b"#!/bin/sh\n"), None);
        let own = fs::read(std::env::current_exe().unwrap()).unwrap();
        let expected = if cfg!(target_arch = "aarch64") {
            183
        } else {
            62
        };
        assert_eq!(machine_of(&own), Some(expected));
    }
}
