//! GPU activity from the injection library: a uprobe on its exported no-op
//! `cudatrace_gpu_records(records, count)` copies a batch without text into the ring in
//! one piece, and otherwise each record of the batch, with its text (kernel name, error
//! message) when it has one.

use core::mem::size_of;

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user, generated},
    macros::uprobe,
    programs::ProbeContext,
};
use tracer_common::{
    EventHeader, GPU_BATCH_MAX, GPU_TEXT_LEN, GpuBatchEvent, GpuEvent, GpuRecord, GpuTextEvent,
    counter, flags, gpu_flags, kind,
};

use crate::maps::{EVENTS, add, bump, current_ids, is_traced, submit_flags};

#[uprobe]
pub fn gpu_records(ctx: ProbeContext) -> u32 {
    let _ = try_gpu_records(&ctx);
    0
}

fn try_gpu_records(ctx: &ProbeContext) -> Option<()> {
    let (pid, tid) = current_ids()?;
    if !is_traced(pid) {
        return None;
    }
    let records: *const GpuRecord = ctx.arg(0)?;
    let count: u32 = ctx.arg(1)?;
    let header = EventHeader {
        kind: kind::GPU,
        flags: 0,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        pid,
        tid,
    };
    if count as usize > GPU_BATCH_MAX {
        // The library never sends more; were it to, the excess is counted, not dropped silently.
        add(
            counter::GPU_READ_FAILED,
            u64::from(count) - GPU_BATCH_MAX as u64,
        );
    }
    if count >= 2 && copy_batch(records, count, &header) {
        return Some(());
    }
    for index in 0..GPU_BATCH_MAX {
        if index >= count as usize {
            break;
        }
        copy_record(records.wrapping_add(index), &header);
    }
    Some(())
}

/// Copies `count` records (2 to [`GPU_BATCH_MAX`]) into one ring entry with one read:
/// false, with nothing sent, where the first is not marked [`gpu_flags::BATCH_WITHOUT_TEXT`],
/// the read fails or the ring is full (the caller then goes record by record, and counts
/// failures per record).
#[inline(always)]
fn copy_batch(source: *const GpuRecord, count: u32, header: &EventHeader) -> bool {
    let count = count as usize;
    if count > GPU_BATCH_MAX {
        return false;
    }
    let Some(mut entry) = EVENTS.reserve::<GpuBatchEvent>(0) else {
        return false;
    };
    let out = entry.as_mut_ptr();
    let rc = unsafe {
        generated::bpf_probe_read_user(
            (*out).records.as_mut_ptr().cast(),
            (count * size_of::<GpuRecord>()) as u32,
            source as *const core::ffi::c_void,
        )
    };
    if rc != 0 {
        entry.discard(0);
        return false;
    }
    // The library marks a batch none of whose records carries text on its first record
    // (an earlier build's library, still loaded in a process, marks none).
    let first = unsafe { (*out).records[0].flags };
    let with_text = first & gpu_flags::BATCH_WITHOUT_TEXT == 0;
    if with_text {
        entry.discard(0);
        return false;
    }
    unsafe {
        (*out).header = *header;
        (*out).header.kind = kind::GPU_BATCH;
        (*out).count = count as u32;
        (*out)._pad = 0;
    }
    entry.submit(submit_flags());
    true
}

/// Copies one record (and its text) into the ring; a failure is counted per record.
#[inline(always)]
fn copy_record(source: *const GpuRecord, header: &EventHeader) {
    let Ok(record) = (unsafe { bpf_probe_read_user(source) }) else {
        bump(counter::GPU_READ_FAILED);
        return;
    };
    if record.text_len == 0 {
        let Some(mut entry) = EVENTS.reserve::<GpuEvent>(0) else {
            bump(counter::GPU_RING_FULL);
            return;
        };
        let out = entry.as_mut_ptr();
        unsafe {
            (*out).header = *header;
            (*out).record = record;
        }
        entry.submit(submit_flags());
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<GpuTextEvent>(0) else {
        bump(counter::GPU_RING_FULL);
        return;
    };
    let out = entry.as_mut_ptr();
    let mut event_flags = 0;
    let mut len = record.text_len as usize;
    if len > GPU_TEXT_LEN {
        len = GPU_TEXT_LEN;
    }
    if len < record.text_full_len as usize || len < record.text_len as usize {
        event_flags |= flags::DATA_TRUNCATED;
    }
    // Read straight into the ring: the 4 KiB text never touches the BPF stack.
    let rc = unsafe {
        generated::bpf_probe_read_user(
            (*out).text.as_mut_ptr().cast(),
            len as u32,
            record.text as *const core::ffi::c_void,
        )
    };
    unsafe {
        (*out).header = *header;
        (*out).header.kind = kind::GPU_TEXT;
        (*out).record = record;
        if rc != 0 {
            event_flags |= flags::ENTRY_READ_FAILED;
            (*out).record.text_len = 0;
        } else {
            (*out).record.text_len = len as u32;
        }
        (*out).header.flags = event_flags;
    }
    entry.submit(submit_flags());
}
