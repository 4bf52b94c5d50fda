//! Running aarch64 programs on this x86-64 host (debootstrap's second stage of the arm64
//! roots: the arm64 guest's, and the arm64 Pythons' in `pythons.rs`): binfmt_misc and
//! qemu-user-static, registered where they are not (as installing qemu-user-static does
//! under systemd).

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use crate::cmd::{apt_install, run};

/// binfmt_misc's entry for aarch64 programs, and the line that registers it (from
/// qemu-user-static).
const BINFMT_ENTRY: &str = "/proc/sys/fs/binfmt_misc/qemu-aarch64";
const BINFMT_CONF: &str = "/usr/lib/binfmt.d/qemu-aarch64.conf";

/// Makes the kernel run aarch64 ELF files with qemu-user-static, where it does not yet.
pub fn ensure_aarch64() -> Result<()> {
    if Path::new(BINFMT_ENTRY).exists() {
        return Ok(());
    }
    let missing: Vec<&str> = [
        ("/usr/sbin/debootstrap", "debootstrap"),
        (BINFMT_CONF, "qemu-user-static"),
    ]
    .into_iter()
    .filter(|(file, _)| !Path::new(file).exists())
    .map(|(_, package)| package)
    .collect();
    if !missing.is_empty() {
        apt_install(&missing)?;
    }
    let register = Path::new("/proc/sys/fs/binfmt_misc/register");
    if !register.exists() {
        run(
            Command::new("mount").args([
                "-t",
                "binfmt_misc",
                "binfmt_misc",
                "/proc/sys/fs/binfmt_misc",
            ]),
            "mount -t binfmt_misc (to run arm64 programs with qemu-user-static)",
        )?;
    }
    let line = fs::read_to_string(BINFMT_CONF).with_context(|| format!("reading {BINFMT_CONF}"))?;
    eprintln!("xtask: vm-test: registering {BINFMT_CONF} with binfmt_misc");
    fs::write(register, line.trim_end()).context(
        "registering qemu-aarch64 with binfmt_misc (debootstrap's second stage runs arm64 \
         programs through it); this host refused: without it the arm64 root cannot be made",
    )?;
    Ok(())
}
