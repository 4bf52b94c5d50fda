//! `--kernel`: what the NVIDIA kernel module does for the traced processes.
//!
//! Two mechanisms, chosen per kernel: kprobes and kretprobes on the module's functions
//! where the kernel has kprobes, and everywhere the syscall tracepoints, which see the
//! ioctls and mmaps of `/dev/nvidia*` files (the driver's whole user interface, launches
//! aside: those are doorbell writes that never enter the kernel). `nvidia:nvidia_dev_xid`
//! adds Xid errors when the module provides it.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use aya::{Ebpf, maps::HashMap as BpfHashMap, programs::KProbe};
use serde::Serialize;
use tracer_common::{DEVICE_PREFIX_LEN, DriverEvent, IOCTL_PARAMS_LEN, device_kind, driver_event};

use crate::{
    probes::{self, field_offset},
    schema::DriverLine,
};

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

/// Functions that run in interrupt context: reported whichever process they interrupt.
pub const INTERRUPT_FUNCTIONS: &[&str] = &["nvidia_isr", "nvidia_isr_kthread_bh"];

/// The default device path prefix.
pub const DEVICE_PREFIX: &str = "/dev/nvidia";

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

/// Device-path prefix and Xid offsets, set as globals before the object loads.
pub fn prefix_bytes(prefix: &str) -> Result<([u8; DEVICE_PREFIX_LEN], u32)> {
    let bytes = prefix.as_bytes();
    if bytes.is_empty() || bytes.len() >= DEVICE_PREFIX_LEN {
        bail!(
            "device prefix {prefix:?} must be 1 to {} bytes",
            DEVICE_PREFIX_LEN - 1
        );
    }
    let mut out = [0u8; DEVICE_PREFIX_LEN];
    out[..bytes.len()].copy_from_slice(bytes);
    Ok((out, bytes.len() as u32))
}

/// Offsets of `nvidia:nvidia_dev_xid`'s fields (code, dev, msg), if the tracepoint exists.
pub fn xid_offsets(tracefs: &Path) -> Option<(u32, u32, u32)> {
    let format = fs::read_to_string(tracefs.join("events/nvidia/nvidia_dev_xid/format")).ok()?;
    Some((
        field_offset(&format, "error_code")?,
        field_offset(&format, "dev").unwrap_or(0),
        field_offset(&format, "msg").unwrap_or(0),
    ))
}

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
    probes::attach_tracepoints(bpf, &tracepoints)?;
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
        let program: &mut KProbe = probes::program(bpf, program_name)?;
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

fn device_name(kind: u32, index: u32) -> String {
    match kind {
        device_kind::CTL => "nvidiactl".into(),
        device_kind::UVM => "nvidia-uvm".into(),
        device_kind::GPU => format!("nvidia{index}"),
        _ => "nvidia-other".into(),
    }
}

/// `_IOC_TYPE` of the NVIDIA control ioctls.
pub const IOC_TYPE_NVIDIA: u32 = b'F' as u32;

/// `NV_ESC_*` names by `_IOC_NR` (open driver headers nv_escape.h and nv-ioctl-numbers.h).
pub fn escape_name(nr: u32) -> Option<&'static str> {
    Some(match nr {
        0x27 => "NV_ESC_RM_ALLOC_MEMORY",
        0x28 => "NV_ESC_RM_ALLOC_OBJECT",
        0x29 => "NV_ESC_RM_FREE",
        0x2A => "NV_ESC_RM_CONTROL",
        0x2B => "NV_ESC_RM_ALLOC",
        0x34 => "NV_ESC_RM_DUP_OBJECT",
        0x35 => "NV_ESC_RM_SHARE",
        0x4A => "NV_ESC_RM_VID_HEAP_CONTROL",
        0x4E => "NV_ESC_RM_MAP_MEMORY",
        0x4F => "NV_ESC_RM_UNMAP_MEMORY",
        0x54 => "NV_ESC_RM_ALLOC_CONTEXT_DMA2",
        0x57 => "NV_ESC_RM_MAP_MEMORY_DMA",
        0x58 => "NV_ESC_RM_UNMAP_MEMORY_DMA",
        0x5E => "NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO",
        200 => "NV_ESC_CARD_INFO",
        201 => "NV_ESC_REGISTER_FD",
        206 => "NV_ESC_ALLOC_OS_EVENT",
        207 => "NV_ESC_FREE_OS_EVENT",
        210 => "NV_ESC_CHECK_VERSION_STR",
        211 => "NV_ESC_IOCTL_XFER_CMD",
        212 => "NV_ESC_ATTACH_GPUS_TO_FD",
        218 => "NV_ESC_WAIT_OPEN_COMPLETE",
        _ => return None,
    })
}

