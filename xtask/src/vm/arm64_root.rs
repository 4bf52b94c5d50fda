//! The arm64 guest's root: Debian bookworm for arm64 made with debootstrap (minimal, with
//! python3 for the --stacks tests, gcc and binutils for the stand-ins the tests build, and
//! busybox-static for the initramfs), cached in target/vm/arm64/root. Its second stage runs
//! arm64 programs on this host through binfmt_misc and qemu-user-static (bookworm's), which
//! this registers where it is not (as installing qemu-user-static does under systemd).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, ensure};

use crate::cmd::run;

/// What the root must hold to be complete: the last of debootstrap's `--include`s unpacked
/// and configured leave these.
const COMPLETE: &[&str] = &[
    "usr/bin/python3.11",
    "usr/bin/gcc",
    "usr/bin/nm",
    "bin/busybox",
];
const INCLUDE: &str = "python3,gcc,libc6-dev,binutils,busybox-static";
const MIRROR: &str = "http://deb.debian.org/debian";

/// The arm64 root, made first if absent.
pub(super) fn arm64_root(vm_dir: &Path) -> Result<PathBuf> {
    let dir = vm_dir.join("arm64/root");
    if COMPLETE.iter().all(|file| dir.join(file).exists()) {
        return Ok(dir);
    }
    crate::binfmt::ensure_aarch64()?;
    // Made aside and renamed when complete: an interrupted run leaves no half root.
    let partial = dir.with_extension("partial");
    if partial.exists() {
        fs::remove_dir_all(&partial).context("removing an unfinished arm64 root")?;
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).context("removing an incomplete arm64 root")?;
    }
    fs::create_dir_all(vm_dir.join("arm64")).context("creating target/vm/arm64")?;
    run(
        Command::new("/usr/sbin/debootstrap")
            .args(["--arch=arm64", "--variant=minbase"])
            .arg(format!("--include={INCLUDE}"))
            .arg("bookworm")
            .arg(&partial)
            .arg(MIRROR)
            .stdout(Stdio::null()),
        "debootstrap --arch=arm64 bookworm (the arm64 guest's root; a few minutes, once)",
    )?;
    for file in COMPLETE {
        ensure!(
            partial.join(file).exists(),
            "debootstrap left no {file} in {}",
            partial.display()
        );
    }
    // The downloaded packages (about 80 MB) are not needed once installed.
    let archives = partial.join("var/cache/apt/archives");
    for entry in
        fs::read_dir(&archives).with_context(|| format!("reading {}", archives.display()))?
    {
        let path = entry?.path();
        if path.extension().is_some_and(|x| x == "deb") {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    fs::rename(&partial, &dir).context("keeping the arm64 root")?;
    Ok(dir)
}
