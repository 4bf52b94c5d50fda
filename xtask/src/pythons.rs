//! The interpreters the `--stacks` root tests trace beyond the machine's own: Debian
//! trixie's CPython 3.13, in a root made with debootstrap (about 40 s and 260 MB, once:
//! cached in target/pythons/trixie), and Debian sid's CPython 3.14 unpacked into that root
//! (trixie has no 3.14; sid's interpreter and standard library run on trixie's C library).
//! The tests run them with `chroot` (tracer/tests/stacks.rs). For the arm64 guests of
//! `vm-test --arch arm64`, the same for arm64 in target/pythons/trixie-arm64 (debootstrap's
//! second stage run through qemu-user-static: minutes, once). And a free-threaded CPython
//! 3.13 (`--disable-gil`), built from Debian trixie's source package of python3.13 (Debian
//! packages none), cached in target/pythons/3.13t: the tests check that it is refused,
//! counted and named.

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

/// Where the arm64 guests' trixie root is kept (the tests built for aarch64 look there).
pub fn trixie_arm64_dir() -> PathBuf {
    workspace_root().join("target/pythons/trixie-arm64")
}

/// The Debian architecture of a root's programs: this host's, or arm64 for the arm64
/// guests.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RootArch {
    Host,
    Arm64,
}

/// A private apt configuration under target/pythons/apt-NAME whose only source is `line`
/// (the machine's own sources stay as they are): `apt-get` with it, run in its `debs`;
/// with `arm64`, for that architecture's packages.
fn private_apt(name: &str, line: &str, arch: RootArch) -> Result<impl Fn(&[&str]) -> Command> {
    let apt = workspace_root().join(format!("target/pythons/apt-{name}"));
    let debs = apt.join("debs");
    for dir in [
        apt.join("lists/partial"),
        apt.join("cache/archives/partial"),
        debs.clone(),
    ] {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let sources = apt.join("sources.list");
    fs::write(&sources, format!("{line}\n")).context("writing the private apt list")?;
    let options = [
        format!("Dir::Etc::SourceList={}", sources.display()),
        "Dir::Etc::SourceParts=/dev/null".into(),
        format!("Dir::State::Lists={}", apt.join("lists").display()),
        format!("Dir::Cache={}", apt.join("cache").display()),
        "APT::Sandbox::User=root".into(),
    ]
    .into_iter()
    .chain(
        (arch == RootArch::Arm64)
            .then(|| {
                [
                    "APT::Architecture=arm64".into(),
                    "APT::Architectures=arm64".into(),
                ]
            })
            .into_iter()
            .flatten(),
    )
    .collect::<Vec<String>>();
    Ok(move |args: &[&str]| {
        let mut command = Command::new("apt-get");
        for option in &options {
            command.args(["-o", option]);
        }
        command.arg("-q").args(args).current_dir(&debs);
        command
    })
}

/// Every interpreter the `--stacks` tests need beyond the machine's own; the free-threaded
/// 3.13t only when asked (`cargo xtask pythons --free-threaded`): its build from source
/// takes 5 to 16 minutes on CI's 2 cores, more than CI's time allows.
pub fn ensure_all(free_threaded: bool) -> Result<()> {
    ensure_python314()?;
    if free_threaded {
        ensure_free_threaded()?;
    }
    Ok(())
}

/// Where the free-threaded CPython 3.13 is installed.
fn free_threaded_dir() -> PathBuf {
    workspace_root().join("target/pythons/3.13t")
}

/// A free-threaded CPython 3.13 (`bin/python3.13t`), built unless there: Debian trixie's
/// source of python3.13 (`apt-get source --download-only`), its upstream tarball configured
/// with `--disable-gil`, built and installed (minutes: the longest of these steps).
fn ensure_free_threaded() -> Result<PathBuf> {
    let prefix = free_threaded_dir();
    let python = prefix.join("bin/python3.13t");
    if python.exists() {
        return Ok(prefix);
    }
    let apt_get = private_apt(
        "trixie-src",
        "deb-src http://deb.debian.org/debian trixie main",
        RootArch::Host,
    )?;
    run(
        &mut apt_get(&["update"]),
        "apt-get update (Debian trixie's sources)",
    )?;
    let debs = workspace_root().join("target/pythons/apt-trixie-src/debs");
    let build = debs.join("build");
    if build.exists() {
        fs::remove_dir_all(&build).context("removing an unfinished build")?;
    }
    run(
        &mut apt_get(&["source", "--download-only", "python3.13"]),
        "apt-get source python3.13 (Debian trixie)",
    )?;
    let tarball = fs::read_dir(&debs)
        .context("reading the downloaded source")?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.to_string_lossy().ends_with(".orig.tar.xz"))
        .context("apt-get source left no python3.13 .orig.tar.xz")?;
    fs::create_dir_all(&build).context("creating the build folder")?;
    run(
        Command::new("tar")
            .arg("xf")
            .arg(&tarball)
            .args(["--strip-components=1", "-C"])
            .arg(&build),
        "unpacking CPython 3.13's source",
    )?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    run(
        Command::new("./configure")
            .args([
                "--disable-gil",
                "--without-ensurepip",
                "--disable-test-modules",
            ])
            .arg(format!("--prefix={}", prefix.display()))
            .current_dir(&build)
            .stdout(Stdio::null()),
        "configure CPython 3.13 --disable-gil",
    )?;
    run(
        Command::new("make")
            .arg(format!("-j{jobs}"))
            .current_dir(&build)
            .stdout(Stdio::null()),
        "make CPython 3.13t (minutes)",
    )?;
    run(
        Command::new("make")
            .arg("install")
            .current_dir(&build)
            .stdout(Stdio::null()),
        "make install CPython 3.13t",
    )?;
    fs::remove_dir_all(&build).context("removing the build folder")?;
    // The test suite is most of the install, and no test runs it.
    let _ = fs::remove_dir_all(prefix.join("lib/python3.13t/test"));
    run(
        Command::new(&python).args(["-c", "import ctypes, sys; assert not sys._is_gil_enabled()"]),
        "CPython 3.13t runs free-threaded",
    )?;
    Ok(prefix)
}

