//! A call's event written to the ring, with the memory its spec captures read now: a
//! `CallEvent`, a `CallStringEvent` (a name or path, up to 4 KiB) or a `CallDataEvent` (a
//! struct or array). The call programs send it (`calls.rs`), and the stack programs send an
//! entry-only call's after its stack (`stacks/`).

use aya_ebpf::helpers::generated;
use tracer_common::{
    CallDataEvent, CallEvent, CallStringEvent, DATA_LEN, MAX_ARGS, ProbeSpec, STRING_READ_LEN,
    TEXT_LEN, capture as capture_kind, counter, flags, kind,
};

use crate::maps::{EVENTS, bump, submit_flags};

/// Writes `call` to the ring, with the memory its spec captures read now: a `CallEvent`,
/// a `CallStringEvent` or a `CallDataEvent`.
#[inline(always)]
pub fn emit(mut call: CallEvent, spec: &ProbeSpec) -> Option<()> {
    if spec.capture == capture_kind::NONE {
        let Some(mut entry) = EVENTS.reserve::<CallEvent>(0) else {
            bump(counter::RING_FULL);
            return None;
        };
        entry.write(call);
        entry.submit(submit_flags());
    } else if spec.capture == capture_kind::CSTR {
        call.header.kind = kind::CALL_STRING;
        let Some(mut entry) = EVENTS.reserve::<CallStringEvent>(0) else {
            bump(counter::RING_FULL);
            return None;
        };
        let out = entry.as_mut_ptr();
        let ptr = call
            .args
            .get(spec.capture_arg as usize)
            .copied()
            .unwrap_or(0);
        unsafe {
            // Read straight into the ring: the 4 KiB buffer never touches the BPF stack.
            let mut read_flags = 0;
            let len = capture_string((*out).data.as_mut_ptr(), &mut read_flags, ptr);
            call.header.flags |= read_flags;
            (*out).call = call;
            (*out).data_len = len;
            (*out)._pad = 0;
        }
        entry.submit(submit_flags());
    } else {
        call.header.kind = kind::CALL_DATA;
        let Some(mut entry) = EVENTS.reserve::<CallDataEvent>(0) else {
            bump(counter::RING_FULL);
            return None;
        };
        let out = entry.as_mut_ptr();
        unsafe {
            // Read straight into the ring: the buffer never touches the BPF stack.
            let mut read_flags = 0;
            let len = capture_struct(&mut (*out).data, &mut read_flags, &call.args, spec);
            call.header.flags |= read_flags;
            (*out).call = call;
            (*out).data_len = len;
            (*out)._pad = 0;
        }
        entry.submit(submit_flags());
    }
    Some(())
}

/// Reads the NUL-terminated string `ptr` points to into `data` (a ring reservation), and
/// returns its length without the NUL, at most `TEXT_LEN`: a longer string is cut there and
/// flagged `DATA_TRUNCATED`.
#[inline(always)]
fn capture_string(data: *mut u8, flags_out: &mut u32, ptr: u64) -> u32 {
    if ptr == 0 {
        return 0;
    }
    // Reads at most STRING_READ_LEN - 1 bytes and a NUL: one byte more than TEXT_LEN tells
    // a string of exactly TEXT_LEN bytes from a longer one.
    let rc = unsafe {
        generated::bpf_probe_read_user_str(
            data.cast(),
            STRING_READ_LEN as u32,
            ptr as *const core::ffi::c_void,
        )
    };
    if rc < 0 {
        *flags_out |= flags::ENTRY_READ_FAILED;
        return 0;
    }
    // rc counts the NUL.
    let len = (rc as u64).saturating_sub(1);
    if len > TEXT_LEN as u64 {
        *flags_out |= flags::DATA_TRUNCATED;
        return TEXT_LEN as u32;
    }
    len as u32
}

/// Reads the struct or array the spec's pointer argument refers to into `data`; returns
/// the bytes read.
#[inline(always)]
fn capture_struct(
    data: &mut [u8; DATA_LEN],
    flags_out: &mut u32,
    args: &[u64; MAX_ARGS],
    spec: &ProbeSpec,
) -> u32 {
    let Some(&ptr) = args.get(spec.capture_arg as usize) else {
        return 0;
    };
    if ptr == 0 {
        return 0;
    }
    let mut len = u64::from(spec.capture_len);
    if spec.capture_count_arg != 0 {
        let Some(&count) = args.get(spec.capture_count_arg as usize - 1) else {
            return 0;
        };
        len = count.min((DATA_LEN / 8) as u64) * 8;
    }
    if len > DATA_LEN as u64 {
        len = DATA_LEN as u64;
    }
    if len == 0 {
        return 0;
    }
    let rc = unsafe {
        generated::bpf_probe_read_user(
            data.as_mut_ptr().cast(),
            len as u32,
            ptr as *const core::ffi::c_void,
        )
    };
    if rc == 0 {
        len as u32
    } else {
        *flags_out |= flags::ENTRY_READ_FAILED;
        0
    }
}
