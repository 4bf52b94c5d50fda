//! The eBPF object (`tracer-ebpf`, built by `cargo xtask build-ebpf` and embedded here) and
//! loading it: its globals are set for this kernel and this run before the programs load.

use std::{fs, path::Path};

use anyhow::{Context, Result, bail};
use aya::{Ebpf, EbpfLoader};
use tracer_common::DEVICE_PREFIX_LEN;

use super::tracefs::{field_offset, tracefs};

/// The eBPF object built by `cargo xtask build-ebpf`, embedded at compile time.
pub static PROBES_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("CUDATRACE_PROBES_OBJ"));

/// Load-time settings of the eBPF object.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub trace_all: bool,
    pub ring_bytes: u32,
    /// Path prefix of NVIDIA device files (`--kernel`; tests point it elsewhere).
    pub device_prefix: String,
    /// Sizes that replace the object's own for some of [`super::maps::SIZED_MAPS`] (tests).
    pub map_entries: Vec<(String, u32)>,
    /// `--stacks`: the stack programs' settings.
    pub stacks: Option<StackOptions>,
}

/// Set: 3.12's `_PyCFrame` is read alone, not with the C stack above it (a measurement's
/// switch, as `CUDATRACE_STACKS_IDENT_PER_FRAME` is).
pub const CFRAME_WINDOW_OFF_ENV: &str = "CUDATRACE_STACKS_NO_CFRAME_WINDOW";
/// Set: a C-stack window reads past the end of the thread's stack (where an earlier read
/// found it) as before, faulting there at every call where it lies within a window (a
/// measurement's switch: issue 32's A/B in one binary).
pub const UP_CEILING_OFF_ENV: &str = "CUDATRACE_STACKS_NO_UP_CEILING";
/// Set: a C-stack window reads its whole size (`CUDATRACE_STACKS_UP_WINDOW`), not only as
/// far up as the thread's walks have needed frames (a measurement's switch).
pub const UP_REACH_OFF_ENV: &str = "CUDATRACE_STACKS_NO_UP_REACH";
/// Set: a data-stack window stops at its frame's page, also in the thread's current chunk
/// (a measurement's switch).
pub const DATA_CHUNK_OFF_ENV: &str = "CUDATRACE_STACKS_NO_DATA_CHUNK";
/// Set: a stack the probes knew is sent as a record of its own, not in its call's record
/// (a measurement's switch: what the record costs).
pub const CALL_REF_OFF_ENV: &str = "CUDATRACE_STACKS_NO_CALL_REF";
/// For measuring: bytes (256 to 8112) a data-stack window reaches below its frame.
pub const DATA_WINDOW_ENV: &str = "CUDATRACE_STACKS_DATA_WINDOW";
/// For measuring: bytes (256 to 8112) a C-stack window reads up from an entry frame.
pub const UP_WINDOW_ENV: &str = "CUDATRACE_STACKS_UP_WINDOW";

/// A window's size from `env`, where set to a whole number of 256 to `max` bytes.
fn window_bytes(env: &str, max: u32) -> Option<u32> {
    let bytes: u32 = std::env::var(env).ok()?.trim().parse().ok()?;
    (256..=max).contains(&bytes).then_some(bytes & !7)
}

/// The stack programs' load-time settings (`--stacks`).
#[derive(Clone, Copy, Debug)]
pub struct StackOptions {
    /// The offset of `thread.fsbase` in the kernel's `task_struct`.
    pub fsbase_offset: u32,
    /// The frame budget (`--stack-depth`).
    pub depth: u32,
    /// A stacked call walks its stack with a chance of 1 in `every` (`--stack-every`).
    pub every: u32,
    /// At most `rate` stacked calls a second per thread (`--stack-rate`); 0: no limit.
    pub rate: u32,
}

/// The inode of the kernel's root pid namespace (`PROC_PID_INIT_INO`).
const ROOT_PIDNS_INODE: u64 = 0xEFFF_FFFC;

