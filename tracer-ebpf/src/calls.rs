//! The generic driver-call probes. Entry saves a frame per thread (time, arguments);
//! return pairs it, reads output parameters, and emits one event (`call_event.rs`): a
//! `CallEvent`, a `CallStringEvent` (a name or path, up to 4 KiB) or a `CallDataEvent`
//! (a struct or array), whichever the probe's spec captures.
//!
//! An entry-only probe (`cookie::ENTRY_ONLY`, `--launch-entry-only`) has no return probe:
//! its entry reads the memory and emits the event itself, flagged `NO_RETURN`, and keeps
//! no frame.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_attach_cookie, bpf_ktime_get_ns, bpf_probe_read_user},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    CallEvent, EventHeader, Frame, FrameStack, MAX_DEPTH, MAX_OUTS, SLOT_MASK,
    cookie as cookie_bits, counter, flags, kind,
};

const _: () = assert!(MAX_DEPTH.is_power_of_two());

use crate::{
    call_event::emit,
    identity,
    maps::{FRAMES, SPECS, ZERO_STACK, add, bump, current_ids, is_traced, stopped},
};

#[uprobe]
pub fn call_enter(ctx: ProbeContext) -> u32 {
    let _ = try_call_enter(&ctx);
    0
}

#[uretprobe]
pub fn call_return(ctx: RetProbeContext) -> u32 {
    let _ = try_call_return(&ctx);
    0
}

#[inline(always)]
fn thread_stack(tid: u32) -> Option<*mut FrameStack> {
    if let Some(stack) = FRAMES.get_ptr_mut(&tid) {
        return Some(stack);
    }
    let zero = ZERO_STACK.get(0)?;
    if FRAMES.insert(&tid, zero, BPF_NOEXIST as u64).is_err() {
        bump(counter::FRAMES_FULL);
        return None;
    }
    FRAMES.get_ptr_mut(&tid)
}

fn try_call_enter(ctx: &ProbeContext) -> Option<()> {
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    let (tgid, tid) = current_ids()?;
    let cookie = if identity::no_cookies() {
        // Per-symbol links only, in every process: the traced ones, then the probe at the
        // address it fired at (the verifier drops the other branch, and its helper).
        if !is_traced(tgid) {
            return None;
        }
        identity::cookie_at(tgid, crate::regs::instruction_pointer(ctx))?
    } else {
        let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
        // A per-process link fires for its traced process only: no lookup needed.
        let traced = if cookie & cookie_bits::PER_PROCESS != 0 {
            tgid != 0 && !stopped()
        } else {
            is_traced(tgid)
        };
        if !traced {
            return None;
        }
        cookie
    };
    bump(counter::ENTRIES);
    let probe_id = (cookie & cookie_bits::PROBE_ID) as u32;
    let entry = crate::regs::entry(
        ctx,
        cookie & cookie_bits::STACK_ARGS != 0,
        // The return address tells an abandoned frame (`drop_abandoned`); without a frame
        // it is not needed.
        cookie & cookie_bits::ENTRY_ONLY == 0,
    );
    let (args, read_failed) = (entry.args, entry.read_failed);
    let entry_flags = if read_failed {
        flags::ENTRY_READ_FAILED
    } else {
        0
    };
    if cookie & cookie_bits::ENTRY_ONLY != 0 {
        // No return will come: the whole event now, without a frame.
        let mut call = CallEvent {
            header: EventHeader {
                kind: kind::CALL,
                flags: entry_flags | flags::NO_RETURN,
                ts_ns,
                pid: tgid,
                tid,
            },
            probe_id,
            ret: 0,
            dur_ns: 0,
            args,
            outs: crate::zero::zeros::<MAX_OUTS>(),
        };
        if cookie & cookie_bits::STACKS != 0 {
            // The stack goes first, then the call; back here only if that could not be.
            call.header.flags |=
                crate::stacks::start(ctx, (tgid, tid), ts_ns, probe_id, Some(&call));
        }
        return emit(call, SPECS.get(probe_id & SLOT_MASK)?);
    }
    let stack = unsafe { &mut *thread_stack(tid)? };
    drop_abandoned(stack, entry.sp, entry.ret_addr);

    let depth = stack.depth;
    stack.depth = depth + 1;
    if depth as usize >= MAX_DEPTH {
        bump(counter::TOO_DEEP);
        return None;
    }
    let frame = stack.frames.get_mut(depth as usize)?;
    frame.probe_id = probe_id;
    frame.flags = entry_flags;
    frame.ts_ns = ts_ns;
    frame.sp = entry.sp;
    frame.ret_addr = entry.ret_addr;
    frame.args = args;
    // No stack carried yet (the walk may give it one).
    frame.stack.flags = 0;
    if cookie & cookie_bits::STACKS != 0 {
        // The call's stack, now: its record precedes the call's.
        frame.flags |= crate::stacks::start(ctx, (tgid, tid), ts_ns, probe_id, None);
    }
    Some(())
}

