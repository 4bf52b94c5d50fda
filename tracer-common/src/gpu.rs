//! GPU activity records: what the injection library (`cupti-inject`) hands to cudatrace's
//! `gpu_records` uprobe, and how they travel through the ring buffer.
//!
//! The injection library converts CUPTI's activity records into fixed-size [`GpuRecord`]s
//! and calls its exported no-op `cudatrace_gpu_records(records, count)` with batches of at
//! most [`GPU_BATCH_MAX`]. The uprobe copies a batch without text into the ring whole, as a
//! [`GpuBatchEvent`]; otherwise it copies each record as a [`GpuEvent`],
//! or, when the record carries text (a kernel name, an error message), as a
//! [`GpuTextEvent`] with the text read from the traced process.

use core::mem::{offset_of, size_of};

use crate::EventHeader;

/// Records one call of `cudatrace_gpu_records` may carry; the uprobe counts any beyond this
/// as lost (`counter::GPU_READ_FAILED`).
pub const GPU_BATCH_MAX: usize = 32;
/// Bytes of text a [`GpuTextEvent`] carries; longer text is cut and flagged. The same limit
/// as a call's strings ([`crate::TEXT_LEN`]), so a kernel name is kept whole (or cut) alike
/// whichever way it arrives.
pub const GPU_TEXT_LEN: usize = crate::TEXT_LEN;
/// The exported function the injection library calls with each batch.
pub const GPU_RECORDS_SYMBOL: &str = "cudatrace_gpu_records";

/// What a [`GpuRecord`] is ([`GpuRecord::what`]). Numbers are stable and never reused.
pub mod gpu_record {
    /// A kernel ran on the GPU.
    pub const KERNEL: u32 = 1;
    /// A memory copy ran.
    pub const MEMCPY: u32 = 2;
    /// A memset ran.
    pub const MEMSET: u32 = 3;
    /// A driver call that issued GPU work (launch, copy, memset): CUPTI's own record of it,
    /// carrying the correlation id its GPU records share.
    pub const API: u32 = 4;
    /// Defines a kernel name: `name_id` and the name as text. Sent once per distinct name,
    /// before the first KERNEL record that refers to it.
    pub const NAME: u32 = 5;
    /// CUPTI dropped `dropped` records (its buffers were full).
    pub const DROPPED: u32 = 6;
    /// Something failed: `stage`, `result`, `detail`, and a message as text.
    pub const ERROR: u32 = 7;
    /// A clock pair: `start` is CUPTI's timestamp, `end` CLOCK_MONOTONIC, read together.
    pub const CLOCK: u32 = 8;
    /// The session started: `detail` is the CUPTI API version, the text the libcupti path,
    /// `start` the address of the library's buffer-request callback (what its
    /// `cuptiActivityRegisterCallbacks` passes: another client's differs), `pid` the
    /// library's own `getpid()` (its slot in the control file).
    pub const INFO: u32 = 9;
    /// The library gave up (`detail` [`client::YIELDED`]) or took back
    /// ([`client::RESUMED`]) CUPTI's activity API for another client of the process:
    /// `start` is when, on CLOCK_MONOTONIC.
    pub const CLIENT: u32 = 10;
}

/// What a CLIENT record says ([`GpuRecord::detail`]).
pub mod client {
    /// Another CUPTI client took the activity API: the library stopped flushing.
    pub const YIELDED: u32 = 1;
    /// It let go: the library registered its callbacks and enabled its kinds again.
    pub const RESUMED: u32 = 2;
    /// A late start's window ended (`cudatrace run -p PID --gpu`): the last records are
    /// out and every kind is off; the library records nothing more until the next attach.
    /// `start` is when it began turning CUPTI off.
    pub const DETACHED: u32 = 3;
    /// A late start records from here (its kinds and driver functions are on): calls made
    /// before it have no GPU lines (`not_recorded`).
    pub const ATTACHED: u32 = 4;
    /// A late start found another CUPTI client of the process subscribed (its
    /// `cuptiSubscribe` refused): it took nothing, and records nothing while that client
    /// holds CUPTI (`cupti_held`).
    pub const HELD_AT_ATTACH: u32 = 5;
}

