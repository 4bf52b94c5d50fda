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

/// binfmt_misc's entry for aarch64 programs, and the line that registers it (from
/// qemu-user-static).
const BINFMT_ENTRY: &str = "/proc/sys/fs/binfmt_misc/qemu-aarch64";
const BINFMT_CONF: &str = "/usr/lib/binfmt.d/qemu-aarch64.conf";

/// The arm64 root, made first if absent.
pub(super) fn arm64_root(vm_dir: &Path) -> Result<PathBuf> {
    let dir = vm_dir.join("arm64/root");
    if COMPLETE.iter().all(|file| dir.join(file).exists()) {
        return Ok(dir);
    }
    ensure_binfmt()?;
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

/// Makes the kernel run aarch64 ELF files with qemu-user-static, where it does not yet.
fn ensure_binfmt() -> Result<()> {
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
        run(
            Command::new("apt-get").args(["update", "-q"]),
            "apt-get update",
        )?;
        run(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
            &format!("apt-get install {}", missing.join(" ")),
        )?;
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