/// This process's pid namespace as the eBPF side names it (the kernel's device number and
/// the inode of `/proc/self/ns/pid`), or `None` in the root namespace, where the kernel's
/// ids are ours.
pub fn own_pid_namespace() -> Result<Option<(u64, u64)>> {
    use std::os::unix::fs::MetadataExt;
    let ns = fs::metadata("/proc/self/ns/pid").context("reading /proc/self/ns/pid")?;
    if ns.ino() == ROOT_PIDNS_INODE {
        return Ok(None);
    }
    // The kernel compares its own dev_t encoding (major << 20 | minor), not stat's.
    let device = (u64::from(libc::major(ns.dev())) << 20) | u64::from(libc::minor(ns.dev()));
    Ok(Some((device, ns.ino())))
}

/// Field offsets of the scheduler tracepoints on the running kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TracepointOffsets {
    newtask_pid: u32,
    newtask_flags: u32,
    exec_filename: u32,
    exec_pid: u32,
    exec_old_pid: u32,
    exit_group_dead: u32,
}

fn tracepoint_offsets(tracefs: &Path) -> Result<TracepointOffsets> {
    let read = |event: &str| {
        let path = tracefs.join("events").join(event).join("format");
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let newtask = read("task/task_newtask")?;
    let exec = read("sched/sched_process_exec")?;
    let exit = read("sched/sched_process_exit")?;
    let need = |format: &str, field: &str, event: &str| {
        field_offset(format, field)
            .with_context(|| format!("tracepoint {event} has no field {field}"))
    };
    Ok(TracepointOffsets {
        newtask_pid: need(&newtask, "pid", "task_newtask")?,
        newtask_flags: need(&newtask, "clone_flags", "task_newtask")?,
        exec_filename: need(&exec, "filename", "sched_process_exec")?,
        exec_pid: field_offset(&exec, "pid").unwrap_or(0),
        exec_old_pid: field_offset(&exec, "old_pid").unwrap_or(0),
        exit_group_dead: field_offset(&exit, "group_dead").unwrap_or(0),
    })
}

/// Device-path prefix and its length, as the `DEVICE_PREFIX` globals hold them.
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

/// Loads the probes object with its globals set; nothing is attached yet.
pub fn load(options: &LoadOptions) -> Result<Ebpf> {
    let tracefs = tracefs()?;
    let offsets = tracepoint_offsets(&tracefs)?;
    let trace_all = u32::from(options.trace_all);
    let (prefix, prefix_used) = prefix_bytes(&options.device_prefix)?;
    let (xid_code, xid_dev, xid_msg) = xid_offsets(&tracefs).unwrap_or((0, 0, 0));
    let (pidns_dev, pidns_ino) = own_pid_namespace()?.unwrap_or((0, 0));
    let no_cookies = u32::from(super::helpers::cookies_missing());
    let (data_window, up_window) = (
        window_bytes(DATA_WINDOW_ENV, 8112),
        window_bytes(UP_WINDOW_ENV, 8112),
    );
    let mut loader = EbpfLoader::new();
    for (map, entries) in &options.map_entries {
        loader.map_max_entries(map, *entries);
    }
    if let Some(stacks) = &options.stacks {
        loader
            .override_global("FSBASE_OFF", &stacks.fsbase_offset, true)
            .override_global("STACK_DEPTH", &stacks.depth, true)
            .override_global("STACK_EVERY", &stacks.every, true)
            .override_global("STACK_RATE", &stacks.rate, true);
        // For measuring the 3.12 cframe's window read against the read of its pointer
        // alone (BENCHMARKS.md, issue 32), in one binary.
        if std::env::var_os(CFRAME_WINDOW_OFF_ENV).is_some() {
            loader.override_global("CFRAME_WINDOW", &0u32, true);
        }
        if std::env::var_os(UP_CEILING_OFF_ENV).is_some() {
            loader.override_global("UP_CEILING", &0u32, true);
        }
        if std::env::var_os(UP_REACH_OFF_ENV).is_some() {
            loader.override_global("UP_REACH", &0u32, true);
        }
        if std::env::var_os(DATA_CHUNK_OFF_ENV).is_some() {
            loader.override_global("DATA_CHUNK", &0u32, true);
        }
        if std::env::var_os(CALL_REF_OFF_ENV).is_some() {
            loader.override_global("CALL_REF", &0u32, true);
        }
        // For measuring the windows' sizes (bytes read against reads made), in one binary.
        if let Some(bytes) = &data_window {
            loader.override_global("DATA_WINDOW", bytes, true);
        }
        if let Some(bytes) = &up_window {
            loader.override_global("UP_WINDOW", bytes, true);
        }
    }
    loader
        .override_global("PIDNS_DEV", &pidns_dev, true)
        .override_global("PIDNS_INO", &pidns_ino, true)
        .override_global("EXEC_PID_OFF", &offsets.exec_pid, true)
        .override_global("EXEC_OLD_PID_OFF", &offsets.exec_old_pid, true)
        .override_global("DEVICE_PREFIX", &prefix, true)
        .override_global("DEVICE_PREFIX_USED", &prefix_used, true)
        .override_global("XID_CODE_OFF", &xid_code, true)
        .override_global("XID_DEV_OFF", &xid_dev, true)
        .override_global("XID_MSG_OFF", &xid_msg, true)
        .override_global("TRACE_ALL", &trace_all, true)
        .override_global("NO_COOKIES", &no_cookies, true)
        .override_global("WAKEUP_BYTES", &(options.ring_bytes / 16), true)
        .override_global("NEWTASK_PID_OFF", &offsets.newtask_pid, true)
        .override_global("NEWTASK_FLAGS_OFF", &offsets.newtask_flags, true)
        .override_global("EXEC_FILENAME_OFF", &offsets.exec_filename, true)
        .override_global("EXIT_GROUP_DEAD_OFF", &offsets.exit_group_dead, true)
        .map_max_entries("EVENTS", options.ring_bytes)
        .load(PROBES_OBJECT)
        .context("loading the eBPF probes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_text_code_touches_no_maps() {
        // uprobe_multi relinks every .text function into each program it loads by hand;
        // a map reference there breaks relocation (keep eBPF helpers inline(always)).
        use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
        let elf = object::File::parse(PROBES_OBJECT).unwrap();
        let text = elf.section_by_name(".text").unwrap();
        for (offset, relocation) in text.relocations() {
            if let RelocationTarget::Symbol(index) = relocation.target() {
                let symbol = elf.symbol_by_index(index).unwrap();
                assert_ne!(
                    symbol.kind(),
                    object::SymbolKind::Data,
                    ".text+{offset:#x} refers to {}",
                    symbol.name().unwrap()
                );
            }
        }
    }

    /// The programs every traced call runs call no `memset`: bpf-linker leaves each one
    /// LLVM makes a call to aya-ebpf's byte loop, 5 instructions a byte (a zeroed array,
    /// or adjacent zero stores merged; tracer-ebpf/src/zero.rs). Read from the object's
    /// relocations, each program's own by their offsets in its section.
    #[test]
    fn the_call_and_walk_programs_call_no_memset() {
        use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
        let elf = object::File::parse(PROBES_OBJECT).unwrap();
        for program in [
            "call_enter",
            "call_return",
            "stack_walk",
            "stack_walk_ident",
        ] {
            let symbol = elf
                .symbols()
                .find(|s| s.name() == Ok(program))
                .unwrap_or_else(|| panic!("no {program} in the object"));
            let section = elf
                .section_by_index(symbol.section_index().unwrap())
                .unwrap();
            let span = symbol.address()..symbol.address() + symbol.size();
            let mut targets = Vec::new();
            for (offset, relocation) in section.relocations() {
                if let RelocationTarget::Symbol(index) = relocation.target()
                    && span.contains(&offset)
                {
                    targets.push(elf.symbol_by_index(index).unwrap().name().unwrap());
                }
            }
            // Its maps are relocations too: the reading found the program's own.
            assert!(
                targets.contains(&"STACK_SCRATCH") || targets.contains(&"FRAMES"),
                "{program}: {targets:?}"
            );
            for builtin in ["memset", "memcpy", "memmove"] {
                assert!(
                    !targets.contains(&builtin),
                    "{program} calls {builtin} ({} times)",
                    targets.iter().filter(|t| **t == builtin).count()
                );
            }
        }
    }
}
