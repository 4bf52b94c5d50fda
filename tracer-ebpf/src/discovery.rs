//! Library discovery and per-process probes, race-free: when a traced process opens a file
//! named like a probe-set library, or a process with per-process probes forks, the process
//! is stopped from its own syscall exit (before it runs another user instruction) and the
//! loader is told; the loader attaches, then sends `SIGCONT`. So no first call is missed,
//! however soon after `dlopen` or `fork` it comes. A fork child's return from `clone` is
//! process-tree tracking's (`process.rs`), which asks for its stop here ([`report_forked`]).

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_RB_FORCE_WAKEUP},
    helpers::{bpf_ktime_get_ns, bpf_send_signal, generated},
    macros::{map, tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::TracePointContext,
};
use tracer_common::{
    AttachEvent, EventHeader, MAX_PATTERNS, NamePattern, PATH_LEN, PATTERN_LEN, SET_UNKNOWN,
    attach_event, attach_flags, counter, kind,
};

use crate::maps::{EVENTS, bump, current_ids, is_traced, kernel_tid};

/// File-name patterns of the probe sets' libraries, set by the loader; a `len` of 0 ends
/// the list.
#[map]
static NAME_PATTERNS: Array<NamePattern> = Array::with_max_entries(MAX_PATTERNS, 0);

/// Processes (loader's tgid) with per-process probes: their fork children are stopped for
/// their own. Set by the loader, cleared here at exec (the new image maps nothing yet) and
/// exit.
#[map]
pub static LINKED: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

/// Processes (loader's tgid) stopped here and not yet continued by the loader, with the
/// number of stop events it has yet to handle (two threads can stop the process at once:
/// it is continued after the last). The loader continues any left when it ends.
#[map]
static STOPPED: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

/// `open`/`openat`'s file name pointer, from entry to exit, by kernel thread id.
#[map]
static OPENING: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// Index 0: 1 while processes may be stopped. The loader clears it before it ends.
#[map]
static CONTROL: Array<u32> = Array::with_max_entries(1, 0);

/// The path being matched (too large for the BPF stack).
#[map]
static PATH_SCRATCH: PerCpuArray<[u8; PATH_LEN]> = PerCpuArray::with_max_entries(1, 0);

/// Syscall tracepoint layout: arguments from offset 16, 8 bytes each; `ret` at 16 on exit.
const ARG0: usize = 16;
const RET: usize = 16;
const SIGSTOP: u32 = 19;
const PATH_MASK: usize = PATH_LEN - 1;

const _: () = assert!(PATH_LEN.is_power_of_two());

/// `O_ACCMODE`: the access bits of `open`'s flags (0: `O_RDONLY`).
const O_ACCMODE: u64 = 3;

/// Remembers the name `open` was given, by thread, for its exit. `flags_arg`: where its
/// flags are; an open for writing (a copy being made of a library, say) loads nothing and
/// is let be. `openat2` keeps its flags in a struct: every one is checked.
#[inline(always)]
fn remember_name(ctx: &TracePointContext, arg: usize, flags_arg: Option<usize>) {
    let Some((tgid, _)) = current_ids() else {
        return;
    };
    if !is_traced(tgid) {
        return;
    }
    if let Some(flags_arg) = flags_arg
        && let Ok(flags) = unsafe { ctx.read_at::<u64>(ARG0 + 8 * flags_arg) }
        && flags & O_ACCMODE != 0
    {
        return;
    }
    let Ok(filename) = (unsafe { ctx.read_at::<u64>(ARG0 + 8 * arg) }) else {
        return;
    };
    if OPENING.insert(&kernel_tid(), &filename, 0).is_err() {
        // The file goes unchecked: a library it opens is not attached before its calls.
        bump(counter::OPENS_FULL);
    }
}

/// `openat(dirfd, filename, flags, mode)`.
#[tracepoint]
pub fn lib_enter_openat(ctx: TracePointContext) -> u32 {
    remember_name(&ctx, 1, Some(2));
    0
}

