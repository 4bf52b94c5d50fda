//! The generic driver-call probes. Entry saves a frame per thread (arguments, captured
//! memory); return pairs it, reads output parameters and emits one event.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
        bpf_probe_read_user_str_bytes, generated,
    },
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    CallDataEvent, CallEvent, DATA_LEN, EventHeader, Frame, FrameStack, MAX_DEPTH, MAX_OUTS,
    REGISTER_ARGS, STACK_ARGS, capture, counter, flags, kind,
};

use crate::maps::{EVENTS, FRAMES, SPECS, ZERO_STACK, bump, is_traced};

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
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_traced((pid_tgid >> 32) as u32) {
        return None;
    }
    bump(counter::ENTRIES);
    let probe_id = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    let spec = SPECS.get(probe_id)?;
    let stack = unsafe { &mut *thread_stack(pid_tgid as u32)? };

    let depth = stack.depth;
    stack.depth = depth + 1;
    if depth as usize >= MAX_DEPTH {
        bump(counter::TOO_DEEP);
        return None;
    }
    let frame = stack.frames.get_mut(depth as usize)?;
    frame.probe_id = probe_id;
    frame.flags = 0;
    frame.ts_ns = ts_ns;
    frame.data_len = 0;

    let regs = unsafe { &*ctx.regs };
    frame.args[0] = regs.rdi;
    frame.args[1] = regs.rsi;
    frame.args[2] = regs.rdx;
    frame.args[3] = regs.rcx;
    frame.args[4] = regs.r8;
    frame.args[5] = regs.r9;
    if spec.nargs as usize > REGISTER_ARGS {
        // At entry [rsp] is the return address; the seventh argument is at rsp+8.
        let slots = (regs.rsp + 8) as *const [u64; STACK_ARGS];
        match unsafe { bpf_probe_read_user(slots) } {
            Ok(words) => {
                frame.args[6] = words[0];
                frame.args[7] = words[1];
                frame.args[8] = words[2];
                frame.args[9] = words[3];
            }
            Err(_) => frame.flags |= flags::ENTRY_READ_FAILED,
        }
    }
    capture_at_entry(frame, spec.capture, spec.capture_arg, spec.capture_len);
    Some(())
}

#[inline(always)]
fn capture_at_entry(frame: &mut Frame, what: u32, arg: u32, len: u32) {
    if what == capture::NONE {
        return;
    }
    let Some(&ptr) = frame.args.get(arg as usize) else {
        return;
    };
    if ptr == 0 {
        return;
    }
    if what == capture::CSTR {
        match unsafe { bpf_probe_read_user_str_bytes(ptr as *const u8, &mut frame.data) } {
            Ok(bytes) => {
                frame.data_len = bytes.len() as u32;
                if bytes.len() >= DATA_LEN - 1 {
                    frame.flags |= flags::DATA_TRUNCATED;
                }
            }
            Err(_) => frame.flags |= flags::ENTRY_READ_FAILED,
        }
    } else if what == capture::STRUCT {
        let len = if len as usize > DATA_LEN {
            DATA_LEN as u32
        } else {
            len
        };
        let rc = unsafe {
            generated::bpf_probe_read_user(
                frame.data.as_mut_ptr().cast(),
                len,
                ptr as *const core::ffi::c_void,
            )
        };
        if rc == 0 {
            frame.data_len = len;
        } else {
            frame.flags |= flags::ENTRY_READ_FAILED;
        }
    }
}

fn try_call_return(ctx: &RetProbeContext) -> Option<()> {
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // Only traced threads ever get a frame stack, so no filter is needed here.
    let stack = unsafe { &mut *FRAMES.get_ptr_mut(&tid)? };
    let probe_id = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
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
    let Some(level) = find_frame(stack, depth, probe_id) else {
        // A return without its entry (entry probe not yet attached): leave the stack alone.
        bump(counter::UNMATCHED_RETURN);
        return None;
    };
    stack.depth = level;
    let frame = stack.frames.get(level as usize)?;
    let spec = SPECS.get(probe_id)?;
    let regs = unsafe { &*ctx.regs };

    let mut call = CallEvent {
        header: EventHeader {
            kind: kind::CALL,
            flags: frame.flags,
            ts_ns: frame.ts_ns,
            pid: (pid_tgid >> 32) as u32,
            tid,
        },
        probe_id,
        ret: regs.rax as u32,
        dur_ns: now - frame.ts_ns,
        args: frame.args,
        outs: [0; MAX_OUTS],
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

    if spec.capture == capture::NONE {
        let Some(mut entry) = EVENTS.reserve::<CallEvent>(0) else {
            bump(counter::RING_FULL);
            return None;
        };
        entry.write(call);
        entry.submit(0);
    } else {
        call.header.kind = kind::CALL_DATA;
        let Some(mut entry) = EVENTS.reserve::<CallDataEvent>(0) else {
            bump(counter::RING_FULL);
            return None;
        };
        let out = entry.as_mut_ptr();
        unsafe {
            (*out).call = call;
            (*out).data_len = frame.data_len;
            (*out)._pad = 0;
            // A helper copy keeps the 256-byte buffer off the 512-byte BPF stack.
            let _ = bpf_probe_read_kernel_buf(&frame.data, &mut (*out).data);
        }
        entry.submit(0);
    }
    Some(())
}

#[inline(always)]
unsafe fn bpf_probe_read_kernel_buf(src: &[u8; DATA_LEN], dst: &mut [u8; DATA_LEN]) -> i64 {
    unsafe {
        generated::bpf_probe_read_kernel(
            dst.as_mut_ptr().cast(),
            DATA_LEN as u32,
            src.as_ptr().cast(),
        )
    }
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
        if stack.frames.get(level as usize)?.probe_id == probe_id {
            return Some(level as u32);
        }
        level -= 1;
    }
    None
}
