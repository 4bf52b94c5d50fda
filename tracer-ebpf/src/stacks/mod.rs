//! Python stacks (`run --stacks`): at the entry of a call whose probe has
//! `cookie::STACKS`, the call program hands the call to these programs by tail calls, which
//! send the calling thread's Python stack before anything else of the call:
//!
//! - `stack_walk` (`walk.rs`) finds the thread's `PyThreadState` in the interpreter's
//!   thread list by its `fs` base (cached per thread), and reads its frames, one read each;
//!   a stack seen before in this process image is sent as its hash alone;
//! - `stack_codes` (`codes.rs`) names each frame's code object by the record that read it,
//!   checking that the address was not reused by another code object since;
//! - `stack_capture` (`codes.rs`) reads the new code objects (names, first line, line
//!   table) into their own records, then sends the stack with its frames.
//!
//! Their state between tail calls is a per-CPU scratch value (`STACK_SCRATCH`). Nothing
//! here runs unless the loader filled `STACK_PROGS`, which it does for `--stacks` only.

mod budget;
mod codes;
mod rate;
mod read;
mod walk;

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::generated,
    macros::{map, uprobe},
    maps::{HashMap, LruHashMap, PerCpuArray, ProgramArray},
    programs::ProbeContext,
};
use tracer_common::{
    CallEvent, ProbeSpec, SLOT_MASK, flags,
    stacks::{
        MAX_STACK_FRAMES, PyProcess, RawPyFrame, StackEvent, StackRef, py_flags, stack_counter,
        stack_prog, stack_status,
    },
};

use crate::maps::{EVENTS, SPECS, submit_flags};
use read::Buf;

/// Each traced Python process's interpreter layout, by process id (the loader's pid
/// namespace): set by the loader, copied to a fork child, dropped at exec and exit.
#[map]
pub static PYPROC: HashMap<u32, PyProcess> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// The stack programs, by `stack_prog` index, for the call programs loaded by aya (perf
/// links). The uprobe_multi copies of the programs use `STACK_PROGS_MULTI` in its place
/// (the kernel lets a program tail-call only programs of its own attach type).
#[map]
pub static STACK_PROGS: ProgramArray = ProgramArray::with_max_entries(stack_prog::COUNT, 0);
#[map]
pub static STACK_PROGS_MULTI: ProgramArray = ProgramArray::with_max_entries(stack_prog::COUNT, 0);

/// A thread's thread state as last found: valid while the process image
/// (`generation`) and the interpreter's thread-creation counter (`epoch`) are unchanged.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ThreadSeen {
    pub generation: u64,
    pub epoch: u64,
    /// 0: the thread has none.
    pub tstate: u64,
    /// Where a read of the thread's C stack found its end (the first page after it), 0
    /// until one did: windows read up stop there (`walk.rs`, `read_up`).
    pub up_ceiling: u64,
    /// The highest end of an entry frame any walk of this thread read from its C stack, 0
    /// before one did: a window read up stops there too, where that still holds the frame
    /// asked for (`UP_REACH`). Reading more would copy bytes no walk has needed; a deeper
    /// stack later costs one read more, and raises it.
    pub up_reach: u64,
}

#[map]
static THREADS_SEEN: LruHashMap<u32, ThreadSeen> = LruHashMap::with_max_entries(16384, 0);

/// A stack by its hash in a process image.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackKey {
    pub generation: u64,
    pub hash: [u64; 2],
}

/// Stacks whose frames were sent (and reached the ring): later calls send the hash alone.
#[map]
static STACKS_SEEN: LruHashMap<StackKey, u32> = LruHashMap::with_max_entries(32768, 0);

/// A code object by its address in a process image.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CodeKey {
    pub generation: u64,
    pub code: u64,
}

/// The code object read at that address, by its identity, and its record's id.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CodeSeen {
    pub ident: u64,
    pub capture: u64,
}

#[map]
static CODES_SEEN: LruHashMap<CodeKey, CodeSeen> = LruHashMap::with_max_entries(65536, 0);

