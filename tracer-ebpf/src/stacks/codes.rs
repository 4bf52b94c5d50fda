//! `stack_codes` and `stack_capture`: each frame of a new stack gets the id of the record
//! that read its code object. A code object seen before at the same address, with the same
//! identity, keeps its record; another is read now: its `ob_type` checked, its file name,
//! qualified name (name on 3.10), first line, first traceable instruction and line table
//! copied into a code record, [`CAPTURES_PER_RUN`] per run of `stack_capture`. Then the
//! stack goes out with its frames, and is marked seen when every frame was resolved.

use aya_ebpf::{helpers::generated, macros::uprobe, programs::ProbeContext};
use tracer_common::stacks::{
    CODE_READ, CodeEvent, CodeHead, FILENAME_CAP, LINETABLE_CAP, MAX_STACK_FRAMES, NO_FIELD,
    PyProcess, QUALNAME_CAP, STR_READ, code_flags, py_flags, stack_counter, stack_flags,
    stack_prog, stack_status,
};

use super::{
    CODES_SEEN, CodeKey, CodeSeen, KNOWN_CODES, PYPROC, STACKS_SEEN, Scratch, StackKey, bump,
    read::{Buf, mask, read_user},
    scratch_of_current, send, tail_call, unique_id,
    walk::identity,
};
use crate::maps::{EVENTS, submit_flags};

/// Code objects one run of `stack_capture` reads; more continue in a tail call (the
/// kernel allows 33 tail calls per probe hit, which bounds the new code objects one call
/// can read).
const CAPTURES_PER_RUN: usize = 2;
/// Frames `stack_capture` looks up per read.
const LOOKUPS_PER_RUN: usize = 16;

/// A code record being filled (too large for the BPF stack).
#[aya_ebpf::macros::map]
static CODE_SCRATCH: aya_ebpf::maps::PerCpuArray<CodeEvent> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

/// The header of a string or bytes object, and the code object's first bytes.
#[aya_ebpf::macros::map]
static CODE_BUF: aya_ebpf::maps::PerCpuArray<Buf> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

#[uprobe]
pub fn stack_codes(ctx: ProbeContext) -> u32 {
    let Some(scratch) = scratch_of_current() else {
        return 0;
    };
    let status = resolve(&ctx, scratch);
    finish(scratch, status)
}

#[uprobe]
pub fn stack_capture(ctx: ProbeContext) -> u32 {
    let Some(scratch) = scratch_of_current() else {
        return 0;
    };
    let status = capture_some(&ctx, scratch);
    finish(scratch, status)
}

/// What a run of `stack_codes` or `stack_capture` ends with, unless a tail call goes on.
enum Ended {
    /// Every frame has its record, or was tried: send the stack.
    Resolved,
    /// Out of tail calls: send the stack, its frames left unresolved.
    OutOfTailCalls,
    Failed(u32),
}

/// Sends the stack with its frames (one place: each send carries an entry-only call's
/// emit); a stack whose every frame has a final record and an identity is marked seen (an
/// unresolved frame, or one whose read failed, is tried again at the next call).
#[inline(always)]
fn finish(scratch: &mut Scratch, ended: Ended) -> u32 {
    let (status, flags, resolved) = match ended {
        Ended::Resolved => (stack_status::OK, 0, true),
        Ended::OutOfTailCalls => (stack_status::OK, stack_flags::TAIL_CALL_FAILED, false),
        Ended::Failed(status) => (status, 0, false),
    };
    let mut whole = resolved && scratch.incomplete == 0;
    for index in 0..MAX_STACK_FRAMES {
        if index as u32 >= scratch.event.nframes {
            break;
        }
        let frame = scratch.frame(index as u64);
        if frame.capture == 0 || frame.ident == 0 {
            whole = false;
        }
    }
    let key = StackKey {
        generation: scratch.event.generation,
        hash: scratch.event.hash,
    };
    if send(scratch, status, flags, false) && whole && codes_known(scratch) {
        let _ = STACKS_SEEN.insert(&key, &1, 0);
    }
    0
}