/// UVM ioctl names (plain command numbers on /dev/nvidia-uvm; uvm_ioctl.h).
pub fn uvm_name(cmd: u64) -> Option<&'static str> {
    Some(match cmd {
        0x3000_0001 => "UVM_INITIALIZE",
        0x3000_0002 => "UVM_DEINITIALIZE",
        25 => "UVM_REGISTER_GPU_VASPACE",
        27 => "UVM_REGISTER_CHANNEL",
        33 => "UVM_MAP_EXTERNAL_ALLOCATION",
        37 => "UVM_REGISTER_GPU",
        73 => "UVM_CREATE_EXTERNAL_RANGE",
        _ => return None,
    })
}

fn u32_at(bytes: &[u8; IOCTL_PARAMS_LEN], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}

/// Decodes a driver event; `functions` names kprobe addresses.
pub fn decode(event: &DriverEvent, functions: &HashMap<u64, String>) -> DriverLine {
    let mut record = DriverLine {
        pid: event.header.pid,
        tid: event.header.tid,
        ts_ns: event.header.ts_ns,
        dur_ns: event.dur_ns,
        ret: event.ret,
        ..DriverLine::default()
    };
    let device = Some(device_name(event.device, event.device_index));
    match event.what {
        driver_event::IOCTL => {
            record.hook = "ioctl".into();
            record.device = device;
            record.fd = Some(event.fd);
            let cmd = event.a as u32;
            record.cmd = Some(format!("{cmd:#x}"));
            if (cmd >> 8) & 0xff == IOC_TYPE_NVIDIA {
                let nr = cmd & 0xff;
                record.escape = Some(nr);
                record.escape_name = escape_name(nr).map(Into::into);
                match nr {
                    0x2A => {
                        record.rm_control_cmd = Some(format!("{:#x}", u32_at(&event.params, 8)))
                    }
                    0x2B => record.rm_class = Some(format!("{:#x}", u32_at(&event.params, 12))),
                    _ => {}
                }
            } else if event.device == device_kind::UVM {
                record.uvm_cmd = Some(event.a);
                record.uvm_name = uvm_name(event.a).map(Into::into);
            }
        }
        driver_event::MMAP => {
            record.hook = "mmap".into();
            record.device = device;
            record.fd = Some(event.fd);
            record.length = Some(event.a);
            record.offset = Some(event.b);
            record.prot = Some(event.c);
            record.flags = Some(event.d);
            if event.ret >= 0 {
                record.addr = Some(format!("{:#x}", event.ret));
            }
        }
        driver_event::XID => {
            record.hook = "xid".into();
            record.xid = Some(event.a);
            record.device = Some(format!("{:#x}", event.b));
            record.message = Some(crate::events::c_string(&event.params));
        }
        _ => {
            record.hook = "kprobe".into();
            record.function = Some(
                functions
                    .get(&event.a)
                    .cloned()
                    .unwrap_or_else(|| format!("{:#x}", event.a)),
            );
            record.args = Some([
                format!("{:#x}", event.b),
                format!("{:#x}", event.c),
                format!("{:#x}", event.d),
            ]);
            // nvidia_unlocked_ioctl(file, cmd, arg): name the escape like the tracepoint path.
            let cmd = event.c as u32;
            if record.function.as_deref() == Some("nvidia_unlocked_ioctl")
                && (cmd >> 8) & 0xff == IOC_TYPE_NVIDIA
            {
                record.cmd = Some(format!("{cmd:#x}"));
                record.escape = Some(cmd & 0xff);
                record.escape_name = escape_name(cmd & 0xff).map(Into::into);
            }
        }
    }
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::EventHeader;

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

    #[test]
    fn rm_control_and_alloc_parameters_are_named() {
        let mut event = DriverEvent {
            header: EventHeader {
                kind: 4,
                flags: 0,
                ts_ns: 10,
                pid: 1,
                tid: 2,
            },
            what: driver_event::IOCTL,
            device: device_kind::CTL,
            a: 0xc020_462a,
            ..DriverEvent::default()
        };
        event.params[8..12].copy_from_slice(&0x2080_0102u32.to_le_bytes());
        let record = decode(&event, &HashMap::new());
        assert_eq!(record.escape_name.as_deref(), Some("NV_ESC_RM_CONTROL"));
        assert_eq!(record.rm_control_cmd.as_deref(), Some("0x20800102"));
        assert_eq!(record.device.as_deref(), Some("nvidiactl"));
        event.a = 0xc030_462b;
        event.params[12..16].copy_from_slice(&0xc86fu32.to_le_bytes());
        let record = decode(&event, &HashMap::new());
        assert_eq!(
            (record.escape, record.rm_class.as_deref()),
            (Some(0x2b), Some("0xc86f"))
        );
    }

    #[test]
    fn paths_classify_like_the_kernel_side() {
        assert_eq!(classify("ctl"), (device_kind::CTL, 0));
        assert_eq!(classify("-uvm"), (device_kind::UVM, 0));
        assert_eq!(classify("12"), (device_kind::GPU, 12));
        assert_eq!(classify("-modeset"), (device_kind::OTHER, 0));
    }
}
