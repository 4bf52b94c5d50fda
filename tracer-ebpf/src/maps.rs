//! Maps and load-time constants shared by the programs.

use aya_ebpf::{
    bindings::{
        BPF_F_NO_PREALLOC, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP, bpf_pidns_info,
    },
    helpers::{bpf_get_current_pid_tgid, generated::bpf_get_ns_current_pid_tgid},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use tracer_common::{FrameStack, MAX_DEPTH, MAX_PROBES, ProbeSpec, counter};

/// Events to userspace. The loader sets the real size (`--ring-size`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 24, 0);

/// How to read each attached symbol's arguments, indexed by probe id (the attach
/// cookie's low 32 bits; see `tracer_common::cookie`).
#[map]
pub static SPECS: Array<ProbeSpec> = Array::with_max_entries(MAX_PROBES, 0);

/// Thread-group ids being traced: the command, its descendants, or `-p` targets.
#[map]
pub static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

/// Slot 0 is set to 1 by the loader when tracing stops: probes that still fire return at
/// once. An array slot, not a hash key: the verifier inlines its lookup into a load.
#[map]
pub static TRACING_STOPPED: Array<u32> = Array::with_max_entries(1, 0);

/// Pending calls per thread id, from entry to return.
#[map]
pub static FRAMES: HashMap<u32, FrameStack> = HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// A zeroed `FrameStack` to initialise a thread's entry in `FRAMES` (never written).
#[map]
pub static ZERO_STACK: Array<FrameStack> = Array::with_max_entries(1, 0);

/// Loss and activity counters, per CPU (see `tracer_common::counter`).
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Wake the reader only once this many bytes wait in the ring (0: wake on every event).
/// Each wakeup costs the traced thread an interrupt; the reader also drains on a timer.
#[unsafe(no_mangle)]
static WAKEUP_BYTES: u32 = 0;

/// Submit flags for a ring-buffer record: no wakeup until enough data waits.
#[inline(always)]
pub fn submit_flags() -> u64 {
    let threshold = u64::from(load_const(&WAKEUP_BYTES));
    if threshold == 0 {
        return 0;
    }
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= threshold {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Set to 1 by the loader for `--all`: trace every process that calls libcuda.
#[unsafe(no_mangle)]
static TRACE_ALL: u32 = 0;

/// Field offsets of the scheduler tracepoints, read by the loader from tracefs `format`
/// files so one object works on every kernel version.
#[unsafe(no_mangle)]
static NEWTASK_PID_OFF: u32 = 8;
#[unsafe(no_mangle)]
static NEWTASK_FLAGS_OFF: u32 = 32;
#[unsafe(no_mangle)]
static EXEC_FILENAME_OFF: u32 = 8;
/// Offsets of sched_process_exec's `pid` and `old_pid`, 0 where the kernel lacks them.
#[unsafe(no_mangle)]
static EXEC_PID_OFF: u32 = 0;
#[unsafe(no_mangle)]
static EXEC_OLD_PID_OFF: u32 = 0;
/// Offset of `group_dead` in sched_process_exit, 0 where the kernel lacks the field.
#[unsafe(no_mangle)]
static EXIT_GROUP_DEAD_OFF: u32 = 0;

/// The loader's pid namespace (device and inode of its `/proc/self/ns/pid`), or 0 when it
/// runs in the kernel's root one: then the kernel's own ids are the loader's.
#[unsafe(no_mangle)]
static PIDNS_DEV: u64 = 0;
#[unsafe(no_mangle)]
static PIDNS_INO: u64 = 0;

#[inline(always)]
pub fn load_const(value: &'static u32) -> u32 {
    // Volatile: the loader rewrites .rodata, so the compiler must not fold the default.
    unsafe { core::ptr::read_volatile(value) }
}

#[inline(always)]
fn load_const64(value: &'static u64) -> u64 {
    unsafe { core::ptr::read_volatile(value) }
}

/// Whether the loader runs in a pid namespace other than the root one.
#[inline(always)]
pub fn in_pid_namespace() -> bool {
    load_const64(&PIDNS_INO) != 0
}

/// The current thread's `(tgid, tid)` as the loader sees them (its pid namespace), or
/// `None` for a thread outside that namespace (its ids mean nothing to the loader).
#[inline(always)]
pub fn current_ids() -> Option<(u32, u32)> {
    let ino = load_const64(&PIDNS_INO);
    if ino == 0 {
        let pid_tgid = bpf_get_current_pid_tgid();
        return Some(((pid_tgid >> 32) as u32, pid_tgid as u32));
    }
    let mut ids = bpf_pidns_info { pid: 0, tgid: 0 };
    let rc = unsafe {
        bpf_get_ns_current_pid_tgid(
            load_const64(&PIDNS_DEV),
            ino,
            &mut ids,
            core::mem::size_of::<bpf_pidns_info>() as u32,
        )
    };
    if rc != 0 {
        return None;
    }
    Some((ids.tgid, ids.pid))
}

#[inline(always)]
pub fn trace_all() -> bool {
    load_const(&TRACE_ALL) != 0
}

#[inline(always)]
pub fn newtask_pid_off() -> u32 {
    load_const(&NEWTASK_PID_OFF)
}

#[inline(always)]
pub fn newtask_flags_off() -> u32 {
    load_const(&NEWTASK_FLAGS_OFF)
}

#[inline(always)]
pub fn exec_filename_off() -> u32 {
    load_const(&EXEC_FILENAME_OFF)
}

#[inline(always)]
pub fn exec_pid_off() -> u32 {
    load_const(&EXEC_PID_OFF)
}

#[inline(always)]
pub fn exec_old_pid_off() -> u32 {
    load_const(&EXEC_OLD_PID_OFF)
}

#[inline(always)]
pub fn exit_group_dead_off() -> u32 {
    load_const(&EXIT_GROUP_DEAD_OFF)
}

/// The kernel's (root namespace) thread id, for maps keyed before a thread can name
/// itself in the loader's namespace.
#[inline(always)]
pub fn kernel_tid() -> u32 {
    bpf_get_current_pid_tgid() as u32
}

#[inline(always)]
pub fn is_traced(tgid: u32) -> bool {
    // 0: the idle task, or a thread outside the loader's pid namespace.
    if tgid == 0 {
        return false;
    }
    if trace_all() {
        return !stopped();
    }
    unsafe { TRACED.get(&tgid) }.is_some()
}

/// Whether the loader has stopped tracing.
#[inline(always)]
pub fn stopped() -> bool {
    TRACING_STOPPED.get(0).is_some_and(|flag| *flag != 0)
}

#[inline(always)]
pub fn bump(index: u32) {
    add(index, 1);
}

#[inline(always)]
pub fn add(index: u32, amount: u64) {
    if let Some(count) = COUNTERS.get_ptr_mut(index) {
        // Per-CPU slot: no other writer, no atomic needed.
        unsafe { *count += amount };
    }
}

/// `*target += delta` as one atomic instruction (two CPUs may count the same value).
#[inline(always)]
pub fn atomic_add(target: *mut u64, delta: u64) {
    // SAFETY: `target` points into a live map value.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({target} + 0) += {delta}",
            target = in(reg) target,
            delta = in(reg) delta,
        );
    }
}

/// Moves the entry time of thread `tid`'s innermost pending call from `entered` to `now`:
/// the stack programs' walk ran between them, and a call's duration is to be its own, not
/// its walk's (else `--stack-every`'s walked calls would seem longer than the others).
/// Nothing where that call is not pending (it was not given a frame). With `stack` (a
/// stack the probes knew), the call keeps it, to send it with itself at its return: true
/// where it did.
#[inline(always)]
pub fn restamp_entry(
    tid: u32,
    entered: u64,
    now: u64,
    stack: Option<&tracer_common::stacks::StackRef>,
) -> bool {
    let Some(frames) = FRAMES.get_ptr_mut(&tid) else {
        return false;
    };
    // SAFETY: this thread's map value; only this thread's programs write it.
    let frames = unsafe { &mut *frames };
    let depth = frames.depth as usize;
    if depth == 0 || depth > MAX_DEPTH {
        return false;
    }
    if let Some(frame) = frames.frames.get_mut((depth - 1) & (MAX_DEPTH - 1))
        && frame.ts_ns == entered
    {
        frame.ts_ns = now;
        if let Some(stack) = stack {
            // Word by word: a struct copy between map values is a call to `memmove`.
            // SAFETY: reads of a live reference.
            unsafe {
                frame.stack.generation = core::ptr::read_volatile(&stack.generation);
                frame.stack.hash[0] = core::ptr::read_volatile(&stack.hash[0]);
                frame.stack.hash[1] = core::ptr::read_volatile(&stack.hash[1]);
            }
            frame.stack.flags = stack.flags;
            return true;
        }
    }
    false
}
