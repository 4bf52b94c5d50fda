//! The QEMU that boots the guests: bookworm-backports' (10.0), unpacked under target/vm/qemu
//! and run from there; the machine's own QEMU is neither replaced nor used.
//!
//! Why not bookworm's own 7.2: under its TCG, Debian's 6.12 kernel crashed or hung while
//! booting in 9 of 15 boots on our build machine (corrupted slab lists, an oops in
//! `text_poke_early`, `do_sync_core`, the scheduler; with `-cpu max`, `EPYC`, `Skylake-Server`,
//! `qemu64`, one CPU or two). bookworm-backports' 10.0 booted it 5 times of 5.
//! virtiofsd stays 7.2's C daemon (QEMU 10 ships none); vhost-user is the same protocol.
//! The arm64 guest's emulator (`qemu-system-aarch64`) is in bookworm-backports'
//! qemu-system-arm, unpacked apart from the x86-64 one; 10.0's `virt` board has the second
//! PL011 the results come back on (7.2's has one).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

use super::{Arch, apt::Apt};

/// The packages beside the emulator's own, from bookworm-backports: its helpers, its option
/// ROMs.
const HELPERS: &[&str] = &[
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

/// bookworm-backports' QEMU for `arch`, downloaded and unpacked into target/vm/qemu first
/// if absent.
pub(super) fn qemu(vm_dir: &Path, arch: Arch) -> Result<Qemu> {
    let (package, emulator) = arch.qemu();
    let dir = match arch {
        Arch::X86_64 => vm_dir.join("qemu/bookworm-backports"),
        Arch::Arm64 => vm_dir.join("qemu/bookworm-backports-arm64"),
    };
    if !dir.join("usr/bin").join(emulator).exists() {
        let apt = Apt::new(vm_dir)?;
        let emulator_package = format!("{package}/bookworm-backports");
        let packages: Vec<&str> = std::iter::once(emulator_package.as_str())
            .chain(HELPERS.iter().copied())
            .collect();
        if !apt.fetch(vm_dir, &packages, &dir)? {
            apt.update()?;
            if !apt.fetch(vm_dir, &packages, &dir)? {
                bail!(
                    "bookworm-backports' QEMU could not be downloaded (apt sources in {})",
                    apt.sources.display()
                );
            }
        }
    }
    let binary = dir.join("usr/bin").join(emulator);
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
    let mut firmware = vec![dir.join("usr/share/qemu")];
    // The arm64 guest boots its kernel straight from `virt`'s loader: no BIOS.
    if arch == Arch::X86_64 {
        firmware.push(SEABIOS.into());
    }
    Ok(Qemu {
        binary,
        firmware,
        version,
    })
}