/// Bits of [`GpuRecord::flags`].
pub mod gpu_flags {
    /// `start`/`end` are on CUPTI's default clock (ns since the Unix epoch): convert them
    /// with the latest CLOCK record ([`super::ClockPair`]). Without it they are
    /// CLOCK_MONOTONIC, the trace's clock.
    pub const CUPTI_CLOCK: u32 = 1 << 0;
    /// CUPTI could not time this activity (`start` and `end` are 0).
    pub const NO_TIMESTAMPS: u32 = 1 << 1;
    /// MEMCPY: an asynchronous copy.
    pub const ASYNC: u32 = 1 << 2;
    /// INFO: CUPTI stamps records with CLOCK_MONOTONIC through the timestamp callback.
    pub const TIMESTAMP_CALLBACK: u32 = 1 << 3;
    /// ERROR: GPU activity is not recorded for this process from here on.
    pub const FATAL: u32 = 1 << 4;
    /// INFO: CUPTI lets several clients subscribe (`cuptiSubscribe_v2`, CUPTI 13.3 with
    /// driver r610 or newer): the library has a subscriber of its own and never yields.
    pub const MULTI_SUBSCRIBER: u32 = 1 << 5;
    /// On a batch's first record: no record of the batch carries text, so the uprobe may
    /// copy it whole ([`super::GpuBatchEvent`]). Says nothing of the record itself.
    pub const BATCH_WITHOUT_TEXT: u32 = 1 << 6;
}

/// What failed, in an ERROR record ([`GpuRecord::stage`]).
pub mod gpu_stage {
    /// libcupti could not be loaded (the text has the loader's message).
    pub const LOAD_CUPTI: u32 = 1;
    /// libcupti lacks a function the injection library needs (named in the text).
    pub const MISSING_FUNCTION: u32 = 2;
    /// `cuptiActivityRegisterCallbacks` failed.
    pub const REGISTER_CALLBACKS: u32 = 3;
    /// `cuptiActivityEnable` failed; `detail` is the activity kind.
    pub const ENABLE_ACTIVITY: u32 = 4;
    /// `cuptiActivityEnableDriverApi` failed; `detail` is the callback id. The GPU records
    /// of that call cannot be linked to it.
    pub const ENABLE_DRIVER_API: u32 = 5;
    /// `cuptiSetThreadIdType` failed: API records' thread ids are not kernel tids.
    pub const THREAD_ID_TYPE: u32 = 6;
    /// `cuptiActivityRegisterTimestampCallback` failed: clock pairs are sent instead.
    pub const TIMESTAMP_CALLBACK: u32 = 7;
    /// `cuptiActivityGetNextRecord` failed inside a buffer: the rest of it is lost.
    pub const READ_BUFFER: u32 = 8;
    /// `cuptiActivityFlushAll` failed.
    pub const FLUSH: u32 = 9;
    /// The chained injection library (`CUDATRACE_INJECT_CHAIN`) failed to load or start.
    pub const CHAIN: u32 = 10;
    /// `cuptiGetTimestamp` failed: no clock pair.
    pub const TIMESTAMP: u32 = 11;
    /// `cuptiActivityGetNumDroppedRecords` failed.
    pub const DROPPED_COUNT: u32 = 12;
    /// Taking CUPTI back after another client let go failed (`detail`: the activity kind,
    /// or 0 for the callbacks): GPU activity is not recorded from here on.
    pub const RESUME: u32 = 13;
    /// The control file (`CUDATRACE_INJECT_CONTROL`) could not be mapped: the library
    /// cannot yield to another CUPTI client of the program.
    pub const CONTROL: u32 = 14;
    /// A late start's window ended and CUPTI refused to switch a kind or driver function
    /// off (`cudatrace run -p PID --gpu`).
    pub const DETACH: u32 = 15;
}

