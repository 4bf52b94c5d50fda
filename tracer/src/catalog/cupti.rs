//! The libcupti catalog: the CUPTI functions by which a client takes, uses and gives back
//! the activity API (`--gpu` lives beside the program's own profiler through them,
//! docs/gpu.md, "Beside another CUPTI client"). Signatures follow CUPTI 13's headers.
//! Only functions called a few times per profiling session are probed: nothing per record.

use super::spec::{
    Arg::{self, *},
    Family,
    Field::*,
    FnSpec,
};

const fn f(symbols: &'static [&'static str], args: &'static [Arg]) -> FnSpec {
    FnSpec {
        symbols,
        family: Family::Cupti,
        args,
        copy: None,
        role: Family::Cupti.role(),
    }
}

pub static CUPTI_CATALOG: &[FnSpec] = &[
    // cuptiActivityRegisterCallbacks(bufferRequested, bufferCompleted): from here on every
    // record goes to this client (one client at a time before CUPTI 13.3 and r610).
    f(&["cuptiActivityRegisterCallbacks"], &[Ptr(Callback), Skip]),
    // cuptiActivityRegisterCallbacks_v2(subscriber, requested, completed).
    f(
        &["cuptiActivityRegisterCallbacks_v2"],
        &[Ptr(Subscriber), Ptr(Callback), Skip],
    ),
    f(&["cuptiActivityEnable"], &[U32(ActivityKind)]),
    f(&["cuptiActivityDisable"], &[U32(ActivityKind)]),
    // cuptiActivityEnable_v2(subscriber, kind, CUpti_ActivityConfig *).
    f(
        &["cuptiActivityEnable_v2"],
        &[Ptr(Subscriber), U32(ActivityKind), Skip],
    ),
    f(
        &["cuptiActivityDisable_v2"],
        &[Ptr(Subscriber), U32(ActivityKind), Skip],
    ),
    // cuptiActivityFlushAll(flag): 1 (FORCED) also hands over incomplete buffers.
    f(&["cuptiActivityFlushAll"], &[U32(Flags)]),
    f(
        &["cuptiActivityRegisterTimestampCallback"],
        &[Ptr(Callback)],
    ),
    // cuptiSubscribe(subscriber*, callback, userdata); _v2 adds its params.
    f(
        &["cuptiSubscribe"],
        &[OutPtr(Subscriber), Ptr(Callback), Skip],
    ),
    f(
        &["cuptiSubscribe_v2"],
        &[OutPtr(Subscriber), Ptr(Callback), Skip, Skip],
    ),
    f(&["cuptiUnsubscribe"], &[Ptr(Subscriber)]),
    // Detaches CUPTI from the process: every client's state goes.
    f(&["cuptiFinalize"], &[]),
];

/// CUPTI's result names (`CUptiResult`) that its clients meet here.
pub fn result_name(result: u32) -> Option<&'static str> {
    Some(match result {
        0 => "CUPTI_SUCCESS",
        1 => "CUPTI_ERROR_INVALID_PARAMETER",
        7 => "CUPTI_ERROR_INVALID_OPERATION",
        12 => "CUPTI_ERROR_MAX_LIMIT_REACHED",
        14 => "CUPTI_ERROR_NOT_COMPATIBLE",
        15 => "CUPTI_ERROR_NOT_INITIALIZED",
        21 => "CUPTI_ERROR_INVALID_KIND",
        27 => "CUPTI_ERROR_NOT_SUPPORTED",
        35 => "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
        39 => "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
        999 => "CUPTI_ERROR_UNKNOWN",
        _ => return None,
    })
}

/// `CUpti_ActivityKind` values the analysis follows.
pub mod activity_kind {
    pub const CONCURRENT_KERNEL: u32 = 10;
}

/// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`.
pub const FLUSH_FORCED: u64 = 1;
