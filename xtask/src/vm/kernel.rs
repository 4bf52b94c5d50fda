//! Debian's cloud kernels for the guest (amd64's 5.10, 6.1, 6.12; arm64's 6.1, 6.12): the packages
//! vm-test needs, and the kernel images, found through a private apt source list and cached
//! under target/vm.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};

use super::{Arch, Kernel, PACKAGES, VIRTIOFSD, apt::Apt};

/// The cloud image's meta package of `arch`: each suite's version depends on that suite's
/// newest image.
fn meta_package(arch: Arch) -> String {
    format!("linux-image-cloud-{}", arch.debian())
}

/// How the image packages of `arch` end.
fn kernel_suffix(arch: Arch) -> String {
    format!("-cloud-{}", arch.debian())
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.ends_with(b" installed"))
}

/// Installs qemu and busybox-static, and `more`, with apt-get where they are missing.
pub(super) fn ensure_packages(more: &[&str]) -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .chain(more)
        .copied()
        .filter(|p| !installed(p))
        .collect();
    if !missing.is_empty() {
        crate::cmd::apt_install(&missing)?;
    }
    ensure!(
        Path::new(VIRTIOFSD).is_file(),
        "{VIRTIOFSD} not found (package qemu-system-common)"
    );
    Ok(())
}

/// Whether `version` (`5.10`, `6.1`, `6.12`) is one vm-test boots for `arch`.
pub fn known(arch: Arch, version: &str) -> bool {
    arch.kernels().iter().any(|(v, _)| *v == version)
}

/// Whether a package or release name (`linux-image-6.1.0-56-cloud-amd64`, `6.12.95+deb12-...`)
/// is of kernel `version`: `6.1` takes `6.1.x`, not `6.12.x`.
fn of_version(name: &str, version: &str) -> bool {
    let name = name.strip_prefix("linux-image-").unwrap_or(name);
    name.strip_prefix(version)
        .is_some_and(|rest| rest.starts_with('.'))
}

/// The numbers in a name, in order, for picking the newest: `6.12.95+deb12` is [6, 12, 95, 12].
fn numbers(name: &str) -> Vec<u32> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The unpacked kernel `version` under target/vm/kernel/, downloaded and unpacked first if absent.
pub(super) fn kernel(vm_dir: &Path, arch: Arch, version: &str) -> Result<Kernel> {
    let cache = vm_dir.join("kernel");
    if let Some(kernel) = cached_kernel(&cache, arch, version)? {
        return Ok(kernel);
    }
    let apt = Apt::of(vm_dir, arch)?;
    // Stale package lists name packages the mirror no longer has: update and try again.
    for attempt in 0..2 {
        if attempt == 1 {
            apt.update()?;
        }
        for package in kernel_packages(&apt, arch, version)? {
            if apt.fetch(vm_dir, &[&package], &cache.join(&package))? {
                return cached_kernel(&cache, arch, version)?
                    .context("the unpacked kernel package has no vmlinuz");
            }
        }
    }
    let suite = arch
        .kernels()
        .iter()
        .find(|(v, _)| *v == version)
        .map_or("?", |(_, suite)| suite);
    bail!(
        "no linux-image-{version}.*{} package could be found in Debian {suite} and downloaded \
         (apt sources in {})",
        kernel_suffix(arch),
        apt.sources.display()
    )
}

/// The image packages of kernel `version`, newest first: what the meta package depends on
/// in each of its versions.
fn kernel_packages(apt: &Apt, arch: Arch, version: &str) -> Result<Vec<String>> {
    let meta_package = meta_package(arch);
    let output = apt
        .command("apt-cache")
        .args(["madison", &meta_package])
        .output()
        .context("running apt-cache madison")?;
    ensure!(
        output.status.success(),
        "apt-cache madison {meta_package} failed"
    );
    let mut versions: Vec<String> = madison_versions(&String::from_utf8_lossy(&output.stdout))
        .into_iter()
        .filter(|v| of_version(v, version))
        .collect();
    versions.sort_by_key(|v| std::cmp::Reverse(numbers(v)));
    let mut packages = Vec::new();
    for meta in versions {
        let output = apt
            .command("apt-cache")
            .args(["show", &format!("{meta_package}={meta}")])
            .output()
            .context("running apt-cache show")?;
        if let Some(package) = image_dependency(&String::from_utf8_lossy(&output.stdout), arch)
            && !packages.contains(&package)
        {
            packages.push(package);
        }
    }
    Ok(packages)
}

