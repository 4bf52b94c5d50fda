//! `--kernel-hooks`: kprobes or the syscall tracepoints, chosen by what this kernel has,
//! and which kernel functions to kprobe.

use std::{fs, path::Path};

use anyhow::{Result, bail};
use serde::Serialize;

/// The driver functions hooked by default on kernels with kprobes.
pub const DEFAULT_FUNCTIONS: &[&str] = &[
    "nvidia_unlocked_ioctl",
    "rm_ioctl",
    "nvidia_mmap",
    "nv_alloc_pages",
    "uvm_unlocked_ioctl_entry",
    "nvidia_isr",
];

/// Names from older drivers and write-ups, and the functions that replaced them.
pub const ALIASES: &[(&str, &str)] = &[
    ("nvidia_ioctl", "nvidia_unlocked_ioctl"),
    ("nv_ioctl", "nvidia_unlocked_ioctl"),
    ("nv_mem_alloc", "nv_alloc_pages"),
    ("nv_schedule_work", "nv_kthread_q_schedule_q_item"),
    ("uvm_ioctl", "uvm_unlocked_ioctl_entry"),
];

/// `--kernel-hooks`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookChoice {
    Auto,
    Tracepoint,
    Kprobe,
    /// kprobes on exactly these functions (aliases resolved).
    Functions(Vec<String>),
}

impl std::str::FromStr for HookChoice {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        Ok(match text {
            "auto" => HookChoice::Auto,
            "tracepoint" => HookChoice::Tracepoint,
            "kprobe" => HookChoice::Kprobe,
            list => {
                let functions: Vec<String> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|f| !f.is_empty())
                    .map(|f| resolve_alias(f).to_owned())
                    .collect();
                if functions
                    .iter()
                    .any(|f| !f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                {
                    return Err(format!(
                        "expected auto, tracepoint, kprobe or a comma-separated list of kernel \
                         functions, got {list:?}"
                    ));
                }
                HookChoice::Functions(functions)
            }
        })
    }
}

pub fn resolve_alias(name: &str) -> &str {
    ALIASES
        .iter()
        .find(|(old, _)| *old == name)
        .map_or(name, |(_, new)| new)
}

/// What this kernel allows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KernelSupport {
    pub kprobes: bool,
    pub nvidia_module: Option<String>,
    pub xid_tracepoint: bool,
}

impl KernelSupport {
    pub fn probe(tracefs: &Path) -> Self {
        KernelSupport {
            kprobes: Path::new("/sys/bus/event_source/devices/kprobe").exists()
                || tracefs.join("kprobe_events").exists(),
            nvidia_module: nvidia_module_version(),
            xid_tracepoint: tracefs.join("events/nvidia/nvidia_dev_xid").exists(),
        }
    }
}

/// The loaded NVIDIA module's version (`/sys/module/nvidia/version`).
pub fn nvidia_module_version() -> Option<String> {
    fs::read_to_string("/sys/module/nvidia/version")
        .ok()
        .map(|v| v.trim().to_owned())
        .or_else(|| {
            Path::new("/sys/module/nvidia")
                .exists()
                .then(|| "unknown".to_owned())
        })
}

/// The mechanism picked, with the reason printed to the user.
#[derive(Clone, Debug, Serialize)]
pub struct HookPlan {
    pub mechanism: &'static str,
    pub functions: Vec<String>,
    pub reason: String,
    pub xid: bool,
}

/// Picks kprobes or tracepoints for `choice` on this kernel.
pub fn plan(choice: &HookChoice, support: &KernelSupport) -> Result<HookPlan> {
    let kprobe_plan = |functions: Vec<String>, reason: String| HookPlan {
        mechanism: "kprobe",
        functions,
        reason,
        xid: support.xid_tracepoint,
    };
    let tracepoint_plan = |reason: String| HookPlan {
        mechanism: "tracepoint",
        functions: Vec::new(),
        reason,
        xid: support.xid_tracepoint,
    };
    let defaults = || DEFAULT_FUNCTIONS.iter().map(|f| f.to_string()).collect();
    match choice {
        HookChoice::Tracepoint => Ok(tracepoint_plan("--kernel-hooks tracepoint".into())),
        HookChoice::Kprobe | HookChoice::Functions(_) if !support.kprobes => bail!(
            "this kernel has no kprobes (CONFIG_KPROBES unset: no kprobe PMU, no kprobe_events): \
             use --kernel-hooks tracepoint or auto"
        ),
        HookChoice::Kprobe => Ok(kprobe_plan(defaults(), "--kernel-hooks kprobe".into())),
        HookChoice::Functions(list) => Ok(kprobe_plan(
            list.clone(),
            "--kernel-hooks names the functions".into(),
        )),
        HookChoice::Auto => match (support.kprobes, &support.nvidia_module) {
            (true, Some(_)) => Ok(kprobe_plan(defaults(), "the kernel has kprobes".into())),
            (false, _) => Ok(tracepoint_plan(
                "the kernel has no kprobes; the ioctl syscall tracepoints always work".into(),
            )),
            (true, None) => Ok(tracepoint_plan(
                "no NVIDIA module is loaded to put kprobes on".into(),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_choice_parses_modes_lists_and_aliases() {
        assert_eq!("auto".parse(), Ok(HookChoice::Auto));
        assert_eq!("tracepoint".parse(), Ok(HookChoice::Tracepoint));
        assert_eq!(
            "nvidia_ioctl, nv_mem_alloc,rm_ioctl".parse(),
            Ok(HookChoice::Functions(vec![
                "nvidia_unlocked_ioctl".into(),
                "nv_alloc_pages".into(),
                "rm_ioctl".into()
            ]))
        );
        assert!("bad name!".parse::<HookChoice>().is_err());
    }

    #[test]
    fn auto_picks_by_what_the_kernel_has() {
        let none = KernelSupport::default();
        assert_eq!(
            plan(&HookChoice::Auto, &none).unwrap().mechanism,
            "tracepoint"
        );
        let with_module = KernelSupport {
            kprobes: true,
            nvidia_module: Some("580.159.04".into()),
            xid_tracepoint: true,
        };
        let chosen = plan(&HookChoice::Auto, &with_module).unwrap();
        assert_eq!(chosen.mechanism, "kprobe");
        assert_eq!(chosen.functions.len(), DEFAULT_FUNCTIONS.len());
        assert!(chosen.xid);
        let err = plan(&HookChoice::Kprobe, &none).unwrap_err().to_string();
        assert!(err.contains("no kprobes"), "{err}");
    }
}
