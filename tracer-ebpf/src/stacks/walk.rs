//! `stack_walk`: the calling thread's `PyThreadState`, found in the interpreter's thread
//! list by the thread's `fs` base (x86-64: its `pthread_self()`, which CPython stores as
//! `thread_id`) and from 3.11 its tid (`native_thread_id`; on arm64 the tid alone, see
//! `is_thread`); then its frames, one read each,
//! [`FRAMES_PER_WALK`] per run, continued by a tail call to itself.
//!
//! CPython's own "current thread state" is not used: at a driver call the thread has
//! usually released the GIL (PyTorch does around its calls), and then it names another
//! thread or none.

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::arch::TARGET;
use tracer_common::stacks::{
    FINGERPRINT_LEN, FRAME_READ, FRAMES_PER_WALK, INTERP_READ, MAX_STACK_FRAMES, MAX_THREAD_STATES,
    NO_FIELD, PyProcess, TSTATE_READ, py_flags, stack_counter, stack_flags, stack_prog,
    stack_status,
};

use super::{
    PYPROC, STACKS_SEEN, Scratch, Search, StackKey, THREADS_SEEN, ThreadSeen,
    budget::kept_frame_beyond,
    bump, cframe_window, fsbase_offset,
    read::{Buf, UP, WINDOW, mask, read_user, user_u32, user_u64},
    scratch_of_current, send, stack_depth, tail_call,
};

/// A measuring build's cut (BENCHMARKS.md, "where a stacked call's time goes"): set by
/// `CUDATRACE_EBPF_CUT` when the probes are built, the walk stops after that step and
/// sends its record as a call without Python frames. 0, no cut, in every other build.
const CUT: u8 = match option_env!("CUDATRACE_EBPF_CUT") {
    Some(step) if !step.is_empty() => step.as_bytes()[0].wrapping_sub(b'0'),
    _ => 0,
};

/// The steps a measuring build can stop after ([`CUT`]).
mod cut {
    /// The hand-off: the draw, the scratch, the tail call, the record sent.
    pub const HAND_OFF: u8 = 1;
    /// The thread's state and first frame.
    pub const THREAD: u8 = 2;
    /// The frames, without the lookup of the stack by its hash.
    pub const FRAMES: u8 = 3;
}

#[uprobe]
pub fn stack_walk(ctx: ProbeContext) -> u32 {
    walk_program::<false>(ctx)
}

/// The walk of a process whose frames' code identities are read one by one
/// ([`super::ident_per_frame`]): `stack_walk` hands it over here.
#[uprobe]
pub fn stack_walk_ident(ctx: ProbeContext) -> u32 {
    walk_program::<true>(ctx)
}

#[inline(always)]
fn walk_program<const IDENT: bool>(ctx: ProbeContext) -> u32 {
    let Some(scratch) = scratch_of_current() else {
        return 0;
    };
    let (status, flags, known) = walk::<IDENT>(&ctx, scratch);
    send(scratch, status, flags, known);
    0
}