/// Where `py_code_freed` counts (`py_flags::FREE_PROBE`): the code objects of the stacks
/// known by their hash, by address in a process image. Freeing one of them moves the
/// process's count, so every stack known under the old count is read again; freeing any
/// other code object (the many a program compiles, evaluates and drops) moves nothing. A
/// stack is known only once each of its code objects is here (a full map leaves it
/// unknown); the loader removes a process image's entries when it exits.
#[map]
pub static KNOWN_CODES: HashMap<CodeKey, u32> =
    HashMap::with_max_entries(tracer_common::stacks::KNOWN_CODES_MAX, 0);

/// What `stack_threads` looks for: the calling thread's state in the list from `head`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Search {
    pub head: u64,
    pub fsbase: u64,
    pub interp: u64,
    pub epoch: u64,
}

/// A call's walk between tail calls.
#[repr(C)]
pub struct Scratch {
    pub tgid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    /// 1: `call` is an entry-only call, sent after its stack.
    pub has_call: u32,
    /// The walk has found the thread's first frame (later runs continue at `frame`).
    pub started: u32,
    /// Not 0: `--stack-every`'s draw ([`stack_status::SAMPLED_OUT`]) or `--stack-rate`
    /// ([`stack_status::RATE_LIMITED`]) left the call out, the status to send; walked only
    /// to learn why it could have no stack, it stops once the thread's state is found.
    pub drawn_out: u32,
    pub _pad: u32,
    pub call: CallEvent,
    pub frame: u64,
    pub search: Search,
    /// 3.13+: the interpreter's code epoch at the walk.
    pub code_epoch: u64,
    /// Frames read, kept or skipped.
    pub walked: u32,
    /// Frames to resolve, next one to (`stack_codes`, `stack_capture`).
    pub todo: u32,
    pub next: u32,
    /// 1: a code object of this stack could not be read whole (read again next time).
    pub incomplete: u32,
    /// 1: the loader waits for this process's first stack record to link `py_code_freed`
    /// (`py_flags::FREE_PENDING`): the record wakes it.
    pub wake: u32,
    /// 1: this walk found `up_ceiling` (kept in the per-thread cache after the frames).
    pub ceiling_found: u32,
    pub buf: Buf,
    pub fingerprint: Buf,
    /// 3.11+: the process's memory at `window_start`, `window_len` bytes (0: none yet),
    /// read below a frame in one piece: its callers' frames lie there, in the thread's
    /// data stack (`walk.rs`, `read_frame`). On 3.10, or where a window could not be read,
    /// the one frame read.
    pub window_start: u64,
    pub window_len: u64,
    /// 3.12+: the thread's current data-stack chunk, from its start to the top of its
    /// frames (`datastack_top`), as the thread state said at this walk (0, 0: unknown): all
    /// of it mapped and written, so a window of a frame there may reach below its page.
    pub chunk_start: u64,
    pub chunk_top: u64,
    /// 3.12+: the process's memory at `up_start`, `up_len` bytes (0: none yet), read above
    /// an entry frame on the C stack in one piece: outer calls' entry frames lie there.
    pub up_start: u64,
    pub up_len: u64,
    /// The thread's `ThreadSeen::up_ceiling`, as this walk knows it.
    pub up_ceiling: u64,
    /// The thread's `ThreadSeen::up_reach` at this walk's start (0 with `UP_REACH` off).
    pub up_reach: u64,
    /// The highest end of an entry frame this walk read from the C stack.
    pub up_used: u64,
    /// The thread's stack pointer at the call: 3.12+'s entry frames lie above it, on the C
    /// stack, and data-stack frames do not (`walk.rs`, `read_frame`).
    pub sp: u64,
    /// The two windows' bytes (`read::Windows`: the data stack's, then the C stack's).
    pub windows: read::Windows,
    /// Indexes in `frames` of the frames whose code object was not seen.
    pub todo_frames: [u16; MAX_STACK_FRAMES],
    /// Sent as one record: the event, then its frames.
    pub event: StackEvent,
    pub frames: [RawPyFrame; MAX_STACK_FRAMES],
}

