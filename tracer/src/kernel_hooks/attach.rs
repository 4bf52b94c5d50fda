//! Attaching `--kernel`'s hooks: the syscall tracepoints (and the Xid tracepoint) or
//! kprobes on the module's functions, and the NVIDIA device files a `-p` target already has
//! open.

use std::{collections::HashMap, fs, path::PathBuf};

use anyhow::{Context, Result, bail};
use aya::{Ebpf, maps::HashMap as BpfHashMap, programs::KProbe};
use tracer_common::device_kind;

use super::choice::HookPlan;
use crate::probes::programs::{attach_tracepoints, program};

/// Functions that run in interrupt context: reported whichever process they interrupt.
pub const INTERRUPT_FUNCTIONS: &[&str] = &["nvidia_isr", "nvidia_isr_kthread_bh"];

/// Attaches the chosen hooks. Returns the functions actually hooked (kprobes).
pub fn attach(bpf: &mut Ebpf, plan: &HookPlan) -> Result<Vec<String>> {
    let mut tracepoints = vec![
        ("syscalls", "sys_enter_openat"),
        ("syscalls", "sys_exit_openat"),
        ("syscalls", "sys_enter_close"),
    ];
    if plan.mechanism == "tracepoint" {
        tracepoints.extend([
            ("syscalls", "sys_enter_ioctl"),
            ("syscalls", "sys_exit_ioctl"),
            ("syscalls", "sys_enter_mmap"),
            ("syscalls", "sys_exit_mmap"),
        ]);
    }
    if plan.xid {
        tracepoints.push(("nvidia", "nvidia_dev_xid"));
    }
    attach_tracepoints(bpf, &tracepoints)?;
    if plan.mechanism != "kprobe" {
        return Ok(Vec::new());
    }
    let symbols = kallsyms()?;
    {
        let mut interrupt: BpfHashMap<_, u64, u32> =
            BpfHashMap::try_from(bpf.map_mut("KFUNC_ANY_PROCESS").context("map missing")?)?;
        for name in INTERRUPT_FUNCTIONS {
            if let Some(address) = symbols.get(*name) {
                interrupt.insert(address, 1, 0)?;
            }
        }
    }
    let mut hooked = Vec::new();
    for (program_name, is_return) in [("kfunc_return", true), ("kfunc_enter", false)] {
        let program: &mut KProbe = program(bpf, program_name)?;
        program
            .load()
            .with_context(|| format!("loading {program_name}"))?;
        for function in &plan.functions {
            if !symbols.contains_key(function) {
                if !is_return {
                    eprintln!("cudatrace: kernel function {function} not found in /proc/kallsyms");
                }
                continue;
            }
            program
                .attach(function, 0)
                .with_context(|| format!("attaching {program_name} to {function}"))?;
            if !is_return {
                hooked.push(function.clone());
            }
        }
    }
    if hooked.is_empty() {
        bail!(
            "none of the kernel functions {:?} could be hooked",
            plan.functions
        );
    }
    Ok(hooked)
}

/// Function name by address, and address by name, from /proc/kallsyms (root sees them).
pub fn kallsyms() -> Result<HashMap<String, u64>> {
    let text = fs::read_to_string("/proc/kallsyms").context("reading /proc/kallsyms")?;
    let mut symbols = HashMap::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(address), Some(kind), Some(name)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !matches!(kind, "t" | "T") {
            continue;
        }
        if let Ok(address) = u64::from_str_radix(address, 16) {
            symbols.entry(name.to_owned()).or_insert(address);
        }
    }
    Ok(symbols)
}

/// Registers the NVIDIA device fds a process already has open (for `-p`).
pub fn seed_open_fds(bpf: &mut Ebpf, pid: u32, prefix: &str) -> Result<usize> {
    let mut fds: BpfHashMap<_, u64, u64> =
        BpfHashMap::try_from(bpf.map_mut("NV_FDS").context("map NV_FDS missing")?)?;
    let mut count = 0;
    let dir = PathBuf::from(format!("/proc/{pid}/fd"));
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let Ok(target) = fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        let Some(rest) = target.strip_prefix(prefix) else {
            continue;
        };
        let (kind, index) = classify(rest);
        fds.insert(
            (u64::from(pid) << 32) | fd,
            (u64::from(index) << 32) | u64::from(kind),
            0,
        )?;
        count += 1;
    }
    Ok(count)
}

/// The same classification the eBPF side makes of the path after the prefix.
pub fn classify(rest: &str) -> (u32, u32) {
    if rest.starts_with("ctl") {
        (device_kind::CTL, 0)
    } else if rest.starts_with("-u") {
        (device_kind::UVM, 0)
    } else if let Some(digits) = rest
        .get(
            ..rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len()),
        )
        .filter(|d| !d.is_empty())
    {
        (device_kind::GPU, digits.parse().unwrap_or(0))
    } else {
        (device_kind::OTHER, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_classify_like_the_kernel_side() {
        assert_eq!(classify("ctl"), (device_kind::CTL, 0));
        assert_eq!(classify("-uvm"), (device_kind::UVM, 0));
        assert_eq!(classify("12"), (device_kind::GPU, 12));
        assert_eq!(classify("-modeset"), (device_kind::OTHER, 0));
    }
}