/// The walk, to the record to send (status, flags, whether the stack is known), unless a
/// tail call carries it on. `IDENT`: each frame's code identity is read.
#[inline(always)]
fn walk<const IDENT: bool>(ctx: &ProbeContext, scratch: &mut Scratch) -> (u32, u32, bool) {
    let Some(py) = PYPROC.get_ptr(scratch.tgid) else {
        return (stack_status::NO_INTERPRETER, 0, false);
    };
    // SAFETY: a map value; the loader writes it before the process runs on.
    let py = unsafe { &*py };
    if CUT == cut::HAND_OFF {
        return (stack_status::NO_FRAMES, 0, false);
    }
    if py.flags & py_flags::FREE_PENDING != 0 {
        scratch.wake = 1;
    }
    if scratch.started == 0 {
        scratch.sp = crate::regs::stack_pointer(ctx);
        match first_frame(scratch, py) {
            // Drawn out, with a thread state: it could have had a stack.
            Ok(true) if scratch.drawn_out != 0 => return (scratch.drawn_out, 0, false),
            Ok(true) if CUT == cut::THREAD => return (stack_status::NO_FRAMES, 0, false),
            Ok(true) => {
                scratch.started = 1;
                if !IDENT && super::ident_per_frame(py) {
                    // The frames are walked by the program that reads their identities.
                    tail_call(ctx, stack_prog::WALK_IDENT);
                    return (
                        stack_status::READ_FAULT,
                        stack_flags::TAIL_CALL_FAILED,
                        false,
                    );
                }
            }
            Ok(false) => {
                // Not in the per-thread cache: look through the thread list, then again.
                tail_call(ctx, stack_prog::THREADS);
                return (
                    stack_status::NO_THREAD_STATE,
                    stack_flags::TAIL_CALL_FAILED,
                    false,
                );
            }
            Err(status) => return (status, 0, false),
        }
    }
    let walked = walk_frames::<IDENT>(scratch, py);
    keep_ceiling(scratch);
    let flags = match walked {
        Walked::Status(status) => return (status, 0, false),
        Walked::More => {
            tail_call(
                ctx,
                if IDENT {
                    stack_prog::WALK_IDENT
                } else {
                    stack_prog::WALK
                },
            );
            // The kernel's limit of tail calls: what was read is the stack, cut.
            stack_flags::CUT | stack_flags::TAIL_CALL_FAILED
        }
        Walked::Done { cut } => {
            if cut {
                stack_flags::CUT
            } else {
                0
            }
        }
    };
    if scratch.event.nframes == 0 || CUT == cut::FRAMES {
        return (stack_status::NO_FRAMES, 0, false);
    }
    scratch.event.flags |= flags;
    // The cut flag is part of the stack's name.
    mix(scratch, u64::from(scratch.event.flags & stack_flags::CUT));
    let key = StackKey {
        generation: scratch.event.generation,
        hash: scratch.event.hash,
    };
    if unsafe { STACKS_SEEN.get(&key) }.is_some() {
        return (stack_status::OK, stack_flags::KNOWN, true);
    }
    scratch.todo = 0;
    scratch.next = 0;
    tail_call(ctx, stack_prog::CODES);
    // Unresolved frames: userspace says so.
    (stack_status::OK, stack_flags::TAIL_CALL_FAILED, false)
}

/// `stack_threads`: the calling thread's state in the interpreter's list, into the
/// per-thread cache (0: it has none); then the walk again, which finds it there.
#[uprobe]
pub fn stack_threads(ctx: ProbeContext) -> u32 {
    let Some(scratch) = scratch_of_current() else {
        return 0;
    };
    let status = search(scratch);
    if status == stack_status::OK {
        tail_call(&ctx, stack_prog::WALK);
    }
    send(scratch, status, 0, false);
    0
}

#[inline(always)]
fn search(scratch: &mut Scratch) -> u32 {
    let Some(py) = PYPROC.get_ptr(scratch.tgid) else {
        return stack_status::NO_INTERPRETER;
    };
    // SAFETY: a map value.
    let py = unsafe { &*py };
    let search = scratch.search;
    let tstate = match find_thread(scratch, py, search.head, search.fsbase, search.interp) {
        Ok(tstate) => tstate,
        Err(status) => return status,
    };
    // The thread's stack has not moved since an earlier search in this image: its end
    // stands, and so does how far up its walks have read.
    let (up_ceiling, up_reach) = match unsafe { THREADS_SEEN.get(scratch.tid) } {
        Some(old) if old.generation == py.generation => (old.up_ceiling, old.up_reach),
        _ => (0, 0),
    };
    let seen = ThreadSeen {
        generation: py.generation,
        epoch: search.epoch,
        tstate,
        up_ceiling,
        up_reach,
    };
    if THREADS_SEEN.insert(scratch.tid, seen, 0).is_err() {
        return stack_status::NO_THREAD_STATE;
    }
    stack_status::OK
}

