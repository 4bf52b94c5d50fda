//! CUPTI's activity buffers: handed out on request, read back when complete, every record
//! converted and sent, the buffer freed.

use std::alloc::{Layout, alloc, dealloc};
use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use tracer_common::{GpuRecord, gpu_record, gpu_stage};

use crate::cupti::{Activity, CUPTI_ERROR_MAX_LIMIT_REACHED, CUPTI_SUCCESS, CUcontext};
use crate::session::{Mode, session};
use crate::{ENV_BUFFER_KIB, ENV_VERBOSE, Failure, convert, env_number, report, sender};

/// Bytes per buffer by default (about 19,000 kernel records).
const DEFAULT_BUFFER_BYTES: usize = 4 << 20;
/// CUPTI wants buffers aligned to its record alignment.
const BUFFER_ALIGN: usize = 8;

/// The buffers' layout, fixed at the first request ([`ENV_BUFFER_KIB`], 64 KiB at least).
fn layout() -> Layout {
    static LAYOUT: OnceLock<Layout> = OnceLock::new();
    *LAYOUT.get_or_init(|| {
        let bytes = env_number(ENV_BUFFER_KIB)
            .map_or(DEFAULT_BUFFER_BYTES, |kib| (kib as usize).max(64) << 10);
        Layout::from_size_align(bytes, BUFFER_ALIGN).expect("a valid layout")
    })
}

/// The buffers this library handed to CUPTI and has not had back: only these are freed.
/// A buffer another client of the program handed out can come back through this library's
/// callback (CUPTI keeps one callback per process): its records are read, its memory is
/// left to its owner.
static OURS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// CUPTI asks for an empty buffer.
pub unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let layout = layout();
    // SAFETY: a non-zero size. A null result makes CUPTI drop records, which it counts.
    let memory = unsafe { alloc(layout) };
    if !memory.is_null() {
        OURS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashSet::new)
            .insert(memory as usize);
    }
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *buffer = memory;
        *size = if memory.is_null() { 0 } else { layout.size() };
        *max = 0;
    }
}

/// A completed buffer, waiting to be read outside CUPTI's callback.
struct Completed {
    context: usize,
    stream_id: u32,
    buffer: usize,
    valid: usize,
}

/// Completed buffers not read yet: CUPTI's callback only queues them, so that reading,
/// converting and sending (about a record per launch) is never done while CUPTI may hold
/// its own locks against the program's launches.
static COMPLETED: Mutex<Vec<Completed>> = Mutex::new(Vec::new());

/// CUPTI hands back a buffer of records: queued for [`read_completed`].
pub unsafe extern "C" fn buffer_completed(
    context: CUcontext,
    stream_id: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    COMPLETED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Completed {
            context: context as usize,
            stream_id,
            buffer: buffer as usize,
            valid,
        });
}

/// Reads, converts, sends and frees every completed buffer (the flush thread's, and the
/// exit flush's, after CUPTI returned).
pub fn read_completed() {
    let completed = std::mem::take(&mut *COMPLETED.lock().unwrap_or_else(|e| e.into_inner()));
    for Completed {
        context,
        stream_id,
        buffer,
        valid,
    } in completed
    {
        let ours = OURS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .is_some_and(|set| set.remove(&buffer));
        let buffer = buffer as *mut u8;
        let result = std::panic::catch_unwind(|| {
            // SAFETY: CUPTI's buffer with `valid` bytes of records, handed over to us.
            unsafe { deliver(context as CUcontext, stream_id, buffer, valid, ours) }
        });
        if result.is_err() {
            eprintln!("cudatrace-inject: internal error while reading a CUPTI buffer");
        }
        if ours {
            // SAFETY: allocated by buffer_requested with this layout.
            unsafe { dealloc(buffer, layout()) };
        }
    }
}

/// The per-subscriber request callback: the same buffers.
pub unsafe extern "C" fn buffer_requested_v2(
    buffer: *mut *mut u8,
    size: *mut usize,
    max: *mut usize,
    _info: *mut c_void,
) {
    // SAFETY: the same out-pointers.
    unsafe { buffer_requested(buffer, size, max) }
}

/// The per-subscriber completion callback (no context or stream: the dropped count is the
/// subscriber's).
pub unsafe extern "C" fn buffer_completed_v2(
    buffer: *mut u8,
    size: usize,
    valid: usize,
    _info: *mut c_void,
) {
    // SAFETY: as above.
    unsafe { buffer_completed(std::ptr::null_mut(), 0, buffer, size, valid) }
}