impl Scratch {
    /// Frame `index`, masked into the array (the verifier sees it bounded).
    #[inline(always)]
    pub fn frame(&mut self, index: u64) -> &mut RawPyFrame {
        let index = read::mask::<{ (MAX_STACK_FRAMES - 1) as u64 }>(index) as usize;
        // SAFETY: masked below MAX_STACK_FRAMES.
        unsafe { self.frames.get_unchecked_mut(index) }
    }

    /// Entry `slot` of the frames left to resolve, masked likewise.
    #[inline(always)]
    pub fn todo(&mut self, slot: u64) -> &mut u16 {
        let slot = read::mask::<{ (MAX_STACK_FRAMES - 1) as u64 }>(slot) as usize;
        // SAFETY: masked below MAX_STACK_FRAMES.
        unsafe { self.todo_frames.get_unchecked_mut(slot) }
    }
}

#[map]
static STACK_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Per-CPU counter of the ids of code records (the CPU number in the low 12 bits).
#[map]
static CAPTURE_IDS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[map]
static STACK_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stack_counter::COUNT, 0);

/// The offset of `thread.fsbase` in `task_struct`, from the kernel's BTF (0: unknown).
#[unsafe(no_mangle)]
static FSBASE_OFF: u32 = 0;
/// The frame budget (`--stack-depth`).
#[unsafe(no_mangle)]
static STACK_DEPTH: u32 = tracer_common::stacks::DEFAULT_STACK_DEPTH;
/// A call walks its stack with a chance of 1 in N (`--stack-every`).
#[unsafe(no_mangle)]
static STACK_EVERY: u32 = 1;
/// 1: on 3.12, the thread's `_PyCFrame` is read with the C stack above it, where its
/// entry frame lies (0: the cframe's pointer alone, `CUDATRACE_STACKS_NO_CFRAME_WINDOW`).
#[unsafe(no_mangle)]
static CFRAME_WINDOW: u32 = 1;
/// Bytes a data-stack window reaches below the end of its frame (at most, and by default,
/// 2 [`read::WINDOW`] less a frame's read; `CUDATRACE_STACKS_DATA_WINDOW`, for measuring).
/// Below the frame's own page only within the thread's current data-stack chunk
/// ([`DATA_CHUNK`]); elsewhere a window stops at the page.
#[unsafe(no_mangle)]
static DATA_WINDOW: u32 = (2 * read::WINDOW - tracer_common::stacks::FRAME_READ) as u32;

/// 1: a data-stack window of a frame in the thread's current chunk reaches below the
/// frame's page, down to the chunk's start (0: `CUDATRACE_STACKS_NO_DATA_CHUNK`, each
/// window stops at its page, for measuring what that saves).
#[unsafe(no_mangle)]
static DATA_CHUNK: u32 = 1;

/// 1: a stack the probes knew goes in its call's own record (0:
/// `CUDATRACE_STACKS_NO_CALL_REF`, a stack record of its own, for measuring what that
/// saves).
#[unsafe(no_mangle)]
static CALL_REF: u32 = 1;

#[inline(always)]
fn call_ref_on() -> bool {
    crate::maps::load_const(&CALL_REF) != 0
}

#[inline(always)]
fn data_chunk_on() -> bool {
    crate::maps::load_const(&DATA_CHUNK) != 0
}
/// Bytes a C-stack window reads from an entry frame up (at most, and by default, 2
/// [`read::WINDOW`] less a frame's read, at least a frame's read;
/// `CUDATRACE_STACKS_UP_WINDOW`, for measuring). 8 KiB rather than 4: GPT-2's entry frames
/// (one per `nn.Module` call, about 750 bytes apart) take one read fewer a call, and the
/// stack's end (`UP_CEILING`) keeps a shallow stack's window from faulting past it.
#[unsafe(no_mangle)]
static UP_WINDOW: u32 = (2 * read::WINDOW - tracer_common::stacks::FRAME_READ) as u32;