/// One GPU activity record, the same size whatever it describes. Which fields are
/// meaningful depends on [`Self::what`]; the others are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuRecord {
    /// One of [`gpu_record`].
    pub what: u32,
    /// Bits of [`gpu_flags`].
    pub flags: u32,
    /// KERNEL, MEMCPY, MEMSET, API: start in ns ([`gpu_flags::CUPTI_CLOCK`] says which
    /// clock). CLOCK: CUPTI's timestamp.
    pub start: u64,
    /// KERNEL, MEMCPY, MEMSET, API: end in ns. CLOCK: CLOCK_MONOTONIC.
    pub end: u64,
    /// KERNEL, MEMCPY, MEMSET, API: CUPTI's correlation id, shared by a GPU record and the
    /// API record of the driver call that issued it.
    pub correlation_id: u32,
    /// KERNEL, MEMCPY, MEMSET: CUPTI's device, context and stream ids.
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    /// MEMCPY, MEMSET: bytes.
    pub bytes: u64,
    /// KERNEL: grid and block dimensions.
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// KERNEL: static and dynamic shared memory per block, in bytes.
    pub static_shared_mem: u32,
    pub dynamic_shared_mem: u32,
    /// KERNEL: registers per thread.
    pub registers_per_thread: u32,
    /// KERNEL: the id of the NAME record with its name. NAME: the id it defines (from 1).
    pub name_id: u32,
    /// MEMCPY: `CUpti_ActivityMemcpyKind` (1 HtoD, 2 DtoH, 3 HtoA, 4 AtoH, 5 AtoA, 6 AtoD,
    /// 7 DtoA, 8 DtoD, 9 HtoH, 10 PtoP).
    pub copy_kind: u32,
    /// MEMCPY: source memory kind; MEMSET: the memory set (`CUpti_ActivityMemoryKind`:
    /// 1 pageable, 2 pinned, 3 device, 4 array, 5 managed, 6 device static, 7 managed static).
    pub src_kind: u32,
    /// MEMCPY: destination memory kind.
    pub dst_kind: u32,
    /// MEMSET: the value set.
    pub memset_value: u32,
    /// KERNEL, MEMCPY, MEMSET: the graph that ran it, 0 when not in a graph.
    pub graph_id: u32,
    /// MEMCPY: copies this record stands for (more than 1 for `cuMemcpyBatchAsync`).
    pub copy_count: u32,
    /// API: the driver function (`CUpti_driver_api_trace_cbid`).
    pub cbid: u32,
    /// API: the `CUresult` returned. ERROR: the `CUptiResult` (0 when CUPTI was not the
    /// one failing).
    pub result: u32,
    /// API: the process and kernel thread id that made the call.
    pub pid: u32,
    pub tid: u32,
    /// ERROR: one of [`gpu_stage`].
    pub stage: u32,
    /// ERROR: the activity kind or callback id involved. INFO: the CUPTI API version.
    pub detail: u32,
    /// DROPPED: records CUPTI dropped since the previous DROPPED record.
    pub dropped: u64,
    /// NAME, ERROR, INFO: address of the text in the traced process; the uprobe reads
    /// `text_len` bytes from it into [`GpuTextEvent::text`].
    pub text: u64,
    /// Bytes at `text` to read, at most [`GPU_TEXT_LEN`]; 0 when there is no text.
    pub text_len: u32,
    /// The text's whole length; more than `text_len` when it was cut.
    pub text_full_len: u32,
    /// KERNEL, MEMCPY, MEMSET: CUPTI's id of the graph node that ran it, 0 when not in a
    /// graph.
    pub graph_node_id: u64,
}
const _: () = assert!(size_of::<GpuRecord>() == 168);
const _: () = assert!(offset_of!(GpuRecord, bytes) == 40);
const _: () = assert!(offset_of!(GpuRecord, grid) == 48);
const _: () = assert!(offset_of!(GpuRecord, cbid) == 112);
const _: () = assert!(offset_of!(GpuRecord, dropped) == 136);
const _: () = assert!(offset_of!(GpuRecord, text) == 144);
const _: () = assert!(offset_of!(GpuRecord, text_full_len) == 156);

impl GpuRecord {
    /// The clock pair of a CLOCK record.
    pub fn clock_pair(&self) -> Option<ClockPair> {
        (self.what == gpu_record::CLOCK).then_some(ClockPair {
            cupti_ns: self.start,
            monotonic_ns: self.end,
        })
    }
}

/// CUPTI's clock and CLOCK_MONOTONIC read at the same moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockPair {
    pub cupti_ns: u64,
    pub monotonic_ns: u64,
}

impl ClockPair {
    /// A CUPTI timestamp on CLOCK_MONOTONIC. 0 (CUPTI's "no timestamp") stays 0.
    pub fn to_monotonic(&self, cupti_ns: u64) -> u64 {
        if cupti_ns == 0 {
            return 0;
        }
        // Wrapping: the difference may be negative, and two's complement keeps it exact.
        self.monotonic_ns
            .wrapping_add(cupti_ns.wrapping_sub(self.cupti_ns))
    }
}

/// A [`GpuRecord`] in the ring buffer (kind [`crate::kind::GPU`]).
///
/// The header's `ts_ns` is when the uprobe ran, `pid`/`tid` the thread that delivered the
/// batch (a CUPTI or flush thread, not the thread that launched the work: that one is in
/// the API record).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuEvent {
    pub header: EventHeader,
    pub record: GpuRecord,
}
const _: () = assert!(size_of::<GpuEvent>() == 24 + 168);

/// A [`GpuRecord`] with its text (kind [`crate::kind::GPU_TEXT`]): `record.text_len`
/// bytes of `text` are valid (0 with `ENTRY_READ_FAILED` when the read failed), and the
/// header has `DATA_TRUNCATED` when the text was cut.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuTextEvent {
    pub header: EventHeader,
    pub record: GpuRecord,
    pub text: [u8; GPU_TEXT_LEN],
}
const _: () = assert!(size_of::<GpuTextEvent>() == 24 + 168 + GPU_TEXT_LEN);

