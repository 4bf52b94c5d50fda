//! What /proc says about the machine, its interrupts and a running process.

use std::{collections::BTreeMap, fs, thread};

use serde::{Deserialize, Serialize};

/// Interrupt counts by /proc/interrupts name (`IWI`, `RES`, `CAL`).
pub type Interrupts = BTreeMap<String, u64>;

/// The IRQ-work and IPI counters of /proc/interrupts, summed over CPUs.
pub fn interrupts() -> Interrupts {
    let text = fs::read_to_string("/proc/interrupts").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.trim_start().split_once(':')?;
            ["IWI", "RES", "CAL"].contains(&name).then(|| {
                let total = rest
                    .split_whitespace()
                    .map_while(|w| w.parse::<u64>().ok())
                    .sum();
                (name.to_owned(), total)
            })
        })
        .collect()
}

/// The interrupts counted from `before` to `after`.
pub fn difference(before: &Interrupts, after: &Interrupts) -> Interrupts {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect()
}

/// Resident KiB by mapping kind, from /proc/PID/smaps.
pub fn rss_breakdown(pid: u32) -> BTreeMap<String, u64> {
    let mut kinds = BTreeMap::new();
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return kinds;
    };
    let mut kind = String::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: address perms offset dev inode [name].
            let name = words.nth(4).unwrap_or("");
            kind = if name.starts_with("anon_inode:") {
                name.to_owned()
            } else if name.is_empty() {
                "anonymous".into()
            } else if name.starts_with('[') {
                name.to_owned()
            } else if name.ends_with("/cudatrace") {
                "cudatrace binary".into()
            } else {
                "other files".into()
            };
        } else if first == "Rss:" {
            let kib = words
                .next()
                .and_then(|w| w.parse::<u64>().ok())
                .unwrap_or(0);
            *kinds.entry(kind.clone()).or_insert(0) += kib;
        }
    }
    kinds
}

/// A line of /proc/PID/status after `key`, trimmed.
pub fn status_line(pid: u32, key: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_owned())
}

/// A KiB figure of /proc/PID/status (`VmHWM:`).
pub fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The machine the bench ran on.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Machine {
    pub cpu: Option<String>,
    pub cpus: Option<usize>,
    /// The `hypervisor` CPU flag: a VM.
    pub hypervisor: Option<bool>,
    pub mem_gib: Option<f64>,
    pub kernel: Option<String>,
    pub loadavg_at_start: Option<String>,
}

impl Machine {
    pub fn read() -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |key: &str| {
            cpuinfo
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        };
        let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mem_kib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok());
        let trimmed = |path: &str| fs::read_to_string(path).ok().map(|s| s.trim().to_owned());
        Machine {
            cpu: field("model name"),
            cpus: thread::available_parallelism().map(|n| n.get()).ok(),
            hypervisor: field("flags").map(|f| f.split_whitespace().any(|x| x == "hypervisor")),
            mem_gib: mem_kib.map(|k| k as f64 / 1048576.0),
            kernel: trimmed("/proc/sys/kernel/osrelease"),
            loadavg_at_start: trimmed("/proc/loadavg"),
        }
    }
}
