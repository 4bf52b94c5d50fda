//! QEMU's accelerator for the guest: KVM where the host has hardware KVM, else TCG.
//!
//! Our build machines have a `/dev/kvm` that opens, but its vendor module is `kvm_pvm`
//! (pagetable-based virtualisation, for VMs without nested virtualisation): it runs only guest
//! kernels built for PVM, and Debian's cloud kernels stop at boot there ("Probing EDD", then
//! nothing). So `auto` takes KVM only from `kvm_intel` or `kvm_amd`.

use std::path::Path;

use anyhow::{Result, bail};

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// KVM where /dev/kvm opens and kvm_intel or kvm_amd is loaded, else TCG.
    Auto,
    Kvm,
    Tcg,
}

/// The KVM vendor modules that run any guest kernel.
const HARDWARE_KVM: &[&str] = &["kvm_intel", "kvm_amd"];

impl Accel {
    pub(super) fn name(self) -> &'static str {
        match self {
            Accel::Auto => "auto",
            Accel::Kvm => "KVM",
            Accel::Tcg => "TCG",
        }
    }

    /// QEMU's `-accel` and `-cpu` arguments (`-cpu max` under TCG: every feature it emulates).
    pub(super) fn qemu_args(self) -> [&'static str; 4] {
        match self {
            Accel::Kvm => ["-accel", "kvm", "-cpu", "host"],
            Accel::Auto | Accel::Tcg => ["-accel", "tcg", "-cpu", "max"],
        }
    }
}

/// What this host offers: whether /dev/kvm opens read-write, and its KVM vendor modules.
struct Host {
    kvm_opens: Result<(), String>,
    modules: Vec<&'static str>,
}

impl Host {
    fn probe() -> Self {
        let kvm_opens = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .map(drop)
            .map_err(|e| e.to_string());
        let modules = HARDWARE_KVM
            .iter()
            .chain(&["kvm_pvm"])
            .copied()
            .filter(|m| Path::new("/sys/module").join(m).exists())
            .collect();
        Host { kvm_opens, modules }
    }
}

/// The accelerator `asked` resolves to on `host`, and why, for stderr.
fn decide(asked: Accel, host: &Host) -> Result<(Accel, String)> {
    let hardware = host.modules.iter().find(|m| HARDWARE_KVM.contains(m));
    match (asked, &host.kvm_opens, hardware) {
        (Accel::Tcg, _, _) => Ok((Accel::Tcg, "asked for".into())),
        (_, Ok(()), Some(module)) => Ok((Accel::Kvm, format!("/dev/kvm opens ({module})"))),
        (Accel::Kvm, Err(e), _) => bail!("--accel kvm: /dev/kvm does not open: {e}"),
        (Accel::Kvm, Ok(()), None) => Ok((
            Accel::Kvm,
            "asked for, though no kvm_intel or kvm_amd is loaded".into(),
        )),
        (Accel::Auto, Err(e), _) => Ok((Accel::Tcg, format!("/dev/kvm does not open: {e}"))),
        (Accel::Auto, Ok(()), None) if host.modules.contains(&"kvm_pvm") => Ok((
            Accel::Tcg,
            "this host's KVM is kvm_pvm, which boots only kernels built for PVM (Debian's \
             hang at boot; --accel kvm tries anyway)"
                .into(),
        )),
        (Accel::Auto, Ok(()), None) => Ok((
            Accel::Tcg,
            "no kvm_intel or kvm_amd module (--accel kvm tries anyway)".into(),
        )),
    }
}

/// Resolves `asked` on this host and says on stderr which accelerator the guests get.
pub(super) fn choose(asked: Accel) -> Result<Accel> {
    let (accel, why) = decide(asked, &Host::probe())?;
    eprintln!("xtask: vm-test: QEMU accelerator {}: {why}", accel.name());
    Ok(accel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(opens: bool, modules: &[&'static str]) -> Host {
        Host {
            kvm_opens: if opens {
                Ok(())
            } else {
                Err("Permission denied (os error 13)".into())
            },
            modules: modules.to_vec(),
        }
    }

    #[test]
    fn auto_takes_kvm_only_from_hardware_kvm_that_opens() {
        let pick = |h: &Host| decide(Accel::Auto, h).unwrap().0;
        assert_eq!(pick(&host(true, &["kvm_intel"])), Accel::Kvm);
        assert_eq!(pick(&host(true, &["kvm_amd"])), Accel::Kvm);
        assert_eq!(pick(&host(true, &["kvm_pvm"])), Accel::Tcg);
        assert_eq!(pick(&host(false, &["kvm_intel"])), Accel::Tcg);
        assert_eq!(pick(&host(true, &[])), Accel::Tcg);
        let (_, why) = decide(Accel::Auto, &host(true, &["kvm_pvm"])).unwrap();
        assert!(why.contains("kvm_pvm"), "{why}");
    }

    #[test]
    fn asking_for_kvm_fails_only_where_dev_kvm_does_not_open() {
        assert_eq!(
            decide(Accel::Kvm, &host(true, &["kvm_pvm"])).unwrap().0,
            Accel::Kvm
        );
        let error = decide(Accel::Kvm, &host(false, &[]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "--accel kvm: /dev/kvm does not open: Permission denied (os error 13)"
        );
        assert_eq!(
            decide(Accel::Tcg, &host(true, &["kvm_intel"])).unwrap().0,
            Accel::Tcg
        );
    }

    #[test]
    fn each_accelerator_gets_its_cpu_model() {
        assert_eq!(Accel::Kvm.qemu_args(), ["-accel", "kvm", "-cpu", "host"]);
        assert_eq!(Accel::Tcg.qemu_args(), ["-accel", "tcg", "-cpu", "max"]);
    }
}