/// `openat2(dirfd, filename, how, size)`.
#[tracepoint]
pub fn lib_enter_openat2(ctx: TracePointContext) -> u32 {
    remember_name(&ctx, 1, None);
    0
}

/// `open(filename, ...)`.
#[tracepoint]
pub fn lib_enter_open(ctx: TracePointContext) -> u32 {
    remember_name(&ctx, 0, Some(1));
    0
}

/// The exit of `open`, `openat` and `openat2`.
#[tracepoint]
pub fn lib_exit_open(ctx: TracePointContext) -> u32 {
    let _ = try_exit_open(&ctx);
    0
}

#[inline(always)]
fn try_exit_open(ctx: &TracePointContext) -> Option<()> {
    let key = kernel_tid();
    let filename = *unsafe { OPENING.get(&key) }?;
    let _ = OPENING.remove(&key);
    let fd: i64 = unsafe { ctx.read_at(RET) }.ok()?;
    if fd < 0 {
        return None;
    }
    let (tgid, tid) = current_ids()?;
    let path = unsafe { &mut *PATH_SCRATCH.get_ptr_mut(0)? };
    // The kernel has just read the name, so its page is resident.
    let read = unsafe {
        generated::bpf_probe_read_user_str(
            path.as_mut_ptr().cast(),
            PATH_LEN as u32,
            filename as *const core::ffi::c_void,
        )
    };
    if read <= 1 {
        return None;
    }
    // Without its NUL.
    let len = (read - 1) as usize & PATH_MASK;
    let (set, flags) = if len >= PATH_LEN - 1 {
        (SET_UNKNOWN, attach_flags::PATH_TRUNCATED)
    } else {
        (matching_set(path, len)?, 0)
    };
    report(
        attach_event::LIBRARY_OPENED,
        (tgid, tid),
        fd as i32,
        0,
        set,
        flags,
        Some((path, len as u32)),
        true,
    );
    Some(())
}

/// The probe set whose pattern the file name of `path` (its last component) matches.
///
/// Written without data-dependent branches in the loops: each branch on a byte would
/// double the paths the verifier walks.
#[inline(always)]
fn matching_set(path: &[u8; PATH_LEN], len: usize) -> Option<u32> {
    let len = len as u64;
    let mut base = 0u64;
    for i in 0..PATH_LEN {
        let slash = is_zero(u64::from(path[i]) ^ u64::from(b'/')) & less(i as u64, len);
        base = select(slash, i as u64 + 1, base);
    }
    for index in 0..MAX_PATTERNS {
        let pattern = NAME_PATTERNS.get(index)?;
        let pattern_len = u64::from(pattern.len);
        if pattern_len == 0 || pattern_len > PATTERN_LEN as u64 {
            return None;
        }
        let mut differ = 0u64;
        for i in 0..PATTERN_LEN {
            let byte = u64::from(path_byte(path, base + i as u64));
            let in_name = less(i as u64, pattern_len);
            differ |= (byte ^ u64::from(pattern.name[i])) * in_name;
        }
        let end = base + pattern_len;
        if differ != 0 || end > len {
            continue;
        }
        if end == len || (pattern.exact == 0 && path_byte(path, end) == b'.') {
            return Some(pattern.set);
        }
    }
    None
}

/// The byte of `path` at `index`, masked into the buffer.
#[inline(always)]
fn path_byte(path: &[u8; PATH_LEN], index: u64) -> u8 {
    // SAFETY: `in_path` masks the index below PATH_LEN.
    unsafe { *path.get_unchecked(in_path(index)) }
}

/// `index` masked into the path buffer, in assembly: the optimiser drops a mask it can
/// prove redundant, and older verifiers (6.1) cannot follow its proof.
#[inline(always)]
fn in_path(index: u64) -> usize {
    let masked: u64;
    // SAFETY: register arithmetic only.
    unsafe {
        core::arch::asm!(
            "{r} = {index}",
            "{r} &= {mask}",
            r = out(reg) masked,
            index = in(reg) index,
            mask = const PATH_MASK,
        );
    }
    masked as usize
}

