//! The QEMU that boots the guests: bookworm-backports' (10.0), unpacked under target/vm/qemu
//! and run from there; the machine's own QEMU is neither replaced nor used.
//!
//! Why not bookworm's own 7.2: under its TCG, Debian's 6.12 kernel crashed or hung while
//! booting in 9 of 15 boots on our build machine (corrupted slab lists, an oops in
//! `text_poke_early`, `do_sync_core`, the scheduler; with `-cpu max`, `EPYC`, `Skylake-Server`,
//! `qemu64`, one CPU or two). bookworm-backports' 10.0 booted it 5 times of 5.
//! virtiofsd stays 7.2's C daemon (QEMU 10 ships none); vhost-user is the same protocol.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use super::apt::Apt;

/// The packages, from bookworm-backports: the emulator, its helpers, its option ROMs.
const PACKAGES: &[&str] = &[
    "qemu-system-x86/bookworm-backports",
    "qemu-system-common/bookworm-backports",
    "qemu-system-data/bookworm-backports",
];
/// The BIOS image comes from the machine's seabios package (qemu-system-x86 depends on it).
const SEABIOS: &str = "/usr/share/seabios";

pub(super) struct Qemu {
    pub(super) binary: PathBuf,
    /// `-L` folders: the unpacked option ROMs, then the BIOS.
    pub(super) firmware: Vec<PathBuf>,
    pub(super) version: String,
}

/// bookworm-backports' QEMU, downloaded and unpacked into target/vm/qemu first if absent.
pub(super) fn qemu(vm_dir: &Path) -> Result<Qemu> {
    let dir = vm_dir.join("qemu/bookworm-backports");
    if !dir.join("usr/bin/qemu-system-x86_64").exists() {
        let apt = Apt::new(vm_dir)?;
        if !apt.fetch(vm_dir, PACKAGES, &dir)? {
            apt.update()?;
            if !apt.fetch(vm_dir, PACKAGES, &dir)? {
                bail!(
                    "bookworm-backports' QEMU could not be downloaded (apt sources in {})",
                    apt.sources.display()
                );
            }
        }
    }
    let binary = dir.join("usr/bin/qemu-system-x86_64");
    let output = std::process::Command::new(&binary)
        .arg("--version")
        .output()?;
    if !output.status.success() {
        bail!(
            "{} --version failed (a library missing?): {}",
            binary.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let version = String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    Ok(Qemu {
        binary,
        firmware: vec![dir.join("usr/share/qemu"), SEABIOS.into()],
        version,
    })
}