/// Drops pending calls that cannot still be running, so that a call left by `longjmp` (or
/// an exception thrown through the library) does not hold a nesting level for ever. The
/// stack grows down: a pending call entered with its return address below the current
/// stack pointer has been unwound. At the same stack pointer it is a call made again from
/// the same place (same return address); a tail call from the pending one into another
/// probed function would find the return probe's trampoline there instead, and is kept.
#[inline(always)]
fn drop_abandoned(stack: &mut FrameStack, sp: u64, ret_addr: u64) {
    let gone = |frame: &Frame| frame.sp < sp || (frame.sp == sp && frame.ret_addr == ret_addr);
    let mut dropped = 0u64;
    if stack.depth as usize > MAX_DEPTH {
        // Calls too deep to keep were entered inside the deepest kept one: if it is gone,
        // so are they (they were counted as lost when they entered).
        let deepest = &stack.frames[MAX_DEPTH - 1];
        if !gone(deepest) {
            return;
        }
        stack.depth = MAX_DEPTH as u32;
    }
    for _ in 0..MAX_DEPTH {
        let depth = stack.depth;
        if depth == 0 {
            break;
        }
        let Some(top) = stack.frames.get((depth as usize - 1) & (MAX_DEPTH - 1)) else {
            break;
        };
        if !gone(top) {
            break;
        }
        stack.depth = depth - 1;
        dropped += 1;
    }
    if dropped > 0 {
        add(counter::ABANDONED_FRAMES, dropped);
    }
}

fn try_call_return(ctx: &RetProbeContext) -> Option<()> {
    let now = unsafe { bpf_ktime_get_ns() };
    let (tgid, tid) = current_ids()?;
    // Only traced threads ever get a frame stack, so no filter is needed here.
    let stack = unsafe { &mut *FRAMES.get_ptr_mut(&tid)? };
    if stack.depth == 0 {
        bump(counter::UNMATCHED_RETURN);
        return None;
    }
    let depth = stack.depth - 1;
    if depth as usize >= MAX_DEPTH {
        // Too deep at entry: already counted there.
        stack.depth = depth;
        return None;
    }
    let found = if identity::no_cookies() {
        // No cookie: the frame is the one whose return this is, by its stack pointer.
        find_frame_by_sp(stack, depth, crate::regs::entry_sp_at_return(ctx))
    } else {
        let probe_id = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
        find_frame(stack, depth, probe_id).map(|level| (level, probe_id))
    };
    let Some((level, probe_id)) = found else {
        // A return without its entry (entry probe not yet attached): leave the stack alone.
        bump(counter::UNMATCHED_RETURN);
        return None;
    };
    if depth > level {
        // Calls entered inside this one that never returned (see `drop_abandoned`).
        add(counter::ABANDONED_FRAMES, u64::from(depth - level));
    }
    stack.depth = level;
    // Read back and masked: LLVM knows `level < MAX_DEPTH` and would drop a plain mask,
    // leaving the verifier an unbounded index.
    let index = unsafe { core::ptr::read_volatile(&stack.depth) } as usize & (MAX_DEPTH - 1);
    let frame = stack.frames.get(index)?;
    let spec = SPECS.get(probe_id & SLOT_MASK)?;
    let mut call = CallEvent {
        header: EventHeader {
            kind: kind::CALL,
            flags: frame.flags,
            ts_ns: frame.ts_ns,
            pid: tgid,
            tid,
        },
        probe_id,
        ret: crate::regs::return_value(ctx) as u32,
        dur_ns: now - frame.ts_ns,
        args: frame.args,
        outs: crate::zero::zeros::<MAX_OUTS>(),
    };
    for i in 0..MAX_OUTS {
        let arg = spec.out_args[i];
        if arg == 0 {
            continue;
        }
        let Some(&ptr) = frame.args.get(arg as usize - 1) else {
            continue;
        };
        if ptr == 0 {
            continue;
        }
        match unsafe { bpf_probe_read_user(ptr as *const u64) } {
            Ok(value) => call.outs[i] = value,
            Err(_) => call.header.flags |= flags::OUT_READ_FAILED,
        }
    }
    if frame.stack.flags != 0 {
        return crate::stacks::emit_stacked(call, &frame.stack, spec);
    }
    emit(call, spec)
}

/// The level and probe of the innermost pending frame entered with stack pointer `sp`
/// (the entry's, as `regs::entry_sp_at_return` gives it at the return), at or below `top`.
/// Frames of a tail call share it; the kernel runs their returns innermost first.
#[inline(always)]
fn find_frame_by_sp(stack: &FrameStack, top: u32, sp: u64) -> Option<(u32, u32)> {
    let mut level = top as i32;
    for _ in 0..MAX_DEPTH {
        if level < 0 {
            return None;
        }
        let frame = frame_at(stack, level);
        if frame.sp == sp {
            return Some((level as u32, frame.probe_id));
        }
        level -= 1;
    }
    None
}

/// The frame at `level` (0 to MAX_DEPTH - 1). Read back and masked: LLVM knows the bound
/// from the caller's check and would drop a plain one, while the verifier may have lost it
/// on a copy of the register (it did once the return probe gained its no-cookie branch).
#[inline(always)]
fn frame_at(stack: &FrameStack, level: i32) -> &Frame {
    let index = unsafe { core::ptr::read_volatile(&level) } as usize & (MAX_DEPTH - 1);
    &stack.frames[index]
}

/// The level of the innermost pending frame for `probe_id`, at or below `top`.
#[inline(always)]
fn find_frame(stack: &FrameStack, top: u32, probe_id: u32) -> Option<u32> {
    let mut level = top as i32;
    // Bounded: MAX_DEPTH iterations at most.
    for _ in 0..MAX_DEPTH {
        if level < 0 {
            return None;
        }
        if frame_at(stack, level).probe_id == probe_id {
            return Some(level as u32);
        }
        level -= 1;
    }
    None
}