/// A whole batch of [`GpuRecord`]s without text (kind [`crate::kind::GPU_BATCH`]): the
/// first `count` of `records` are valid. The uprobe copies a batch of two or more records
/// whose first is marked [`gpu_flags::BATCH_WITHOUT_TEXT`] in one read into one ring entry (per record, the copy was
/// about 1 µs of the flushing thread's time on the build VM: a read, a reservation and a
/// submission each); a batch with text goes record by record as [`GpuEvent`]s and
/// [`GpuTextEvent`]s. The header is as [`GpuEvent`]'s.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuBatchEvent {
    pub header: EventHeader,
    pub count: u32,
    pub _pad: u32,
    pub records: [GpuRecord; GPU_BATCH_MAX],
}
const _: () = assert!(size_of::<GpuBatchEvent>() == 24 + 8 + 168 * GPU_BATCH_MAX);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_layout_is_the_documented_one() {
        // docs/gpu.md lists these offsets for decoders; a change must update both.
        let offsets = [
            (offset_of!(GpuRecord, what), 0),
            (offset_of!(GpuRecord, flags), 4),
            (offset_of!(GpuRecord, start), 8),
            (offset_of!(GpuRecord, end), 16),
            (offset_of!(GpuRecord, correlation_id), 24),
            (offset_of!(GpuRecord, device_id), 28),
            (offset_of!(GpuRecord, context_id), 32),
            (offset_of!(GpuRecord, stream_id), 36),
            (offset_of!(GpuRecord, bytes), 40),
            (offset_of!(GpuRecord, grid), 48),
            (offset_of!(GpuRecord, block), 60),
            (offset_of!(GpuRecord, static_shared_mem), 72),
            (offset_of!(GpuRecord, dynamic_shared_mem), 76),
            (offset_of!(GpuRecord, registers_per_thread), 80),
            (offset_of!(GpuRecord, name_id), 84),
            (offset_of!(GpuRecord, copy_kind), 88),
            (offset_of!(GpuRecord, src_kind), 92),
            (offset_of!(GpuRecord, dst_kind), 96),
            (offset_of!(GpuRecord, memset_value), 100),
            (offset_of!(GpuRecord, graph_id), 104),
            (offset_of!(GpuRecord, copy_count), 108),
            (offset_of!(GpuRecord, cbid), 112),
            (offset_of!(GpuRecord, result), 116),
            (offset_of!(GpuRecord, pid), 120),
            (offset_of!(GpuRecord, tid), 124),
            (offset_of!(GpuRecord, stage), 128),
            (offset_of!(GpuRecord, detail), 132),
            (offset_of!(GpuRecord, dropped), 136),
            (offset_of!(GpuRecord, text), 144),
            (offset_of!(GpuRecord, text_len), 152),
            (offset_of!(GpuRecord, text_full_len), 156),
            (offset_of!(GpuRecord, graph_node_id), 160),
        ];
        for (i, (actual, expected)) in offsets.iter().enumerate() {
            assert_eq!(actual, expected, "field {i}");
        }
        // No implicit padding: the fields' sizes add up to the struct's.
        let fields: usize = 2 * 4 + 2 * 8 + 4 * 4 + 8 + 6 * 4 + 10 * 4 + 6 * 4 + 8 + 8 + 2 * 4 + 8;
        assert_eq!(fields, size_of::<GpuRecord>());
        assert_eq!(offset_of!(GpuEvent, record), 24);
        assert_eq!(offset_of!(GpuTextEvent, text), 192);
        assert_eq!(core::mem::align_of::<GpuRecord>(), 8);
    }

    #[test]
    fn clock_pairs_convert_both_ways_exactly() {
        let pair = ClockPair {
            cupti_ns: 1_795_400_000_000_000_000,
            monotonic_ns: 5_000_000_000,
        };
        assert_eq!(pair.to_monotonic(1_795_400_000_000_001_234), 5_000_001_234);
        // Before the pair: the difference is negative.
        assert_eq!(pair.to_monotonic(1_795_399_999_999_999_000), 4_999_999_000);
        assert_eq!(pair.to_monotonic(0), 0);
        let record = GpuRecord {
            what: gpu_record::CLOCK,
            start: 7,
            end: 9,
            ..GpuRecord::default()
        };
        assert_eq!(
            record.clock_pair(),
            Some(ClockPair {
                cupti_ns: 7,
                monotonic_ns: 9
            })
        );
        let kernel = GpuRecord {
            what: gpu_record::KERNEL,
            ..record
        };
        assert_eq!(kernel.clock_pair(), None);
    }
}