/// Folds `word` into the stack's two hashes.
#[inline(always)]
fn mix(scratch: &mut Scratch, word: u64) {
    let [a, b] = scratch.event.hash;
    let a = (a ^ word).wrapping_mul(0x0000_0100_0000_01b3);
    let b = (b.wrapping_add(word.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .rotate_left(31)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
    scratch.event.hash = [a, b];
}

/// The thread's state and its current frame, into the scratch: the walk's first run.
/// `Ok(false)`: the per-thread cache cannot say which thread state is the thread's (the
/// search's inputs are in the scratch).
#[inline(always)]
fn first_frame(scratch: &mut Scratch, py: &PyProcess) -> Result<bool, u32> {
    let fsbase_off = fsbase_offset();
    if fsbase_off == 0 {
        return Err(stack_status::NO_FSBASE);
    }
    let task = unsafe { bpf_get_current_task() };
    let fsbase: u64 =
        unsafe { bpf_probe_read_kernel((task + u64::from(fsbase_off)) as *const u64) }
            .map_err(|_| stack_status::NO_FSBASE)?;
    let interp = user_u64(py.runtime + u64::from(py.runtime_interpreters))
        .ok_or(stack_status::READ_FAULT)?;
    if interp == 0 {
        return Err(stack_status::NOT_INITIALIZED);
    }
    let buf = &mut scratch.buf;
    if !read_user(
        buf.0.as_mut_ptr(),
        INTERP_READ as u32,
        interp + u64::from(py.interp_read),
    ) {
        return Err(stack_status::READ_FAULT);
    }
    if buf.u64_at(py.interp_next.wrapping_sub(py.interp_read)) != 0 {
        return Err(stack_status::AMBIGUOUS);
    }
    let head = buf.u64_at(py.interp_threads.wrapping_sub(py.interp_read));
    let epoch_at = py.interp_thread_epoch.wrapping_sub(py.interp_read);
    let epoch = if epoch_at < (INTERP_READ - 8) as u32 {
        buf.u64_at(epoch_at)
    } else {
        user_u64(interp + u64::from(py.interp_thread_epoch)).ok_or(stack_status::READ_FAULT)?
    };
    scratch.code_epoch = 0;
    if py.flags & py_flags::FREE_PROBE != 0 {
        // SAFETY: a map value, counted up by `py_code_freed` on any CPU.
        scratch.code_epoch = unsafe { core::ptr::read_volatile(&py.code_frees) };
    } else if py.interp_code_epoch != NO_FIELD {
        let at = interp + u64::from(py.interp_code_epoch);
        scratch.code_epoch = if py.code_epoch_size == 8 {
            user_u64(at).ok_or(stack_status::READ_FAULT)?
        } else {
            u64::from(user_u32(at).ok_or(stack_status::READ_FAULT)?)
        };
    }

    let tid = scratch.tid;
    let Some(seen) = (unsafe { THREADS_SEEN.get(tid) }).copied() else {
        scratch.search = Search {
            head,
            fsbase,
            interp,
            epoch,
        };
        return Ok(false);
    };
    if seen.generation != py.generation || seen.epoch != epoch {
        scratch.search = Search {
            head,
            fsbase,
            interp,
            epoch,
        };
        return Ok(false);
    }
    if seen.tstate == 0 {
        // No thread state was created since none matched.
        return Err(stack_status::NO_THREAD_STATE);
    }
    let Some(mut frame) = thread_frame(scratch, py, seen.tstate, fsbase, interp)? else {
        // Freed and reused since: look again.
        scratch.search = Search {
            head,
            fsbase,
            interp,
            epoch,
        };
        let _ = THREADS_SEEN.remove(tid);
        return Ok(false);
    };
    scratch.window_len = 0;
    scratch.up_len = 0;
    scratch.up_ceiling = if super::up_ceiling_on() {
        seen.up_ceiling
    } else {
        0
    };
    scratch.ceiling_found = 0;
    scratch.up_reach = if super::up_reach_on() {
        seen.up_reach
    } else {
        0
    };
    scratch.up_used = 0;
    if py.cframe_frame != NO_FIELD {
        // 3.11, 3.12: the current frame hangs off the `_PyCFrame` on the C stack.
        let at = frame + u64::from(py.cframe_frame);
        frame = if py.owner_skip_from != NO_FIELD && cframe_window() {
            // 3.12: the cframe is a local of the interpreter's innermost C call, as is
            // that call's entry frame, just above it (112 bytes on pyenv's 3.12.1), and
            // the outer calls' entry frames lie further up: one read of the C stack
            // from the cframe up is the entry frames' first read, made now.
            if !read_up(scratch, at, at + 8) {
                return Err(stack_status::READ_FAULT);
            }
            scratch.windows.u64_at(UP)
        } else {
            user_u64(at).ok_or(stack_status::READ_FAULT)?
        };
    }
    scratch.frame = frame;
    scratch.walked = 0;
    scratch.event.nframes = 0;
    scratch.event.flags = 0;
    scratch.event.generation = py.generation;
    scratch.event.hash = [py.generation, scratch.code_epoch ^ 0x5bd1_e995];
    Ok(true)
}

/// Whether the thread state at `tstate`, read into the scratch, is the calling thread's.
#[inline(always)]
fn is_thread(buf: &Buf, py: &PyProcess, fsbase: u64, tid: u32, interp: u64) -> bool {
    let base = py.tstate_read;
    if buf.u64_at(py.tstate_interp.wrapping_sub(base)) != interp {
        return false;
    }
    if !TARGET.pthread_self_is_thread_pointer {
        // arm64: `thread_id` (pthread_self) is below the thread pointer by a size that
        // differs between glibc releases; the loader takes only interpreters with a
        // `native_thread_id` here (3.11+), and that alone tells the thread.
        return py.flags & py_flags::NATIVE_TID != 0
            && buf.u64_at(py.tstate_native_id.wrapping_sub(base)) == u64::from(tid);
    }
    if buf.u64_at(py.tstate_thread_id.wrapping_sub(base)) != fsbase {
        return false;
    }
    py.flags & py_flags::NATIVE_TID == 0
        || buf.u64_at(py.tstate_native_id.wrapping_sub(base)) == u64::from(tid)
}

/// The current frame (or cframe) of `tstate` if it is the calling thread's; `None` if it
/// is not (a cached one since freed and reused).
#[inline(always)]
fn thread_frame(
    scratch: &mut Scratch,
    py: &PyProcess,
    tstate: u64,
    fsbase: u64,
    interp: u64,
) -> Result<Option<u64>, u32> {
    let buf = &mut scratch.buf;
    if !read_user(
        buf.0.as_mut_ptr(),
        TSTATE_READ as u32,
        tstate + u64::from(py.tstate_read),
    ) {
        return Err(stack_status::READ_FAULT);
    }
    if !is_thread(buf, py, fsbase, scratch.tid, interp) {
        return Ok(None);
    }
    let frame = buf.u64_at(py.tstate_frame.wrapping_sub(py.tstate_read));
    if frame == 0 {
        return Err(stack_status::NO_FRAMES);
    }
    let (mut start, mut top) = (0, 0);
    if py.tstate_datastack != NO_FIELD && super::data_chunk_on() {
        start = buf.u64_at(py.tstate_datastack.wrapping_sub(py.tstate_read));
        top = buf.u64_at(py.tstate_datastack_top.wrapping_sub(py.tstate_read));
        // Not a chunk (a layout gone wrong): windows stop at their page.
        if top < start || top - start > MAX_CHUNK {
            (start, top) = (0, 0);
        }
    }
    scratch.chunk_start = start;
    scratch.chunk_top = top;
    Ok(Some(frame))
}

/// The calling thread's state in the list from `head`, or 0 when none is.
#[inline(always)]
fn find_thread(
    scratch: &mut Scratch,
    py: &PyProcess,
    head: u64,
    fsbase: u64,
    interp: u64,
) -> Result<u64, u32> {
    let mut tstate = head;
    let mut found = 0;
    for _ in 0..MAX_THREAD_STATES {
        if tstate == 0 {
            return Ok(found);
        }
        let buf = &mut scratch.buf;
        if !read_user(
            buf.0.as_mut_ptr(),
            TSTATE_READ as u32,
            tstate + u64::from(py.tstate_read),
        ) {
            return Err(stack_status::READ_FAULT);
        }
        if is_thread(buf, py, fsbase, scratch.tid, interp) {
            if found != 0 {
                return Err(stack_status::AMBIGUOUS);
            }
            found = tstate;
        }
        tstate = buf.u64_at(py.tstate_next.wrapping_sub(py.tstate_read));
    }
    // Thread states beyond the limit might match (too).
    Err(stack_status::TOO_MANY_THREADS)
}

enum Walked {
    Status(u32),
    /// Frames remain within the budget: continue in a tail call.
    More,
    Done {
        cut: bool,
    },
}

/// Reads up to [`FRAMES_PER_WALK`] frames from `scratch.frame` into `scratch.frames`, with
/// `IDENT` each frame's code identity too.
#[inline(always)]
fn walk_frames<const IDENT: bool>(scratch: &mut Scratch, py: &PyProcess) -> Walked {
    let depth = stack_depth();
    let per_frame_ident = IDENT;
    let mut frame = scratch.frame;
    let mut walked = 0u64;
    for _ in 0..FRAMES_PER_WALK {
        if frame == 0 {
            break;
        }
        let kept = scratch.event.nframes;
        if kept >= depth || kept as usize >= MAX_STACK_FRAMES {
            break;
        }
        let Some(at) = read_frame(scratch, py, frame) else {
            return Walked::Status(stack_status::READ_FAULT);
        };
        walked += 1;
        // The frame's fields, in place in the window that holds it.
        let base = at.wrapping_sub(u64::from(py.frame_read));
        let windows = &scratch.windows;
        let previous = windows.u64_at(base.wrapping_add(u64::from(py.frame_previous)));
        let owner = if py.frame_owner == NO_FIELD {
            0
        } else {
            u32::from(windows.u8_at(base.wrapping_add(u64::from(py.frame_owner))))
        };
        if owner >= py.owner_skip_from {
            // The interpreter's own entry frame: CPython skips it too.
            frame = previous;
            continue;
        }
        let code = windows.u64_at(base.wrapping_add(u64::from(py.frame_code))) & py.code_mask;
        let instr_at = base.wrapping_add(u64::from(py.frame_instr));
        let unit = if py.flags & py_flags::LASTI != 0 {
            windows.u32_at(instr_at) as i32
        } else {
            let instr = windows.u64_at(instr_at);
            let first = code.wrapping_add(u64::from(py.code_adaptive));
            ((instr.wrapping_sub(first) as i64) >> 1) as i32
        };
        let ident = if per_frame_ident {
            match identity(scratch, py, code) {
                Some(ident) => ident,
                None => return Walked::Status(stack_status::READ_FAULT),
            }
        } else {
            0
        };
        let slot = scratch.frame(u64::from(kept));
        slot.code = code;
        // Not a memset call a frame (`zero.rs`).
        slot.ident = ident | crate::zero::opaque();
        slot.capture = crate::zero::opaque();
        slot.unit = unit;
        slot.owner = owner;
        scratch.event.nframes = kept + 1;
        mix(scratch, code);
        if per_frame_ident {
            // Otherwise 0 in every frame (the count of code objects freed, in the hash's
            // seed, stands for the identities).
            mix(scratch, ident);
        }
        mix(scratch, (u64::from(owner) << 32) | u64::from(unit as u32));
        frame = previous;
    }
    bump(stack_counter::FRAMES, walked);
    scratch.frame = frame;
    if frame == 0 {
        return Walked::Done { cut: false };
    }
    if scratch.event.nframes >= depth || scratch.event.nframes as usize >= MAX_STACK_FRAMES {
        // The budget is spent: cut only if a frame to keep follows.
        return Walked::Done {
            cut: kept_frame_beyond(scratch, py, frame),
        };
    }
    Walked::More
}

/// Reads the frame at `frame` ([`FRAME_READ`] bytes from `frame_read`) into the scratch's
/// windows; returns where in them (`read::Windows`) those bytes start. From 3.11 most
/// frames need no read of their own: frames live in the thread's data stack, each caller
/// just below its callee, so a frame below the data-stack window and within [`WINDOW`] of
/// it (or the first) is read with the bytes below it in its page (at most [`WINDOW`]) in
/// one piece. 3.12+'s entry frames live on the C stack, which grows down: the entry frames
/// of outer calls lie above an inner one, so a frame above the data stack window is read
/// with the [`WINDOW`] bytes above it (only to its page's end where they are not all
/// mapped). Frames found in either window later cost no read, and no copy.
#[inline(always)]
fn read_frame(scratch: &mut Scratch, py: &PyProcess, frame: u64) -> Option<u64> {
    let at = frame + u64::from(py.frame_read);
    let end = at + FRAME_READ as u64;
    if py.flags & py_flags::LASTI != 0 {
        // 3.10: frame objects, each where the allocator put it.
        return read_alone(scratch, at);
    }
    let (start, len) = (scratch.window_start, scratch.window_len);
    if len != 0 && at >= start && end <= start + len {
        return Some(at - start);
    }
    let (up_start, up_len) = (scratch.up_start, scratch.up_len);
    if up_len != 0 && at >= up_start && end <= up_start + up_len {
        scratch.up_used = core::cmp::max(scratch.up_used, end);
        return Some(UP + (at - up_start));
    }
    if len == 0 || (at < start && start - at <= WINDOW as u64) || !on_c_stack(scratch, py, at) {
        // From the frame's own page only (a read that faults, the page below not mapped,
        // as below the data stack's first chunk, costs more than several reads), or in
        // the thread's current chunk from as far below as the window reaches, down to the
        // chunk's start: the frames there lie on pages the chunk holds, written as they
        // were pushed.
        let floor = data_floor(scratch, at, end);
        let from = core::cmp::max(end.saturating_sub(super::data_window()), floor);
        let bytes = mask::<{ 2 * WINDOW as u64 - 1 }>(end - from);
        if bytes > (2 * WINDOW - FRAME_READ) as u64
            || !read_user(scratch.windows.data(), bytes as u32, from)
        {
            return read_alone(scratch, at);
        }
        scratch.window_start = from;
        scratch.window_len = bytes;
        return Some(at - from);
    }
    if !read_up(scratch, at, end) {
        return read_alone(scratch, at);
    }
    scratch.up_used = core::cmp::max(scratch.up_used, end);
    Some(UP)
}

/// How far down a data-stack window of the frame at `at` (to `end`) may reach: the start
/// of the thread's current chunk where the frame lies in it, else the frame's page.
#[inline(always)]
fn data_floor(scratch: &Scratch, at: u64, end: u64) -> u64 {
    // Read from memory (as written), so that the verifier's states of the walk's loop do
    // not carry them.
    let start = unsafe { core::ptr::read_volatile(&scratch.chunk_start) };
    let top = unsafe { core::ptr::read_volatile(&scratch.chunk_top) };
    if start != 0 && at >= start && end <= top {
        start
    } else {
        at & !0xfff
    }
}

/// The largest data-stack chunk taken for one: CPython's are 16 KiB, or the size of a
/// frame that needs more.
const MAX_CHUNK: u64 = 1 << 30;

/// Whether the frame at `at` (not in either window) is one of 3.12+'s entry frames, on the
/// C stack: read up from it, where outer calls' entry frames lie; otherwise it is in the
/// data stack, read down. The C stack holds it if it lies above the call's stack pointer,
/// within [`C_STACK_SPAN`]. A frame far from the data window is not always on the C stack:
/// the caller of a chunk's first frame lies in the chunk before, anywhere (a stack of more
/// than about 16 KiB of frames), and the callers of an entry frame may lie more than a
/// window below the frames read last. Read up, each of their callers below them took a read
/// of its own (146 reads a call at 252 frames of recursion on 3.11, against 12). Where this
/// guesses wrong, the window still holds the frame: it costs reads, never exactness.
#[inline(always)]
fn on_c_stack(scratch: &Scratch, py: &PyProcess, at: u64) -> bool {
    // Read from memory (as written), so that the verifier's states of the walk's loop do
    // not carry them.
    let sp = unsafe { core::ptr::read_volatile(&scratch.sp) };
    py.owner_skip_from != NO_FIELD && at.wrapping_sub(sp) < C_STACK_SPAN
}

/// How far above the call's stack pointer an entry frame is looked for: the default
/// `RLIMIT_STACK` and glibc's default thread stack, 8 MiB.
const C_STACK_SPAN: u64 = 8 << 20;

/// Keeps the end of the thread's stack a read found in this walk, and how far up its
/// entry frames reached where that is further than before, with the thread's cached
/// state, for its later walks.
#[inline(always)]
fn keep_ceiling(scratch: &mut Scratch) {
    let reached = scratch.up_used;
    let further = reached > scratch.up_reach;
    if scratch.ceiling_found == 0 && !further {
        return;
    }
    if let Some(seen) = THREADS_SEEN.get_ptr_mut(scratch.tid) {
        // SAFETY: a map value; only this thread's walks write its entry.
        unsafe {
            if scratch.ceiling_found != 0 {
                (*seen).up_ceiling = scratch.up_ceiling;
            }
            if further && reached > (*seen).up_reach {
                (*seen).up_reach = reached;
            }
        }
    }
    scratch.ceiling_found = 0;
}

/// The frame's [`FRAME_READ`] bytes at `at` alone, as the data stack's window.
#[inline(always)]
fn read_alone(scratch: &mut Scratch, at: u64) -> Option<u64> {
    if !read_user(scratch.windows.data(), FRAME_READ as u32, at) {
        scratch.window_len = 0;
        return None;
    }
    scratch.window_start = at;
    scratch.window_len = FRAME_READ as u64;
    Some(0)
}

/// Reads the C stack from `at` up into the scratch's C-stack window: [`WINDOW`] bytes (a
/// thread's stack is mapped above its frames) but not past the thread's stack's end where a
/// read found it (`up_ceiling`), and at least to `end`. A read that faults, past the end,
/// is read again to the end of `at`'s page, and that page's end is the stack's end from
/// then on: a read that faults costs about ten that do not, and without the ceiling a walk
/// whose outermost entry frame lies within [`WINDOW`] of the stack's end (where the
/// kernel's random offset of the stack puts it, in some runs and not others) would fault
/// at every call. False (and no window) if the read failed.
#[inline(always)]
fn read_up(scratch: &mut Scratch, at: u64, end: u64) -> bool {
    let mut bytes = mask::<{ 2 * WINDOW as u64 - 1 }>(super::up_window());
    if bytes > (2 * WINDOW - FRAME_READ) as u64 || bytes < end - at {
        bytes = WINDOW as u64;
    }
    // Wraps past any window where there is no ceiling (0) or `at` is above it. Read from
    // memory at each frame (as it is written), so that the verifier's states of the walk's
    // loop do not carry it.
    let room = unsafe { core::ptr::read_volatile(&scratch.up_ceiling) }.wrapping_sub(at);
    if room < bytes {
        bytes = core::cmp::max(room, end - at);
    }
    // And where the thread's walks have needed frames so far (0, or below `at`: wraps past).
    let reach = unsafe { core::ptr::read_volatile(&scratch.up_reach) }.wrapping_sub(at);
    if reach < bytes {
        bytes = core::cmp::max(reach, end - at);
    }
    let mut bytes = mask::<{ 2 * WINDOW as u64 - 1 }>(bytes);
    if !read_user(scratch.windows.up(), bytes as u32, at) {
        let page_end = (at | 0xfff) + 1;
        bytes = mask::<{ 2 * WINDOW as u64 - 1 }>(core::cmp::max(page_end, end) - at);
        if bytes > (WINDOW + FRAME_READ) as u64
            || !read_user(scratch.windows.up(), bytes as u32, at)
        {
            scratch.up_len = 0;
            return false;
        }
        unsafe {
            core::ptr::write_volatile(&mut scratch.up_ceiling, page_end);
            core::ptr::write_volatile(&mut scratch.ceiling_found, 1);
        }
    }
    scratch.up_start = at;
    scratch.up_len = bytes;
    true
}

/// A code object's identity: `co_version` (3.12+), or on 3.10 and 3.11 a fingerprint of
/// its immutable fields (pointers to its own names, constants and tables, counts, first
/// line), which a new code object at the same address would not share.
#[inline(always)]
pub fn identity(scratch: &mut Scratch, py: &PyProcess, code: u64) -> Option<u64> {
    if py.flags & py_flags::FINGERPRINT == 0 {
        return user_u32(code + u64::from(py.code_ident)).map(u64::from);
    }
    let buf = &mut scratch.fingerprint;
    if !read_user(
        buf.0.as_mut_ptr(),
        FINGERPRINT_LEN as u32,
        code + u64::from(py.code_ident),
    ) {
        return None;
    }
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for word in 0..FINGERPRINT_LEN / 8 {
        let value = buf.u64_at((word * 8) as u32) & py.fingerprint_mask[word];
        hash = (hash ^ value).wrapping_mul(0x0000_0100_0000_01b3);
    }
    // 0 means "no identity"; a fingerprint never is.
    Some(hash | 1)
}
