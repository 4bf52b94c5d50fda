//! apt on vm-test's own source list: Debian's kernels for the guests and a newer QEMU come
//! from suites the machine's own sources may lack (bullseye, bookworm-backports); the arm64
//! guest's kernel and busybox from arm64's package lists. Each list and apt's state live
//! under target/vm (apt, apt-arm64); the machine's apt configuration is not touched.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::cmd::run;

use super::Arch;

/// The suites vm-test downloads from, signed with Debian's archive keyring.
const SOURCES: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
";
/// The arm64 guests' suites: their kernels (bookworm-security, bookworm-backports) and
/// initramfs busybox (bookworm).
const ARM64_SOURCES: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
";
/// The keyring the sources are signed with (package debian-archive-keyring).
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// apt-get and apt-cache on vm-test's own source list and state (target/vm/apt).
pub(super) struct Apt {
    pub(super) sources: PathBuf,
    options: Vec<String>,
}

impl Apt {
    /// The host's packages (QEMU) and the x86-64 guests' kernels.
    pub(super) fn new(vm_dir: &Path) -> Result<Self> {
        Self::of(vm_dir, Arch::X86_64)
    }

    /// Packages of `arch` (kernels, busybox): for arm64 a list and state of its own, which
    /// apt reads as arm64's (its `Packages` files, `apt-get download` of arm64 debs).
    pub(super) fn of(vm_dir: &Path, arch: Arch) -> Result<Self> {
        ensure!(
            Path::new(KEYRING).is_file(),
            "{KEYRING} not found: apt-get install debian-archive-keyring"
        );
        let (dir, list, architecture) = match arch {
            Arch::X86_64 => (vm_dir.join("apt"), SOURCES, None),
            Arch::Arm64 => (vm_dir.join("apt-arm64"), ARM64_SOURCES, Some("arm64")),
        };
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let sources = dir.join("sources.list");
        if fs::read_to_string(&sources).ok().as_deref() != Some(list) {
            fs::write(&sources, list).with_context(|| format!("writing {}", sources.display()))?;
        }
        let mut options = vec![
            format!("Dir::Etc::SourceList={}", sources.display()),
            "Dir::Etc::SourceParts=/dev/null".to_owned(),
            // Downloads land in target/vm, which apt's own _apt user may not enter.
            "APT::Sandbox::User=root".to_owned(),
            format!("Dir::State::Lists={}", dir.join("lists").display()),
            format!("Dir::Cache={}", dir.join("cache").display()),
        ];
        if let Some(architecture) = architecture {
            options.push(format!("APT::Architecture={architecture}"));
            options.push(format!("APT::Architectures::={architecture}"));
        }
        let options = options
            .into_iter()
            .flat_map(|o| ["-o".to_owned(), o])
            .collect();
        let apt = Apt { sources, options };
        if !apt.has_lists() {
            apt.update()?;
        }
        Ok(apt)
    }

    /// `program` (apt-get, apt-cache) reading vm-test's sources and state.
    pub(super) fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.args(&self.options);
        command
    }

    fn has_lists(&self) -> bool {
        let lists = self.sources.with_file_name("lists");
        fs::read_dir(lists).is_ok_and(|entries| {
            entries
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().contains("_Packages"))
        })
    }

    pub(super) fn update(&self) -> Result<()> {
        eprintln!(
            "xtask: vm-test: apt-get update ({})",
            self.sources.display()
        );
        run(
            self.command("apt-get").args(["update", "-q"]),
            "apt-get update (vm-test's sources)",
        )
    }

    /// `apt-get download`s `packages` (names, `name=version` or `name/suite`) and unpacks them
    /// all into `into` (made aside, then renamed: an interrupted run leaves nothing half
    /// there); false when apt cannot download them.
    pub(super) fn fetch(&self, vm_dir: &Path, packages: &[&str], into: &Path) -> Result<bool> {
        let download = vm_dir.join("download");
        let _ = fs::remove_dir_all(&download);
        fs::create_dir_all(&download)?;
        eprintln!("xtask: vm-test: apt-get download {}", packages.join(" "));
        let status = self
            .command("apt-get")
            .args(["download", "-q"])
            .args(packages)
            .current_dir(&download)
            .status()
            .context("running apt-get download")?;
        if !status.success() {
            eprintln!(
                "xtask: vm-test: {} could not be downloaded",
                packages.join(" ")
            );
            return Ok(false);
        }
        let mut partial = into.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        let _ = fs::remove_dir_all(&partial);
        fs::create_dir_all(&partial)?;
        for entry in fs::read_dir(&download)? {
            let deb = entry?.path();
            if deb.extension().is_some_and(|x| x == "deb") {
                run(
                    Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial),
                    &format!("dpkg-deb -x {}", deb.display()),
                )?;
            }
        }
        fs::rename(&partial, into).with_context(|| format!("keeping {}", into.display()))?;
        fs::remove_dir_all(&download)?;
        Ok(true)
    }
}