/// The versions in `apt-cache madison` lines (`name | version | source`).
fn madison_versions(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| line.split('|').nth(1))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The `linux-image-*-cloud-<arch>` package in an `apt-cache show` record's `Depends:`.
fn image_dependency(record: &str, arch: Arch) -> Option<String> {
    let suffix = kernel_suffix(arch);
    record
        .lines()
        .find_map(|line| line.strip_prefix("Depends:"))?
        .split([',', '|'])
        .map(|dep| dep.split_whitespace().next().unwrap_or(""))
        .find(|name| name.starts_with("linux-image-") && name.ends_with(&suffix))
        .map(str::to_owned)
}

/// The newest kernel of `version` for `arch` already unpacked in `cache`.
fn cached_kernel(cache: &Path, arch: Arch, version: &str) -> Result<Option<Kernel>> {
    let suffix = kernel_suffix(arch);
    let Ok(entries) = fs::read_dir(cache) else {
        return Ok(None);
    };
    let best = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| of_version(name, version) && name.ends_with(&suffix))
        .max_by_key(|name| numbers(name));
    let Some(package) = best else {
        return Ok(None);
    };
    let dir = cache.join(&package);
    let single = |sub: &str, pick: &dyn Fn(&str) -> bool| -> Result<PathBuf> {
        fs::read_dir(dir.join(sub))
            .with_context(|| format!("reading {}", dir.join(sub).display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(pick))
            .with_context(|| format!("no kernel {version} in {}/{sub}", dir.display()))
    };
    Ok(Some(Kernel {
        vmlinuz: single("boot", &|n| n.starts_with("vmlinuz-"))?,
        modules: single("lib/modules", &|n| of_version(n, version))?,
        label: arch.label(version),
        package,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_takes_its_own_releases_only() {
        assert!(of_version("linux-image-6.1.0-56-cloud-amd64", "6.1"));
        assert!(!of_version("linux-image-6.12.95+deb12-cloud-amd64", "6.1"));
        assert!(of_version("linux-image-6.12.95+deb12-cloud-amd64", "6.12"));
        assert!(of_version("5.10.0-32-cloud-amd64", "5.10"));
        assert!(of_version("5.10.223-1", "5.10"));
        assert!(!of_version("6.1.192-2", "5.10"));
        assert!(!of_version("linux-image-6.1", "6.1"));
    }

    #[test]
    fn the_newest_release_sorts_first_by_its_numbers() {
        assert_eq!(numbers("6.12.95+deb12"), [6, 12, 95, 12]);
        assert!(numbers("6.12.100+deb12") > numbers("6.12.95+deb12"));
        assert!(
            numbers("linux-image-6.1.0-56-cloud-amd64")
                > numbers("linux-image-6.1.0-9-cloud-amd64")
        );
    }

    #[test]
    fn the_image_package_comes_from_the_meta_packages_records() {
        let madison = " linux-image-cloud-amd64 | 6.12.95-1~bpo12+1 | http://deb.debian.org/debian \
                       bookworm-backports/main amd64 Packages\n linux-image-cloud-amd64 | 5.10.223-1 | \
                       http://deb.debian.org/debian bullseye/main amd64 Packages\n";
        assert_eq!(
            madison_versions(madison),
            ["6.12.95-1~bpo12+1", "5.10.223-1"]
        );
        let record = "Package: linux-image-cloud-amd64\nVersion: 5.10.223-1\n\
                      Depends: linux-image-5.10.0-32-cloud-amd64 (= 5.10.223-1)\nDescription: x\n";
        assert_eq!(
            image_dependency(record, Arch::X86_64).as_deref(),
            Some("linux-image-5.10.0-32-cloud-amd64")
        );
        assert_eq!(image_dependency(record, Arch::Arm64), None);
        assert_eq!(
            image_dependency("Package: x\nDepends: libc6\n", Arch::X86_64),
            None
        );
    }

    #[test]
    fn every_kernel_is_known_and_others_are_not() {
        let known64 = |v| known(Arch::X86_64, v);
        assert!(known64("5.10") && known64("6.1") && known64("6.12"));
        assert!(!known64("6.6") && !known64("6"));
        assert!(known(Arch::Arm64, "6.1") && known(Arch::Arm64, "6.12"));
        assert!(!known(Arch::Arm64, "5.10"));
    }
}