/// Where the count of code objects freed stands for identities (`py_flags::FREE_PROBE`),
/// each code object of a stack about to be known goes into `KNOWN_CODES`, so that freeing
/// it moves the count. False where one could not: the stack stays unknown.
#[inline(always)]
fn codes_known(scratch: &mut Scratch) -> bool {
    let Some(py) = PYPROC.get_ptr(scratch.tgid) else {
        return false;
    };
    // SAFETY: a map value.
    let py = unsafe { &*py };
    if py.flags & py_flags::FREE_PROBE == 0 {
        return true;
    }
    for index in 0..MAX_STACK_FRAMES {
        if index as u32 >= scratch.event.nframes {
            break;
        }
        let key = CodeKey {
            generation: scratch.event.generation,
            code: scratch.frame(index as u64).code,
        };
        if KNOWN_CODES.insert(&key, &1, 0).is_err() {
            return false;
        }
    }
    true
}

/// Names each frame's code object by the record that read it, where it was seen before;
/// the others are left for `stack_capture`.
#[inline(always)]
fn resolve(ctx: &ProbeContext, scratch: &mut Scratch) -> Ended {
    let Some(py) = PYPROC.get_ptr(scratch.tgid) else {
        return Ended::Failed(stack_status::NO_INTERPRETER);
    };
    // SAFETY: a map value.
    let py = unsafe { &*py };
    let read_ident = !super::ident_per_frame(py);
    // Counted in the scratch, not a register: the verifier then need not walk every count
    // at every frame.
    scratch.todo = 0;
    scratch.incomplete = 0;
    for index in 0..MAX_STACK_FRAMES {
        if index as u32 >= scratch.event.nframes {
            break;
        }
        let code = scratch.frame(index as u64).code;
        let ident = if read_ident {
            // 3.13+: the walk let the code epoch stand for identities; a new stack reads
            // them.
            match identity(scratch, py, code) {
                Some(ident) => ident,
                None => return Ended::Failed(stack_status::READ_FAULT),
            }
        } else {
            scratch.frame(index as u64).ident
        };
        let key = CodeKey {
            generation: py.generation,
            code,
        };
        let frame = scratch.frame(index as u64);
        frame.ident = ident;
        match unsafe { CODES_SEEN.get(&key) } {
            Some(seen) if seen.ident == ident && ident != 0 => frame.capture = seen.capture,
            _ => {
                let todo = unsafe { core::ptr::read_volatile(&scratch.todo) };
                *scratch.todo(u64::from(todo)) = index as u16;
                scratch.todo = todo + 1;
            }
        }
    }
    scratch.next = 0;
    if unsafe { core::ptr::read_volatile(&scratch.todo) } == 0 {
        return Ended::Resolved;
    }
    tail_call(ctx, stack_prog::CAPTURE);
    Ended::OutOfTailCalls
}

/// Reads the next [`CAPTURES_PER_RUN`] new code objects, then goes on in a tail call.
/// Frames whose code object an earlier read of this call covers (recursion) are named on
/// the way; few reads a run keep each program small for the verifier.
#[inline(always)]
fn capture_some(ctx: &ProbeContext, scratch: &mut Scratch) -> Ended {
    let Some(py) = PYPROC.get_ptr(scratch.tgid) else {
        return Ended::Failed(stack_status::NO_INTERPRETER);
    };
    // SAFETY: a map value.
    let py = unsafe { &*py };
    for _ in 0..CAPTURES_PER_RUN {
        let Some(index) = next_unseen(scratch, py) else {
            break;
        };
        let code = scratch.frame(index).code;
        let ident = scratch.frame(index).ident;
        let (capture, complete) = capture(scratch.tgid, scratch.tid, py, code, ident);
        scratch.frame(index).capture = capture;
        if !complete {
            // Read again at the next call: this stack is not to be known by its hash.
            scratch.incomplete = 1;
        }
        if capture != 0 && ident != 0 && complete {
            let key = CodeKey {
                generation: py.generation,
                code,
            };
            let _ = CODES_SEEN.insert(&key, &CodeSeen { ident, capture }, 0);
        }
    }
    if scratch.next < scratch.todo {
        tail_call(ctx, stack_prog::CAPTURE);
        return Ended::OutOfTailCalls;
    }
    Ended::Resolved
}

