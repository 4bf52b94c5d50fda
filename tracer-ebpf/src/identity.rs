//! Which probe fired, on kernels without `bpf_get_attach_cookie` (before 5.15).
//!
//! The kernel sets the registers' ip to the probed address before a uprobe's handler runs
//! (`handle_swbp`: "change it in advance for ->handler()"), so the entry program knows the
//! address it fired at. Where the library file is mapped there, and from which file offset,
//! is recorded here when a traced process maps it: discovery stops the process at the
//! `open` of a probe-set library, the loader names the fd's library in `LIBRARY_FDS`, and
//! each `mmap` of that fd is kept in the process's `MAPPINGS`. The probe is then
//! `PROBES_AT[(library, file offset)]`, filled by the loader as it attaches: its cookie.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::{map, tracepoint},
    maps::{Array, HashMap},
    programs::TracePointContext,
};
use tracer_common::{LibraryMapping, MAX_MAPPINGS, ProbeAt, ProcessMappings, counter};

use crate::maps::{bump, current_ids, is_traced, kernel_tid, load_const};

/// Set to 1 by the loader where the kernel lacks attach cookies.
#[unsafe(no_mangle)]
static NO_COOKIES: u32 = 0;

/// The cookie of each probe, by library and file offset (kernels without cookies).
#[map]
static PROBES_AT: HashMap<ProbeAt, u64> = HashMap::with_max_entries(16384, 0);

/// `(tgid << 32) | fd` of a planned library file a traced process opened → the library's
/// id. Written by the loader while the process is stopped at the `open`; removed at the
/// fd's `close`.
#[map]
static LIBRARY_FDS: HashMap<u64, u32> = HashMap::with_max_entries(4096, 0);

/// Each traced process's mappings of planned library files.
#[map]
static MAPPINGS: HashMap<u32, ProcessMappings> = HashMap::with_max_entries(16384, 0);

/// A zeroed `ProcessMappings` to start a process's entry (never written).
#[map]
static ZERO_MAPPINGS: Array<ProcessMappings> = Array::with_max_entries(1, 0);

/// An `mmap` of a library fd, from entry to exit, by kernel thread id.
#[map]
static MAPPING: HashMap<u32, LibraryMapping> = HashMap::with_max_entries(4096, 0);

/// `sys_enter_mmap`: `addr, len, prot, flags, fd, off` from offset 16; `sys_exit_mmap`'s
/// `ret` at 16.
const LEN: usize = 24;
const FD: usize = 48;
const OFF: usize = 56;
const RET: usize = 16;
/// `sys_enter_close`'s `fd`.
const CLOSE_FD: usize = 16;
const MAPPING_MASK: u32 = MAX_MAPPINGS as u32 - 1;

#[inline(always)]
pub fn no_cookies() -> bool {
    load_const(&NO_COOKIES) != 0
}

/// The cookie of the probe at `ip` in process `tgid`, or `None` (counted) where no
/// recorded mapping of a planned library explains it.
#[inline(always)]
pub fn cookie_at(tgid: u32, ip: u64) -> Option<u64> {
    let found = find(tgid, ip);
    if found.is_none() {
        bump(counter::UNIDENTIFIED_PROBE);
    }
    found
}

#[inline(always)]
fn find(tgid: u32, ip: u64) -> Option<u64> {
    let process = unsafe { MAPPINGS.get(&tgid) }?;
    let next = process.next;
    // Newest first: a segment mapped over the library's first span is the one that counts.
    for age in 1..=MAX_MAPPINGS as u32 {
        if age > next {
            return None;
        }
        let mapping = process
            .mappings
            .get(((next - age) & MAPPING_MASK) as usize)?;
        if mapping.start <= ip && ip < mapping.end {
            let key = ProbeAt {
                library: mapping.library,
                _pad: 0,
                file_offset: ip - mapping.start + mapping.file_offset,
            };
            return unsafe { PROBES_AT.get(&key) }.copied();
        }
    }
    None
}

#[tracepoint]
pub fn map_enter_mmap(ctx: TracePointContext) -> u32 {
    let _ = try_enter_mmap(&ctx);
    0
}