/// # Safety
/// `buffer` holds `valid` bytes of CUPTI activity records.
unsafe fn deliver(context: CUcontext, stream_id: u32, buffer: *mut u8, valid: usize, ours: bool) {
    let Some(session) = session() else {
        return;
    };
    let cupti = &session.cupti;
    let per_subscriber = match (&session.mode, cupti.per_subscriber.as_ref()) {
        (Mode::Multi(subscriber), Some(api)) => Some((*subscriber, api)),
        _ => None,
    };
    let mut guard = sender();
    let Some(sender) = guard.as_mut() else {
        return;
    };
    let mut activity: *mut Activity = std::ptr::null_mut();
    let mut kinds: Vec<(u32, u64)> = Vec::new();
    loop {
        // SAFETY: CUPTI walks its own buffer.
        let rc = unsafe {
            match per_subscriber {
                Some((subscriber, api)) => {
                    (api.get_next_record)(subscriber, buffer, valid, &mut activity)
                }
                None => (cupti.get_next_record)(buffer, valid, &mut activity),
            }
        };
        if rc == CUPTI_ERROR_MAX_LIMIT_REACHED {
            break;
        }
        if rc != CUPTI_SUCCESS {
            report(
                sender,
                Failure {
                    stage: gpu_stage::READ_BUFFER,
                    result: rc,
                    detail: 0,
                    fatal: false,
                    message: format!(
                        "cuptiActivityGetNextRecord failed: {}: the rest of a buffer is lost",
                        cupti.result_string(rc)
                    ),
                },
            );
            break;
        }
        // SAFETY: every record starts with its kind.
        let kind = unsafe { activity.cast::<u32>().read_unaligned() };
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((kind, 1)),
        }
        // SAFETY: a complete record, as CUPTI returned it.
        match unsafe { convert::convert(activity.cast(), session.clock_flags) } {
            convert::Converted::Record(record) => sender.push(record),
            // SAFETY: CUPTI's name is null or NUL-terminated.
            convert::Converted::Kernel { record, name } => unsafe {
                sender.push_kernel(record, name)
            },
            convert::Converted::Other(_) => {}
        }
    }
    let mut dropped = 0usize;
    // SAFETY: CUPTI writes one count.
    let rc = unsafe {
        match per_subscriber {
            Some((subscriber, api)) => {
                (api.get_num_dropped_records)(subscriber, context, stream_id, &mut dropped)
            }
            None => (cupti.get_num_dropped_records)(context, stream_id, &mut dropped),
        }
    };
    if rc != CUPTI_SUCCESS {
        report(
            sender,
            Failure {
                stage: gpu_stage::DROPPED_COUNT,
                result: rc,
                detail: 0,
                fatal: false,
                message: format!(
                    "cuptiActivityGetNumDroppedRecords failed: {}: CUPTI's losses are unknown",
                    cupti.result_string(rc)
                ),
            },
        );
    }
    if std::env::var_os(ENV_VERBOSE).is_some_and(|v| v == "1") {
        let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k}:{n}")).collect();
        eprintln!(
            "cudatrace-inject: {} buffer {buffer:p}, {valid} bytes, records by kind {{{}}}, dropped {dropped}",
            if ours { "own" } else { "foreign" },
            kinds.join(" ")
        );
    }
    if rc == CUPTI_SUCCESS && dropped > 0 {
        sender.push(GpuRecord {
            what: gpu_record::DROPPED,
            dropped: dropped as u64,
            ..GpuRecord::default()
        });
    }
    sender.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(buffer: *mut u8) -> bool {
        OURS.lock()
            .unwrap()
            .as_ref()
            .is_some_and(|set| set.contains(&(buffer as usize)))
    }

    #[test]
    fn only_the_librarys_own_buffers_are_freed() {
        let (mut buffer, mut size, mut max) = (std::ptr::null_mut(), 0, 0);
        // SAFETY: valid out-pointers.
        unsafe { buffer_requested(&mut buffer, &mut size, &mut max) };
        assert!(!buffer.is_null() && size == layout().size() && ours(buffer));
        // Another client's buffer, handed to this library's callback.
        let foreign = Box::into_raw(Box::new([7u8; 64])).cast::<u8>();
        // SAFETY: both are buffers of `size` bytes with no records.
        unsafe {
            buffer_completed(std::ptr::null_mut(), 0, buffer, size, 0);
            buffer_completed(std::ptr::null_mut(), 0, foreign, 64, 0);
        }
        read_completed();
        assert!(!ours(buffer), "freed, and forgotten");
        // Still its owner's: reading and dropping it is sound (freed here, once).
        // SAFETY: the Box's own pointer, not freed by read_completed.
        let foreign = unsafe { Box::from_raw(foreign.cast::<[u8; 64]>()) };
        assert_eq!(foreign[63], 7);
    }
}