/// 1: a C-stack window stops at the end of the thread's stack where a read found it (0:
/// `CUDATRACE_STACKS_NO_UP_CEILING`, for measuring what that saves).
#[unsafe(no_mangle)]
static UP_CEILING: u32 = 1;

#[inline(always)]
fn up_ceiling_on() -> bool {
    crate::maps::load_const(&UP_CEILING) != 0
}

/// 1: a C-stack window stops where the thread's walks have needed frames so far
/// (`ThreadSeen::up_reach`; 0: `CUDATRACE_STACKS_NO_UP_REACH`, for measuring). A shallow
/// stack's 8 KiB windows copied 7 KiB nobody read: 0.2 µs of a launch loop's 1.37 on the
/// H100 (run AS).
#[unsafe(no_mangle)]
static UP_REACH: u32 = 1;

#[inline(always)]
fn up_reach_on() -> bool {
    crate::maps::load_const(&UP_REACH) != 0
}

#[inline(always)]
fn data_window() -> u64 {
    u64::from(crate::maps::load_const(&DATA_WINDOW))
}

#[inline(always)]
fn up_window() -> u64 {
    u64::from(crate::maps::load_const(&UP_WINDOW))
}

#[inline(always)]
fn cframe_window() -> bool {
    crate::maps::load_const(&CFRAME_WINDOW) != 0
}

#[inline(always)]
fn fsbase_offset() -> u32 {
    crate::maps::load_const(&FSBASE_OFF)
}

#[inline(always)]
fn stack_depth() -> u32 {
    crate::maps::load_const(&STACK_DEPTH)
}

/// Whether this call walks its stack: 1 in N at random (N: `--stack-every`), drawn at
/// each call, so that a loop's period cannot line up with the sampling and each line's
/// share of the samples is an unbiased estimate of its share of the calls. A draw per call
/// needs no state per thread, and threads are independent of each other.
#[inline(always)]
fn sampled_in() -> bool {
    let every = crate::maps::load_const(&STACK_EVERY);
    // The remainder's bias is at most N / 2^32 of a share (N <= 10^6): none to measure.
    every <= 1 || unsafe { generated::bpf_get_prandom_u32() } % every == 0
}

/// Whether thread `tid` is known to have a Python thread state (the walk's cache, in the
/// current process image): a call drawn out is then counted as sampled out at once.
/// Otherwise the walk goes as far as the thread state, so that a call that could have no
/// stack anyway is counted by that reason, not by sampling.
#[inline(always)]
fn has_thread_state(tgid: u32, tid: u32) -> bool {
    let Some(py) = PYPROC.get_ptr(tgid) else {
        return false;
    };
    // SAFETY: map values.
    match unsafe { THREADS_SEEN.get(tid) } {
        Some(seen) => seen.tstate != 0 && seen.generation == unsafe { (*py).generation },
        None => false,
    }
}

#[inline(always)]
fn bump(index: u32, amount: u64) {
    if let Some(count) = STACK_COUNTERS.get_ptr_mut(index) {
        // Per-CPU slot: no other writer.
        unsafe { *count += amount };
    }
}

/// A new id, unique in the run: code records, fork children's process images.
#[inline(always)]
pub fn unique_id() -> u64 {
    let cpu = u64::from(unsafe { generated::bpf_get_smp_processor_id() }) & 0xfff;
    let Some(counter) = CAPTURE_IDS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: a per-CPU slot.
    unsafe {
        *counter += 1;
        (*counter << 12) | cpu
    }
}