#[tracepoint]
pub fn map_exit_mmap(ctx: TracePointContext) -> u32 {
    let _ = try_exit_mmap(&ctx);
    0
}

/// `close(fd)`: the loader closes a library's fd once it has mapped it; the number may
/// name another file next.
#[tracepoint]
pub fn map_enter_close(ctx: TracePointContext) -> u32 {
    let _ = try_enter_close(&ctx);
    0
}

#[inline(always)]
fn try_enter_close(ctx: &TracePointContext) -> Option<()> {
    if !no_cookies() {
        return None;
    }
    let (tgid, _) = current_ids()?;
    if !is_traced(tgid) {
        return None;
    }
    let fd: u64 = unsafe { ctx.read_at(CLOSE_FD) }.ok()?;
    let _ = LIBRARY_FDS.remove(&((u64::from(tgid) << 32) | (fd & 0xffff_ffff)));
    Some(())
}

#[inline(always)]
fn try_enter_mmap(ctx: &TracePointContext) -> Option<()> {
    if !no_cookies() {
        return None;
    }
    let (tgid, _) = current_ids()?;
    if !is_traced(tgid) {
        return None;
    }
    let fd: u64 = unsafe { ctx.read_at(FD) }.ok()?;
    let key = (u64::from(tgid) << 32) | (fd & 0xffff_ffff);
    let library = *unsafe { LIBRARY_FDS.get(&key) }?;
    let mapping = LibraryMapping {
        start: 0,
        end: unsafe { ctx.read_at(LEN) }.ok()?,
        file_offset: unsafe { ctx.read_at(OFF) }.ok()?,
        library,
        _pad: 0,
    };
    // Where it does not fit, the calls in this mapping are counted when they come.
    let _ = MAPPING.insert(&kernel_tid(), &mapping, 0);
    Some(())
}

#[inline(always)]
fn try_exit_mmap(ctx: &TracePointContext) -> Option<()> {
    let key = kernel_tid();
    let mut mapping = *unsafe { MAPPING.get(&key) }?;
    let _ = MAPPING.remove(&key);
    let start: u64 = unsafe { ctx.read_at(RET) }.ok()?;
    // An error is a small negative number.
    if start > u64::MAX - 4095 {
        return None;
    }
    let (tgid, _) = current_ids()?;
    mapping.start = start;
    mapping.end += start;
    record(tgid, &mapping);
    Some(())
}

/// Adds `mapping` to `tgid`'s mappings, over its oldest where they are full.
#[inline(always)]
fn record(tgid: u32, mapping: &LibraryMapping) -> Option<()> {
    if unsafe { MAPPINGS.get(&tgid) }.is_none() {
        let zero = ZERO_MAPPINGS.get(0)?;
        let _ = MAPPINGS.insert(&tgid, zero, BPF_NOEXIST as u64);
    }
    // The map full: this process's calls are counted as unidentified when they come.
    let process = MAPPINGS.get_ptr_mut(&tgid)?;
    // SAFETY: a live map value; only this process's threads write it (mmap is serialised
    // by the process's mmap lock only in the kernel, so two threads may race here: the
    // loser's mapping may be overwritten, and its calls counted as unidentified).
    let process = unsafe { &mut *process };
    let index = process.next & MAPPING_MASK;
    process.next = process.next.wrapping_add(1);
    *process.mappings.get_mut(index as usize)? = *mapping;
    Some(())
}

/// A fork child maps what its parent maps.
#[inline(always)]
pub fn inherit(parent: u32, child: u32) {
    if !no_cookies() {
        return;
    }
    // Copied map value to map value: the struct is larger than the BPF stack.
    if let Some(mappings) = unsafe { MAPPINGS.get(&parent) } {
        let _ = MAPPINGS.insert(&child, mappings, 0);
    }
}

/// A process that exec'd or exited maps nothing any more.
#[inline(always)]
pub fn forget(tgid: u32) {
    if !no_cookies() {
        return;
    }
    let _ = MAPPINGS.remove(&tgid);
}
