//! The interpreters the `--stacks` root tests trace beyond the machine's own: Debian
//! trixie's CPython 3.13, in a root made with debootstrap (about 40 s and 260 MB, once:
//! cached in target/pythons/trixie), and Debian sid's CPython 3.14 unpacked into that root
//! (trixie has no 3.14; sid's interpreter and standard library run on trixie's C library).
//! The tests run them with `chroot` (tracer/tests/stacks.rs).

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

/// The trixie root with sid's `python3.14` in it: `apt-get download` of its three packages
/// with a private apt list (the machine's own sources stay as they are), each unpacked
/// with `dpkg-deb -x`.
pub fn ensure_python314() -> Result<PathBuf> {
    let root = ensure_trixie()?;
    let python = root.join("usr/bin/python3.14");
    if python.exists() {
        return Ok(root);
    }
    let apt = workspace_root().join("target/pythons/apt-sid");
    let debs = apt.join("debs");
    for dir in [
        apt.join("lists/partial"),
        apt.join("cache/archives/partial"),
        debs.clone(),
    ] {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let sources = apt.join("sources.list");
    fs::write(&sources, "deb http://deb.debian.org/debian sid main\n")
        .context("writing the private apt list")?;
    let options = [
        format!("Dir::Etc::SourceList={}", sources.display()),
        "Dir::Etc::SourceParts=/dev/null".into(),
        format!("Dir::State::Lists={}", apt.join("lists").display()),
        format!("Dir::Cache={}", apt.join("cache").display()),
        "APT::Sandbox::User=root".into(),
    ];
    let apt_get = |args: &[&str]| {
        let mut command = Command::new("apt-get");
        for option in &options {
            command.args(["-o", option]);
        }
        command.args(["-q"]).args(args).current_dir(&debs);
        command
    };
    run(
        &mut apt_get(&["update"]),
        "apt-get update (Debian sid, for CPython 3.14)",
    )?;
    let packages = [
        "python3.14-minimal",
        "libpython3.14-minimal",
        "libpython3.14-stdlib",
    ];
    for entry in fs::read_dir(&debs).context("reading the downloaded packages")? {
        fs::remove_file(entry?.path()).context("removing an older package")?;
    }
    let mut download = apt_get(&["download"]);
    download.args(packages);
    run(&mut download, "apt-get download CPython 3.14 (Debian sid)")?;
    for entry in fs::read_dir(&debs).context("reading the downloaded packages")? {
        let deb = entry?.path();
        run(
            Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
            &format!("dpkg-deb -x {} into the trixie root", deb.display()),
        )?;
    }
    run(
        Command::new("chroot").arg(&root).args([
            "/usr/bin/python3.14",
            "-c",
            "import ctypes, asyncio, json, threading",
        ]),
        "CPython 3.14 runs in the trixie root",
    )?;
    Ok(root)
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