/// A traced process forked: the child has its parent's memory, so its interpreter too,
/// under a process image of its own (its code objects and stacks part from its parent's).
#[inline(always)]
pub fn inherit(parent: u32, child: u32) {
    let Some(py) = PYPROC.get_ptr(parent) else {
        return;
    };
    // Copied map value to map value (too large for the BPF stack); the child has not run
    // yet, so nothing reads it before its generation is set.
    if PYPROC.insert(child, unsafe { &*py }, 0).is_err() {
        return;
    }
    if let Some(copy) = PYPROC.get_ptr_mut(child) {
        // SAFETY: a map value.
        unsafe {
            (*copy).generation = (1 << 63) | unique_id();
            // The parent's probe on code frees is not the child's: the child reads
            // identities per frame until the loader attaches its own.
            (*copy).flags &=
                !(tracer_common::stacks::py_flags::FREE_PROBE | py_flags::FREE_PENDING);
            (*copy).code_frees = 0;
        }
    }
}

/// Whether the walk reads each frame's code identity (3.10 to 3.13 without a count of code
/// objects freed); otherwise the count stands for them, and `stack_codes` reads them for a
/// stack not seen before.
#[inline(always)]
pub fn ident_per_frame(py: &PyProcess) -> bool {
    py.flags & py_flags::IDENT_PER_FRAME != 0 && py.flags & py_flags::FREE_PROBE == 0
}

/// At `PyCode_Type`'s deallocator, attached for one process (`py_flags::FREE_PROBE`): a
/// code object is about to be freed, so an address the caches know may name another code
/// object from now on. Counted before the memory is freed, so a walk that finds a new code
/// object at an old address always reads the new count.
#[uprobe]
pub fn py_code_freed(ctx: ProbeContext) -> u32 {
    let Some((tgid, _)) = crate::maps::current_ids() else {
        return 0;
    };
    let Some(py) = PYPROC.get_ptr_mut(tgid) else {
        return 0;
    };
    // `tp_dealloc(PyObject *self)`: the code object.
    let Some(code) = ctx.arg::<u64>(0) else {
        return 0;
    };
    // SAFETY: a map value.
    let key = CodeKey {
        generation: unsafe { (*py).generation },
        code,
    };
    if unsafe { KNOWN_CODES.get(&key) }.is_some() {
        // Other CPUs may count at once.
        crate::maps::atomic_add(unsafe { &raw mut (*py).code_frees }, 1);
        let _ = KNOWN_CODES.remove(&key);
    }
    0
}

/// A traced process exec'd or exited: its interpreter is gone.
#[inline(always)]
pub fn forget(tgid: u32) {
    let _ = PYPROC.remove(tgid);
}

/// Thread `tid` of a traced process exited: its cached thread state and its `--stack-rate`
/// bucket go, so a thread that later gets the same tid starts afresh (a cached thread
/// state of the dead thread would make a C thread's call "no Python frames" instead of
/// "no thread state").
#[inline(always)]
pub fn thread_exited(tid: u32) {
    let _ = THREADS_SEEN.remove(&tid);
    rate::forget(tid);
}

/// From a call program, at a call's entry: hands the call to the stack programs, which
/// send its stack and then `call` (an entry-only call) themselves. Returns only when they
/// could not be reached (no `--stacks`, the tail call failed, or `--stack-every` or
/// `--stack-rate` skips this call): the caller sends `call`, with the flags returned
/// ([`flags::STACK_SAMPLED_OUT`] or [`flags::STACK_RATE_LIMITED`] for a call skipped, so
/// that userspace does not take its missing stack record for a lost one).
#[inline(always)]
pub fn start(
    ctx: &ProbeContext,
    (tgid, tid): (u32, u32),
    ts_ns: u64,
    probe_id: u32,
    call: Option<&CallEvent>,
) -> u32 {
    // `--stack-every` and `--stack-rate` are not given together: one of them decides.
    let left_out = if !sampled_in() {
        stack_status::SAMPLED_OUT
    } else if !rate::admitted(tid, ts_ns) {
        stack_status::RATE_LIMITED
    } else {
        0
    };
    if left_out != 0 && has_thread_state(tgid, tid) {
        return if left_out == stack_status::SAMPLED_OUT {
            flags::STACK_SAMPLED_OUT
        } else {
            flags::STACK_RATE_LIMITED
        };
    }
    let Some(scratch) = STACK_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch value.
    let scratch = unsafe { &mut *scratch };
    scratch.tgid = tgid;
    scratch.tid = tid;
    scratch.ts_ns = ts_ns;
    scratch.started = 0;
    scratch.drawn_out = left_out;
    scratch.has_call = 0;
    scratch.wake = 0;
    scratch.event.flags = 0;
    scratch.event.nframes = 0;
    // Not a memset call (`zero.rs`).
    let zero = crate::zero::opaque();
    scratch.event.hash = [zero; 2];
    scratch.event.generation = zero;
    if let Some(call) = call {
        scratch.call = *call;
        scratch.has_call = 1;
    }
    scratch.event.probe_id = probe_id;
    tail_call(ctx, stack_prog::WALK);
    scratch.has_call = 0;
    0
}

