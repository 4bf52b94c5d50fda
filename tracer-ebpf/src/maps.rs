//! Maps and load-time constants shared by the programs.

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use tracer_common::{FrameStack, MAX_PROBES, ProbeSpec, TRACED_STOP_KEY, counter};

/// Events to userspace. The loader sets the real size (`--ring-size`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 24, 0);

/// How to read each attached symbol's arguments, indexed by attach cookie.
#[map]
pub static SPECS: Array<ProbeSpec> = Array::with_max_entries(MAX_PROBES, 0);

/// Thread-group ids being traced: the command, its descendants, or `-p` targets.
#[map]
pub static TRACED: HashMap<u32, u32> = HashMap::with_max_entries(16384, 0);

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
/// Offset of `group_dead` in sched_process_exit, 0 where the kernel lacks the field.
#[unsafe(no_mangle)]
static EXIT_GROUP_DEAD_OFF: u32 = 0;

#[inline(always)]
pub fn load_const(value: &'static u32) -> u32 {
    // Volatile: the loader rewrites .rodata, so the compiler must not fold the default.
    unsafe { core::ptr::read_volatile(value) }
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
pub fn exit_group_dead_off() -> u32 {
    load_const(&EXIT_GROUP_DEAD_OFF)
}

#[inline(always)]
pub fn is_traced(tgid: u32) -> bool {
    if trace_all() {
        // Until the loader marks tracing stopped (the one lookup --all makes).
        return unsafe { TRACED.get(&TRACED_STOP_KEY) }.is_none();
    }
    unsafe { TRACED.get(&tgid) }.is_some()
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
