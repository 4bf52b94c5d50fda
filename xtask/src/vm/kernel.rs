//! Debian's 6.1 cloud kernel for the guest: the packages vm-test needs, and the kernel image
//! downloaded with apt and cached under target/vm.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail, ensure};

use crate::cmd::run;

use super::{KERNEL_PREFIX, KERNEL_SUFFIX, Kernel, PACKAGES, VIRTIOFSD};

static APT_UPDATED: AtomicBool = AtomicBool::new(false);

fn apt_update() -> Result<()> {
    if !APT_UPDATED.swap(true, Ordering::SeqCst) {
        run(
            Command::new("apt-get").args(["update", "-q"]),
            "apt-get update",
        )?;
    }
    Ok(())
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.ends_with(b" installed"))
}

/// Installs qemu and busybox-static with apt-get where they are missing.
pub(super) fn ensure_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        apt_update()?;
        run(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
            &format!("apt-get install {}", missing.join(" ")),
        )?;
    }
    ensure!(
        Path::new(VIRTIOFSD).is_file(),
        "{VIRTIOFSD} not found (package qemu-system-common)"
    );
    Ok(())
}

/// The ABI number of a kernel package name, e.g. 56 for linux-image-6.1.0-56-cloud-amd64.
fn kernel_abi(package: &str) -> Option<u32> {
    package
        .strip_prefix(KERNEL_PREFIX)?
        .strip_suffix(KERNEL_SUFFIX)?
        .parse()
        .ok()
}

/// The unpacked kernel under target/vm/kernel/, downloaded and unpacked first if absent.
pub(super) fn kernel(vm_dir: &Path) -> Result<Kernel> {
    let cache = vm_dir.join("kernel");
    if let Some(kernel) = cached_kernel(&cache)? {
        return Ok(kernel);
    }
    // Stale package lists name packages the mirror no longer has: update and try again.
    for _ in 0..2 {
        for package in kernel_packages()? {
            if download_kernel(vm_dir, &package)? {
                return cached_kernel(&cache)?
                    .context("the unpacked kernel package has no vmlinuz");
            }
        }
        if APT_UPDATED.load(Ordering::SeqCst) {
            break;
        }
        apt_update()?;
    }
    bail!("no {KERNEL_PREFIX}*{KERNEL_SUFFIX} package could be found and downloaded")
}

/// `apt-get download`s `package` and unpacks it into target/vm/kernel/PACKAGE; false when
/// it cannot be downloaded.
fn download_kernel(vm_dir: &Path, package: &str) -> Result<bool> {
    let download = vm_dir.join("download");
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download)?;
    eprintln!("xtask: vm-test: apt-get download {package}");
    let status = Command::new("apt-get")
        .args(["download", "-q", package])
        .current_dir(&download)
        .status()
        .context("running apt-get download")?;
    if !status.success() {
        eprintln!("xtask: vm-test: {package} could not be downloaded");
        return Ok(false);
    }
    let deb = fs::read_dir(&download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .with_context(|| format!("apt-get download left no .deb for {package}"))?;
    let cache = vm_dir.join("kernel");
    let partial = cache.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial)?;
    run(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial),
        &format!("dpkg-deb -x {}", deb.display()),
    )?;
    fs::rename(&partial, cache.join(package))?;
    fs::remove_dir_all(&download)?;
    Ok(true)
}

/// Matching package names known to apt, highest ABI first.
fn kernel_packages() -> Result<Vec<String>> {
    let output = Command::new("apt-cache")
        .args(["search", "--names-only", "^linux-image-6\\.1\\.0-"])
        .output()
        .context("running apt-cache search")?;
    ensure!(output.status.success(), "apt-cache search failed");
    let mut names: Vec<(u32, String)> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|name| Some((kernel_abi(name)?, name.to_owned())))
        .collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    names.dedup();
    Ok(names.into_iter().map(|(_, name)| name).collect())
}

/// The highest-ABI kernel already unpacked in `cache`.
fn cached_kernel(cache: &Path) -> Result<Option<Kernel>> {
    let Ok(entries) = fs::read_dir(cache) else {
        return Ok(None);
    };
    let best = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            Some((kernel_abi(&name)?, name))
        })
        .max();
    let Some((_, package)) = best else {
        return Ok(None);
    };
    let dir = cache.join(&package);
    let single = |sub: &str, prefix: &str| -> Result<PathBuf> {
        fs::read_dir(dir.join(sub))
            .with_context(|| format!("reading {}", dir.join(sub).display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .with_context(|| format!("no {sub}/{prefix}* in {}", dir.display()))
    };
    Ok(Some(Kernel {
        vmlinuz: single("boot", "vmlinuz-")?,
        modules: single("lib/modules", "6.1.")?,
        package,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_abi_reads_only_cloud_6_1_images() {
        assert_eq!(kernel_abi("linux-image-6.1.0-56-cloud-amd64"), Some(56));
        assert_eq!(kernel_abi("linux-image-6.1.0-56-amd64"), None);
        assert_eq!(kernel_abi("linux-image-6.1.0-56-cloud-amd64-dbg"), None);
        assert_eq!(kernel_abi("linux-image-6.12.0-1-cloud-amd64"), None);
    }
}