/// Tail-calls the stack program `index` of this program's kind; returns if that failed.
#[inline(always)]
fn tail_call(ctx: &ProbeContext, index: u32) {
    // The uprobe_multi copies are relocated to STACK_PROGS_MULTI by the loader.
    unsafe { STACK_PROGS.tail_call(ctx, index) };
}

/// This CPU's scratch, if it still holds the current thread's call (a program preempted
/// mid-walk by another thread's on this CPU would find it overwritten: counted, dropped).
#[inline(always)]
fn scratch_of_current() -> Option<&'static mut Scratch> {
    let scratch = unsafe { &mut *STACK_SCRATCH.get_ptr_mut(0)? };
    let (_, tid) = crate::maps::current_ids()?;
    if scratch.tid != tid {
        bump(stack_counter::CLOBBERED, 1);
        return None;
    }
    Some(scratch)
}

/// Sends the stack record (its frames too unless `known`), then the entry-only call the
/// walk carried. Returns whether the stack record reached the ring.
///
/// The call starts now, after its walk: its entry time (in its pending frame, or in the
/// entry-only call carried here) and its stack record's become this moment's, so that a
/// walked call's duration leaves the walk out, as a call sampling skipped has none. The
/// record and the call line still pair by the same time.
///
/// A stack the probes knew goes with its call instead, in the call's own record
/// (`CallStackEvent`, [`CALL_REF`]): one ring record a call fewer. Not where the loader
/// waits for this process's first stack record (`wake`: that record wakes it) or where
/// the call's probe captures memory (its record is of another kind).
#[inline(always)]
fn send(scratch: &mut Scratch, status: u32, flags: u32, known: bool) -> bool {
    let now = unsafe { generated::bpf_ktime_get_ns() };
    let entered = scratch.ts_ns;
    scratch.ts_ns = now;
    let carry = known
        && status == tracer_common::stacks::stack_status::OK
        && scratch.wake == 0
        && call_ref_on()
        && SPECS
            .get(scratch.event.probe_id & SLOT_MASK)
            .is_some_and(|spec| spec.capture == tracer_common::capture::NONE);
    let stack = StackRef {
        generation: scratch.event.generation,
        hash: scratch.event.hash,
        flags: scratch.event.flags | flags,
        _pad: 0,
    };
    if scratch.has_call != 0 {
        scratch.call.header.ts_ns = now;
        if carry {
            scratch.has_call = 0;
            if let Some(spec) = SPECS.get(scratch.call.probe_id & SLOT_MASK) {
                let _ = emit_stacked(scratch.call, &stack, spec);
            }
            return true;
        }
    } else if crate::maps::restamp_entry(scratch.tid, entered, now, carry.then_some(&stack)) {
        return true;
    }
    let event = &mut scratch.event;
    event.header.kind = tracer_common::kind::STACK;
    event.header.flags = 0;
    event.header.ts_ns = scratch.ts_ns;
    event.header.pid = scratch.tgid;
    event.header.tid = scratch.tid;
    event.status = status;
    event.flags |= flags;
    if known || status != tracer_common::stacks::stack_status::OK {
        event.nframes = 0;
    }
    let frames = read::mask::<{ (MAX_STACK_FRAMES * 2 - 1) as u64 }>(u64::from(event.nframes));
    let frames = if frames > MAX_STACK_FRAMES as u64 {
        MAX_STACK_FRAMES as u64
    } else {
        frames
    };
    let len = size_of::<StackEvent>() as u64 + frames * size_of::<RawPyFrame>() as u64;
    // SAFETY: `event` and `frames` are contiguous in the scratch value (repr(C), no
    // padding between them) and `len` covers no more than both.
    let sent = unsafe {
        generated::bpf_ringbuf_output(
            core::ptr::from_ref(&EVENTS).cast_mut().cast(),
            core::ptr::from_mut(event).cast(),
            len,
            // Only a stack the walk found: the loader links at the first of those.
            if scratch.wake != 0 && status == tracer_common::stacks::stack_status::OK {
                u64::from(aya_ebpf::bindings::BPF_RB_FORCE_WAKEUP)
            } else {
                submit_flags()
            },
        )
    } == 0;
    if !sent {
        bump(stack_counter::RING_FULL, 1);
    }
    if scratch.has_call != 0 {
        scratch.has_call = 0;
        if let Some(spec) = SPECS.get(scratch.call.probe_id & SLOT_MASK) {
            let _ = crate::call_event::emit(scratch.call, spec);
        }
    }
    sent
}