/// 1 if `a < b`, else 0 (both below 2^63). In assembly, so that the optimiser cannot turn
/// it back into a compare and branch.
#[inline(always)]
fn less(a: u64, b: u64) -> u64 {
    let result: u64;
    // SAFETY: register arithmetic only.
    unsafe {
        core::arch::asm!(
            "{r} = {a}",
            "{r} -= {b}",
            "{r} >>= 63",
            r = out(reg) result,
            a = in(reg) a,
            b = in(reg) b,
        );
    }
    result
}

/// 1 if `x` is 0, else 0 (`x` below 2^63); branch-free as [`less`].
#[inline(always)]
fn is_zero(x: u64) -> u64 {
    less(x, 1)
}

/// `if bit { a } else { b }` for a `bit` of 0 or 1 (from [`less`]), without a branch.
#[inline(always)]
fn select(bit: u64, a: u64, b: u64) -> u64 {
    let mask = bit.wrapping_neg();
    (a & mask) | (b & !mask)
}

/// Reports a fork child of a process with per-process probes, stopped (when stops are
/// allowed) until its own probes are attached.
#[inline(always)]
pub fn report_forked(ids: (u32, u32), parent: u32) {
    report(attach_event::FORKED, ids, -1, parent, 0, 0, None, true);
}

/// Reports a process that exec'd from a thread other than its leader.
#[inline(always)]
pub fn report_new_leader(ids: (u32, u32)) {
    report(attach_event::NEW_LEADER, ids, -1, 0, 0, 0, None, false);
}

/// Sends an attach event, stopping the current process first when `stop` (and stops are
/// allowed); the reader is woken at once, as the process waits for it.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "one call per event kind, inlined"
)]
fn report(
    what: u32,
    (tgid, tid): (u32, u32),
    fd: i32,
    parent: u32,
    set: u32,
    flags: u32,
    path: Option<(&[u8; PATH_LEN], u32)>,
    stop: bool,
) {
    let Some(mut entry) = EVENTS.reserve::<AttachEvent>(0) else {
        // Not stopped: nobody would know to continue it.
        bump(counter::ATTACH_RING_FULL);
        return;
    };
    let mut flags = flags;
    if stop && CONTROL.get(0).copied() == Some(1) {
        // Recorded first, so that the loader continues it even if it ends before it reads
        // this event.
        count_stop(tgid, 1);
        if unsafe { bpf_send_signal(SIGSTOP) } == 0 {
            flags |= attach_flags::STOPPED;
        } else {
            count_stop(tgid, u64::MAX);
            flags |= attach_flags::STOP_FAILED;
        }
    }
    let out = entry.as_mut_ptr();
    unsafe {
        (*out).header = EventHeader {
            kind: kind::ATTACH,
            flags,
            ts_ns: bpf_ktime_get_ns(),
            pid: tgid,
            tid,
        };
        (*out).what = what;
        (*out).fd = fd;
        (*out).parent = parent;
        (*out).set = set;
        (*out)._pad = 0;
        match path {
            Some((bytes, len)) => {
                (*out).path = *bytes;
                (*out).path_len = len;
            }
            None => {
                (*out).path = [0; PATH_LEN];
                (*out).path_len = 0;
            }
        }
    }
    entry.submit(BPF_RB_FORCE_WAKEUP as u64);
}

/// Adds `delta` (wrapping: `u64::MAX` takes one away) to `tgid`'s outstanding stops.
#[inline(always)]
fn count_stop(tgid: u32, delta: u64) {
    if let Some(count) = STOPPED.get_ptr_mut(&tgid) {
        crate::maps::atomic_add(count, delta);
    } else if delta == 1 && STOPPED.insert(&tgid, &1, BPF_NOEXIST as u64).is_err() {
        // Another CPU inserted it first.
        if let Some(count) = STOPPED.get_ptr_mut(&tgid) {
            crate::maps::atomic_add(count, 1);
        }
    }
}

/// Forgets a process that exited: it needs no continuing and has no probes.
#[inline(always)]
pub fn process_exited(tgid: u32) {
    let _ = LINKED.remove(&tgid);
    let _ = STOPPED.remove(&tgid);
}
