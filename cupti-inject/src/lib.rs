//! cudatrace's CUDA injection library, `libcudatrace_inject.so`.
//!
//! `cudatrace run --gpu` names it in `CUDA_INJECTION64_PATH`; libcuda loads it and calls
//! [`InitializeInjection`] at `cuInit`. It loads libcupti at run time, enables kernel, copy
//! and memset activity (plus the API records of the driver calls that issue them, to link
//! each GPU record to its call), and hands every record, converted to
//! [`tracer_common::GpuRecord`], to [`cudatrace_gpu_records`]: a no-op that cudatrace's
//! uprobe reads. docs/gpu.md describes the records and the environment variables.
//!
//! This file is the library's C surface: every function that libcuda, CUPTI or libc call
//! hands over to the one owner of the library's state, [`INJECTION`].
//!
//! | file | |
//! |---|---|
//! | `injection.rs` | the owner: starting, the flush thread, the exit flush |
//! | `session.rs` | loading CUPTI, the single- or multi-subscriber set-up, taking CUPTI (again) |
//! | `buffers.rs` | CUPTI's buffers: handed out, read back, converted, sent |
//! | `calls.rs` | a late start's API records, made from CUPTI's driver callbacks |
//! | `flush.rs` | one flush of CUPTI's buffers, and the flush period |
//! | `control.rs` | living beside another CUPTI client: cudatrace's control slot |
//! | `outbox.rs` | the one sender every thread sends through; failures |
//! | `chain.rs` | another injection library, started after this one |
//! | `convert.rs`, `cupti.rs`, `cbids.rs`, `sender.rs` | records, CUPTI's declarations, the driver functions, batches |
//! | `env.rs`, `clock.rs` | the environment variables, the clocks |
//!
//! Who uses whom (no circles among them): `injection` → `flush` → `buffers` → `session` →
//! `outbox` → `sender`; `injection` → `control`, `chain` → `outbox`; any of them → `env`,
//! `clock`, `cupti`; `injection` → `calls` and `session` → `calls` (its callback, subscribed
//! by `session`, queues records that `injection` sends). `session` registers this file's
//! callbacks with CUPTI, `injection` its exit handler with libc.

mod buffers;
mod calls;
mod cbids;
mod chain;
mod clock;
mod control;
mod convert;
mod cupti;
mod env;
mod flush;
mod injection;
mod outbox;
mod sender;
mod session;

use std::ffi::{CStr, c_char, c_int, c_void};

use tracer_common::GpuRecord;

use crate::cupti::CUcontext;
use crate::injection::Injection;

/// Everything the library keeps: one owner, since CUPTI's and libc's callbacks carry no
/// data of ours.
static INJECTION: Injection = Injection::new();

/// cudatrace's uprobe sits on this function and copies `count` records from `records` into
/// its ring buffer. It does nothing itself; it must only exist and be called.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn cudatrace_gpu_records(records: *const GpuRecord, count: u32) {
    // An opaque use of both arguments: the call cannot be proven useless and dropped.
    std::hint::black_box((records, count));
}

/// Called by libcuda at `cuInit` when this library is named in `CUDA_INJECTION64_PATH`.
/// Always returns 1 (success, as NVIDIA's samples do): a failure here is reported to
/// cudatrace, never allowed to break the program.
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjection() -> c_int {
    INJECTION.initialize();
    1
}

/// A late start: `cudatrace run -p PID --gpu` makes the running program load this library
/// and call this function (its own `dlopen`, then `dlsym`, from a trampoline on one of its
/// threads). `given` is cudatrace's settings as `KEY=VALUE` lines (docs/gpu.md's variables),
/// in place of the environment the program started with. Returns 0 (started: what failed
/// is reported as records), 1 when a library started by libcuda records already, 2 while an
/// earlier attach still records, 3 when `given` is not text.
///
/// # Safety
/// `given` is a NUL-terminated string, readable during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudatrace_attach(given: *const c_char) -> c_int {
    if given.is_null() {
        return 3;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let Ok(given) = unsafe { CStr::from_ptr(given) }.to_str() else {
        return 3;
    };
    INJECTION.attach(given)
}

/// CUPTI asks for an empty buffer.
unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let (memory, bytes) = INJECTION.buffers().request();
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *buffer = memory;
        *size = bytes;
        *max = 0;
    }
}

/// CUPTI hands back a buffer of records: queued, read by the flush thread.
unsafe extern "C" fn buffer_completed(
    context: CUcontext,
    stream_id: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    // SAFETY: CUPTI's buffer with `valid` bytes of records, handed over to us.
    unsafe {
        INJECTION
            .buffers()
            .complete(context, stream_id, buffer, valid)
    };
}

/// The per-subscriber request callback: the same buffers.
unsafe extern "C" fn buffer_requested_v2(
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
unsafe extern "C" fn buffer_completed_v2(
    buffer: *mut u8,
    size: usize,
    valid: usize,
    _info: *mut c_void,
) {
    // SAFETY: as above.
    unsafe { buffer_completed(std::ptr::null_mut(), 0, buffer, size, valid) }
}

/// CUPTI's timestamp callback: the trace's clock, or CUPTI's own while another client
/// holds the activity API ([`clock::timestamp_ns`]).
unsafe extern "C" fn timestamp() -> u64 {
    clock::timestamp_ns(INJECTION.control().held_by_other())
}

/// libc's `atexit` handler: the exit flush.
extern "C" fn at_exit() {
    INJECTION.at_exit();
}