/// The next frame left to resolve whose code object was not read meanwhile (the others are
/// named on the way, up to [`LOOKUPS_PER_RUN`]).
#[inline(always)]
fn next_unseen(scratch: &mut Scratch, py: &PyProcess) -> Option<u64> {
    for _ in 0..LOOKUPS_PER_RUN {
        let next = unsafe { core::ptr::read_volatile(&scratch.next) };
        if next >= scratch.todo {
            return None;
        }
        let index = u64::from(*scratch.todo(u64::from(next)));
        scratch.next = next + 1;
        let code = scratch.frame(index).code;
        let ident = scratch.frame(index).ident;
        let key = CodeKey {
            generation: py.generation,
            code,
        };
        match unsafe { CODES_SEEN.get(&key) } {
            Some(seen) if seen.ident == ident && ident != 0 => {
                scratch.frame(index).capture = seen.capture;
            }
            _ => return Some(index),
        }
    }
    None
}

/// Reads the code object at `code` into a code record; returns the record's id (0 when it
/// could not be sent) and whether the record is final. A record that cannot name a frame
/// (not a code object, a name too long) is still sent, flagged, and final: it is not read
/// again. One whose read failed (a page not resident) is read again at the next call.
#[inline(always)]
fn capture(tgid: u32, tid: u32, py: &PyProcess, code: u64, ident: u64) -> (u64, bool) {
    let Some(event) = CODE_SCRATCH.get_ptr_mut(0) else {
        return (0, false);
    };
    let Some(head) = CODE_BUF.get_ptr_mut(0) else {
        return (0, false);
    };
    // SAFETY: this CPU's scratch values.
    let (event, head) = unsafe { (&mut *event, &mut *head) };
    let id = unique_id();
    event.head = CodeHead {
        header: tracer_common::EventHeader {
            kind: tracer_common::kind::CODE,
            flags: py.minor,
            ts_ns: unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() },
            pid: tgid,
            tid,
        },
        capture: id,
        code,
        ident,
        first_line: 0,
        first_traceable: -1,
        flags: 0,
        filename_len: 0,
        qualname_len: 0,
        linetable_len: 0,
        filename_kind: 0,
        qualname_kind: 0,
        objects: [0; 3],
    };
    let event_data = event.data.as_mut_ptr();
    let event = &mut event.head;
    if !read_user(head.0.as_mut_ptr(), CODE_READ as u32, code) {
        event.flags |= code_flags::READ_FAULT;
    } else if head.u64_at(py.code_ob_type) != py.code_type {
        event.flags |= code_flags::NOT_CODE;
    } else {
        event.first_line = head.u32_at(py.code_firstlineno) as i32;
        if py.code_firsttraceable != NO_FIELD {
            event.first_traceable = head.u32_at(py.code_firsttraceable) as i32;
        }
        let filename = head.u64_at(py.code_filename);
        let qualname = head.u64_at(py.code_qualname);
        let linetable = head.u64_at(py.code_linetable);
        event.objects = [filename, qualname, linetable];
        let (len, kind) = match read_str(py, head, filename, event_data, FILENAME_CAP) {
            Ok(read) => read,
            Err(flag) => {
                event.flags |= flag;
                (0, 0)
            }
        };
        event.filename_len = len;
        event.filename_kind = kind;
        let at = mask::<{ 2 * FILENAME_CAP as u64 - 1 }>(u64::from(len)) as usize;
        let at = if at > FILENAME_CAP { FILENAME_CAP } else { at };
        // SAFETY: `at` is at most FILENAME_CAP, and QUALNAME_CAP bytes follow it.
        let (len, kind) = match read_str(
            py,
            head,
            qualname,
            unsafe { event_data.add(at) },
            QUALNAME_CAP,
        ) {
            Ok(read) => read,
            Err(flag) => {
                event.flags |= flag;
                (0, 0)
            }
        };
        event.qualname_len = len;
        event.qualname_kind = kind;
        let at2 = mask::<{ 2 * QUALNAME_CAP as u64 - 1 }>(u64::from(len)) as usize;
        let at2 = at
            + if at2 > QUALNAME_CAP {
                QUALNAME_CAP
            } else {
                at2
            };
        match read_bytes(py, linetable, unsafe { event_data.add(at2) }) {
            Ok(len) => event.linetable_len = len,
            Err(flag) => event.flags |= flag,
        }
    }
    let data = u64::from(event.filename_len)
        + u64::from(event.qualname_len)
        + u64::from(event.linetable_len);
    // A power of two less one: a mask of any other value would clear bits of a valid size.
    let data =
        mask::<{ (tracer_common::stacks::CODE_DATA_LEN as u64).next_power_of_two() - 1 }>(data);
    let data = if data > tracer_common::stacks::CODE_DATA_LEN as u64 {
        tracer_common::stacks::CODE_DATA_LEN as u64
    } else {
        data
    };
    // SAFETY: the event's head and `data` bytes of its data, inside the map value.
    let sent = unsafe {
        generated::bpf_ringbuf_output(
            core::ptr::from_ref(&EVENTS).cast_mut().cast(),
            core::ptr::from_mut(event).cast(),
            size_of::<CodeHead>() as u64 + data,
            submit_flags(),
        )
    } == 0;
    if !sent {
        bump(stack_counter::CODE_RING_FULL, 1);
        return (0, false);
    }
    bump(stack_counter::CAPTURES, 1);
    (id, event.flags & code_flags::READ_FAULT == 0)
}

