//! The driver calls that issue GPU work, seen by CUPTI's callback API on the calling
//! thread: an API record per call (correlation id, callback id, thread, start, end,
//! result), made by this library instead of CUPTI's DRIVER activity records.
//!
//! A late start (`cudatrace run -p PID --gpu`) needs it. Set up in a running PyTorch
//! process (CUPTI 13.0, driver 580), CUPTI gives a kernel launched through libcudart
//! (`cudaLaunchKernel`, which calls `cuLaunchKernel`) the correlation id of the runtime
//! call, and writes no DRIVER activity record of the `cuLaunchKernel` inside it: only the
//! launches libraries make on the driver directly (cuBLAS's) got one, about one launch in
//! seven (docs/validation.md, runs S and T). The driver callback of that `cuLaunchKernel`
//! comes on the launching thread for every call, and carries the correlation id that the
//! kernel record carries (35,742 of 35,742 kernels in run T).
//!
//! The callback only queues the record (one short lock); the flush thread sends them
//! ([`drain`]).

use std::cell::Cell;
use std::ffi::{c_char, c_void};
use std::mem::offset_of;
use std::sync::Mutex;

use tracer_common::{GpuRecord, gpu_record};

use crate::clock::monotonic_ns;
use crate::cupti::{CUPTI_SUCCESS, CUcontext, CUptiResult};

/// `CUPTI_CB_DOMAIN_DRIVER_API`.
pub const DOMAIN_DRIVER_API: u32 = 1;
/// `CUPTI_API_ENTER`, `CUPTI_API_EXIT`.
const SITE_ENTER: u32 = 0;
const SITE_EXIT: u32 = 1;

/// `CUpti_CallbackData`, what CUPTI passes for an API callback.
#[repr(C)]
pub struct CallbackData {
    pub site: u32,
    pub function_name: *const c_char,
    pub function_params: *const c_void,
    pub function_return_value: *mut c_void,
    pub symbol_name: *const c_char,
    pub context: CUcontext,
    pub context_uid: u32,
    pub correlation_data: *mut u64,
    pub correlation_id: u32,
}
const _: () = {
    assert!(offset_of!(CallbackData, function_return_value) == 24);
    assert!(offset_of!(CallbackData, context_uid) == 48);
    assert!(offset_of!(CallbackData, correlation_data) == 56);
    assert!(offset_of!(CallbackData, correlation_id) == 64);
};

/// Records made by the callback, not sent yet.
static PENDING: Mutex<Vec<GpuRecord>> = Mutex::new(Vec::new());

thread_local! {
    /// The calling thread's id (`gettid`, CUPTI's SYSTEM thread ids), read once a thread.
    static TID: Cell<u32> = const { Cell::new(0) };
}

fn tid() -> u32 {
    TID.with(|tid| {
        if tid.get() == 0 {
            // SAFETY: a plain system call.
            tid.set(unsafe { libc::gettid() } as u32);
        }
        tid.get()
    })
}

/// The records queued since the last call.
pub fn drain() -> Vec<GpuRecord> {
    std::mem::take(&mut *PENDING.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The clock of the session's other records, the callback's `userdata`: the session keeps
/// it for the life of the process.
pub struct Clock {
    /// [`tracer_common::gpu_flags::CUPTI_CLOCK`] when records are on CUPTI's clock, else 0
    /// (CLOCK_MONOTONIC).
    pub flags: u32,
    /// `cuptiGetTimestamp`.
    pub cupti_timestamp: unsafe extern "C" fn(*mut u64) -> CUptiResult,
}

impl Clock {
    /// The time now.
    fn now(&self) -> u64 {
        if self.flags == 0 {
            return monotonic_ns();
        }
        let mut now = 0;
        // SAFETY: reads the clock only.
        if unsafe { (self.cupti_timestamp)(&mut now) } == CUPTI_SUCCESS {
            now
        } else {
            0
        }
    }
}

/// The API record of one call, at its exit: `start` 0 (its enter was not seen: the
/// callbacks were switched on during the call) is taken as `end`.
pub fn record(
    clock_flags: u32,
    cbid: u32,
    correlation_id: u32,
    start: u64,
    end: u64,
    result: u32,
) -> GpuRecord {
    GpuRecord {
        what: gpu_record::API,
        flags: clock_flags,
        start: if start == 0 { end } else { start },
        end,
        correlation_id,
        cbid,
        result,
        pid: std::process::id(),
        tid: tid(),
        ..GpuRecord::default()
    }
}

/// CUPTI's callback (`CUpti_CallbackFunc`); `user` is the session's [`Clock`], which lives
/// as long as the process.
///
/// # Safety
/// CUPTI's call: `data` is a `CUpti_CallbackData` for the driver domain.
pub unsafe extern "C" fn on_driver_call(
    user: *mut c_void,
    domain: u32,
    cbid: u32,
    data: *const c_void,
) {
    if domain != DOMAIN_DRIVER_API || user.is_null() || data.is_null() {
        return;
    }
    // SAFETY: the session registered its clock as `user`; CUPTI's data, as promised.
    let (clock, data) = unsafe { (&*(user as *const Clock), &*data.cast::<CallbackData>()) };
    match data.site {
        SITE_ENTER if !data.correlation_data.is_null() => {
            // SAFETY: CUPTI's slot for this call, kept from enter to exit.
            unsafe { *data.correlation_data = clock.now() };
        }
        SITE_EXIT => {
            let end = clock.now();
            let start = if data.correlation_data.is_null() {
                0
            } else {
                // SAFETY: as above.
                unsafe { *data.correlation_data }
            };
            let result = if data.function_return_value.is_null() {
                0
            } else {
                // SAFETY: a driver function returns a CUresult.
                unsafe { *data.function_return_value.cast::<u32>() }
            };
            let record = record(clock.flags, cbid, data.correlation_id, start, end, result);
            PENDING
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(record);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_whose_enter_was_not_seen_starts_at_its_end() {
        let seen = record(0, 307, 17, 100, 250, 0);
        assert_eq!(
            (seen.what, seen.cbid, seen.correlation_id),
            (gpu_record::API, 307, 17)
        );
        assert_eq!((seen.start, seen.end, seen.result), (100, 250, 0));
        assert_eq!(seen.pid, std::process::id());
        // SAFETY: a plain system call.
        assert_eq!(seen.tid, unsafe { libc::gettid() } as u32);
        let unseen = record(tracer_common::gpu_flags::CUPTI_CLOCK, 442, 18, 0, 300, 1);
        assert_eq!((unseen.start, unseen.end, unseen.result), (300, 300, 1));
        assert_eq!(unseen.flags, tracer_common::gpu_flags::CUPTI_CLOCK);
    }
}