/// Writes `call` with the name of the stack the probes knew for it, in one record
/// ([`CallStackEvent`]). The stack programs give a call its stack this way only where its
/// spec captures nothing; otherwise (a spec changed meanwhile) the stack's record goes
/// first, then the call as [`crate::call_event::emit`] writes it.
#[inline(always)]
pub fn emit_stacked(call: CallEvent, stack: &StackRef, spec: &ProbeSpec) -> Option<()> {
    if spec.capture != tracer_common::capture::NONE {
        send_known(&call, stack);
        return crate::call_event::emit(call, spec);
    }
    let Some(mut entry) = EVENTS.reserve::<tracer_common::stacks::CallStackEvent>(0) else {
        crate::maps::bump(tracer_common::counter::RING_FULL);
        return None;
    };
    let out = entry.as_mut_ptr();
    // Word by word: a struct copy between two pointers LLVM cannot tell apart is a call
    // to `memmove` (`zero.rs` says why such calls are kept off a call's path).
    let (generation, hash, stack_flags) = (stack.generation, stack.hash, stack.flags);
    // SAFETY: the reservation holds a whole CallStackEvent.
    unsafe {
        (*out).call = call;
        (*out).call.header.kind = tracer_common::kind::CALL_STACK;
        (*out).stack.generation = generation;
        (*out).stack.hash[0] = core::ptr::read_volatile(&hash[0]);
        (*out).stack.hash[1] = core::ptr::read_volatile(&hash[1]);
        (*out).stack.flags = stack_flags;
        (*out).stack._pad = 0;
    }
    entry.submit(submit_flags());
    Some(())
}

/// The record a known stack sends on its own, for a call that carried it to its return but
/// whose probe captures memory after all: the stack first, then the call.
#[inline(always)]
fn send_known(call: &CallEvent, stack: &StackRef) {
    let Some(mut entry) = EVENTS.reserve::<StackEvent>(0) else {
        bump(stack_counter::RING_FULL, 1);
        return;
    };
    let out = entry.as_mut_ptr();
    // SAFETY: the reservation holds a whole StackEvent.
    unsafe {
        (*out).header = call.header;
        (*out).header.kind = tracer_common::kind::STACK;
        (*out).header.flags = 0;
        (*out).generation = stack.generation;
        // Word by word, not a call to `memmove` (see `emit_stacked`).
        (*out).hash[0] = core::ptr::read_volatile(&stack.hash[0]);
        (*out).hash[1] = core::ptr::read_volatile(&stack.hash[1]);
        (*out).status = stack_status::OK;
        (*out).flags = stack.flags;
        (*out).nframes = 0;
        (*out).probe_id = call.probe_id;
    }
    entry.submit(submit_flags());
}