/// The trixie root with sid's `python3.14` in it: `apt-get download` of its three packages
/// with a private apt list (the machine's own sources stay as they are), each unpacked
/// with `dpkg-deb -x`.
fn ensure_python314() -> Result<PathBuf> {
    python314_in(ensure_trixie()?, RootArch::Host)
}

/// The arm64 guests' interpreters beyond Debian bookworm's 3.11: trixie's 3.13 and sid's
/// 3.14 for arm64, in their own root (`vm-test --arch arm64` makes it before the guests
/// boot; the guests run them with `chroot`).
pub fn ensure_arm64() -> Result<PathBuf> {
    crate::binfmt::ensure_aarch64()?;
    let root = ensure_root(&trixie_arm64_dir(), RootArch::Arm64)?;
    python314_in(root, RootArch::Arm64)
}

/// `root` with sid's `python3.14` of `arch` unpacked in it.
fn python314_in(root: PathBuf, arch: RootArch) -> Result<PathBuf> {
    let python = root.join("usr/bin/python3.14");
    if python.exists() {
        return Ok(root);
    }
    let name = match arch {
        RootArch::Host => "sid",
        RootArch::Arm64 => "sid-arm64",
    };
    let apt_get = private_apt(name, "deb http://deb.debian.org/debian sid main", arch)?;
    let debs = workspace_root().join(format!("target/pythons/apt-{name}/debs"));
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
    ensure_root(&trixie_dir(), RootArch::Host)
}

/// A minimal trixie root with python3 at `dir`, for `arch`, made unless there.
fn ensure_root(dir: &Path, arch: RootArch) -> Result<PathBuf> {
    let dir = dir.to_path_buf();
    if dir.join("usr/bin/python3").exists() {
        return Ok(dir);
    }
    if !Path::new("/usr/sbin/debootstrap").exists() {
        crate::cmd::apt_install(&["debootstrap"])?;
    }
    // Made aside and renamed when complete: an interrupted run leaves no half root.
    let partial = dir.with_extension("partial");
    if partial.exists() {
        fs::remove_dir_all(&partial).context("removing an unfinished trixie root")?;
    }
    fs::create_dir_all(dir.parent().expect("under target/")).context("creating target/pythons")?;
    run(
        Command::new("/usr/sbin/debootstrap")
            .args(["--variant=minbase", "--include=python3"])
            .args((arch == RootArch::Arm64).then_some("--arch=arm64"))
            .arg("trixie")
            .arg(&partial)
            .arg("http://deb.debian.org/debian")
            .stdout(Stdio::null()),
        match arch {
            RootArch::Host => "debootstrap trixie (CPython 3.13 for the --stacks tests)",
            RootArch::Arm64 => {
                "debootstrap --arch=arm64 trixie (CPython 3.13 for the arm64 guests' --stacks \
                 tests; its second stage under qemu-user-static: minutes, once)"
            }
        },
    )?;
    ensure!(
        partial.join("usr/bin/python3").exists(),
        "debootstrap left no python3 in {}",
        partial.display()
    );
    fs::rename(&partial, &dir).context("keeping the trixie root")?;
    Ok(dir)
}