/// Copies a compact `str`'s characters (at most `cap` bytes) to `out`: (bytes, kind), or
/// the flag that says why not (a read failed; not a compact string, or too long). `head` is
/// reused for its header.
#[inline(always)]
fn read_str(
    py: &PyProcess,
    head: &mut Buf,
    string: u64,
    out: *mut u8,
    cap: usize,
) -> Result<(u32, u32), u32> {
    if !read_user(head.0.as_mut_ptr(), STR_READ as u32, string) {
        return Err(code_flags::READ_FAULT);
    }
    let length = head.u64_at(py.str_length);
    let state = head.u32_at(py.str_state);
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1;
    let ascii = (state >> 6) & 1;
    if compact == 0 || !(kind == 1 || kind == 2 || kind == 4) || length > cap as u64 {
        return Err(code_flags::BAD_NAME);
    }
    // kind is 1, 2 or 4 bytes a character.
    let bytes = length << (kind >> 1);
    if bytes > cap as u64 {
        return Err(code_flags::BAD_NAME);
    }
    let data = if ascii != 0 {
        py.str_ascii_data
    } else {
        py.str_compact_data
    };
    let bytes = mask::<{ 2 * FILENAME_CAP as u64 - 1 }>(bytes);
    let bytes = if bytes > cap as u64 {
        cap as u64
    } else {
        bytes
    };
    if bytes > 0 && !read_user(out, bytes as u32, string + u64::from(data)) {
        return Err(code_flags::READ_FAULT);
    }
    Ok((bytes as u32, kind))
}

/// Copies a `bytes` object's contents (the line table) to `out`.
#[inline(always)]
fn read_bytes(py: &PyProcess, object: u64, out: *mut u8) -> Result<u32, u32> {
    let size =
        super::read::user_u64(object + u64::from(py.bytes_size)).ok_or(code_flags::READ_FAULT)?;
    if size > LINETABLE_CAP as u64 {
        return Err(code_flags::LINETABLE_TOO_LONG);
    }
    let size = mask::<{ 2 * LINETABLE_CAP as u64 - 1 }>(size);
    let size = if size > LINETABLE_CAP as u64 {
        LINETABLE_CAP as u64
    } else {
        size
    };
    if size > 0 && !read_user(out, size as u32, object + u64::from(py.bytes_data)) {
        return Err(code_flags::READ_FAULT);
    }
    Ok(size as u32)
}
