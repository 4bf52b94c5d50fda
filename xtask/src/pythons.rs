//! The interpreters the `--stacks` root tests trace beyond the machine's own: Debian
//! trixie's CPython 3.13, in a root made with debootstrap (about 40 s and 260 MB, once:
//! cached in target/pythons/trixie). The tests run it with `chroot`
//! (tracer/tests/stacks.rs).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, ensure};

use crate::cmd::{run, workspace_root};

/// Where the trixie root is kept (the tests look there).
pub fn trixie_dir() -> PathBuf {
    workspace_root().join("target/pythons/trixie")
}

/// Makes the trixie root unless it is there already: debootstrap (installed with apt-get
/// when missing), minimal, with python3.
pub fn ensure_trixie() -> Result<PathBuf> {
    let dir = trixie_dir();
    if dir.join("usr/bin/python3").exists() {
        return Ok(dir);
    }
    if !Path::new("/usr/sbin/debootstrap").exists() {
        run(
            Command::new("apt-get").args(["update", "-q"]),
            "apt-get update",
        )?;
        run(
            Command::new("apt-get")
                .args([
                    "install",
                    "-y",
                    "-q",
                    "--no-install-recommends",
                    "debootstrap",
                ])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            "apt-get install debootstrap",
        )?;
    }
    // Made aside and renamed when complete: an interrupted run leaves no half root.
    let partial = dir.with_extension("partial");
    if partial.exists() {
        fs::remove_dir_all(&partial).context("removing an unfinished trixie root")?;
    }
    fs::create_dir_all(dir.parent().expect("under target/")).context("creating target/pythons")?;
    run(
        Command::new("/usr/sbin/debootstrap")
            .args(["--variant=minbase", "--include=python3", "trixie"])
            .arg(&partial)
            .arg("http://deb.debian.org/debian")
            .stdout(Stdio::null()),
        "debootstrap trixie (CPython 3.13 for the --stacks tests)",
    )?;
    ensure!(
        partial.join("usr/bin/python3").exists(),
        "debootstrap left no python3 in {}",
        partial.display()
    );
    fs::rename(&partial, &dir).context("keeping the trixie root")?;
    Ok(dir)
}
