//! Decoding `--gpu` records (docs/gpu.md, "The record"): each process's kernel names
//! (NAME records) and clock pairs (CLOCK) are kept here, so a KERNEL, MEMCPY or MEMSET
//! record becomes its line with a name and times on the trace's clock. The link to the
//! issuing call is the enrich stage's work (`analysis::gpu_link`): the lines leave here
//! unlinked, and CUPTI's records of the calls (API) go there as [`ApiRecord`]s.

use std::{borrow::Cow, collections::HashMap, sync::Arc};

use tracer_common::{ClockPair, GpuRecord, client, flags, gpu_flags, gpu_record, gpu_stage};

use super::raw::RawGpu;
use crate::schema::{
    GpuCopyLine, GpuErrorLine, GpuInfoLine, GpuKernelLine, GpuLine, GpuLink, GpuMemsetLine,
};

/// CUPTI's record of a driver call that issued GPU work: what links that work to the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiRecord {
    pub pid: u32,
    /// The calling thread (a kernel tid: the injection library asks CUPTI for those).
    pub tid: u32,
    pub correlation_id: u32,
    /// When the call started and returned, on the trace's clock.
    pub start_ns: u64,
    pub end_ns: u64,
    /// `CUpti_driver_api_trace_cbid`.
    pub cbid: u32,
    /// The `CUresult` returned.
    pub result: u32,
}

/// What the injection library said of itself when recording started in a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Session {
    pub pid: u32,
    /// The library's own `getpid()`: its slot in the control file.
    pub library_pid: u32,
    /// The buffer-request callback it registers with CUPTI (another client's differs).
    pub callback: u64,
    /// It has a subscriber of its own beside others (it never yields).
    pub multi_subscriber: bool,
}

/// A decoded GPU record.
#[derive(Clone, Debug, PartialEq)]
pub enum GpuEvent {
    /// A line to be: work (unlinked, its kernel name as CUPTI gave it), or a status line.
    Line(GpuLine),
    /// Recording started in a process: its `gpu_info` line and what cudatrace needs to
    /// follow other CUPTI clients there.
    Started(GpuInfoLine, Session),
    /// CUPTI's record of a call.
    Api(ApiRecord),
    /// CUPTI dropped records in this process.
    Dropped { pid: u32, count: u64 },
    /// The library yielded CUPTI to another client (`resumed` false) or took it back, at
    /// `ts_ns` (CLOCK_MONOTONIC).
    Client { pid: u32, resumed: bool, ts_ns: u64 },
    /// A late start (`-p PID --gpu`) records from `ts_ns` on (CLOCK_MONOTONIC).
    Attached { pid: u32, ts_ns: u64 },
    /// A late start's window ended at `ts_ns`: the library records nothing more.
    Detached { pid: u32, ts_ns: u64 },
    /// A late start found another CUPTI client holding CUPTI at `ts_ns`, and took nothing.
    HeldAtAttach { pid: u32, ts_ns: u64 },
}

/// What a record gave.
#[derive(Debug, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one record at a time, on the stack from decode to the enrich stage, like calls"
)]
pub enum GpuDecoded {
    Event(GpuEvent),
    /// Kept for later records (a name, a clock pair).
    Consumed,
    /// A record of a kind this version does not know.
    Unknown,
}

#[derive(Default)]
struct Process {
    /// Kernel names by id: (text, cut short).
    names: HashMap<u32, (Arc<str>, bool)>,
    /// The latest clock pair, for records on CUPTI's clock.
    clock: Option<ClockPair>,
}

/// Per-process state of GPU decoding; forgotten at the process's exec and exit.
#[derive(Default)]
pub struct GpuDecoder {
    processes: HashMap<u32, Process>,
}

/// CUPTI's memcpy kinds, from 1.
const COPY_KINDS: [&str; 10] = [
    "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP",
];
/// CUPTI's memory kinds, from 1.
const MEMORY_KINDS: [&str; 7] = [
    "pageable",
    "pinned",
    "device",
    "array",
    "managed",
    "device_static",
    "managed_static",
];
const STAGES: [&str; 15] = [
    "load_cupti",
    "missing_function",
    "register_callbacks",
    "enable_activity",
    "enable_driver_api",
    "thread_id_type",
    "timestamp_callback",
    "read_buffer",
    "flush",
    "chain",
    "timestamp",
    "dropped_count",
    "resume",
    "control",
    "detach",
];

fn name_of(table: &'static [&'static str], value: u32) -> Cow<'static, str> {
    match value.checked_sub(1).and_then(|i| table.get(i as usize)) {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Borrowed("unknown"),
    }
}

/// The name of an ERROR record's stage (`gpu_stage`).
pub fn stage_name(stage: u32) -> Cow<'static, str> {
    debug_assert_eq!(STAGES.len() as u32, gpu_stage::DETACH);
    match stage.checked_sub(1).and_then(|i| STAGES.get(i as usize)) {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Owned(format!("stage {stage}")),
    }
}

impl GpuDecoder {
    /// Decodes one record of process `raw.header.pid`.
    pub fn decode(&mut self, raw: RawGpu) -> GpuDecoded {
        let pid = raw.header.pid;
        let record = &raw.record;
        let text = || {
            raw.text
                .as_deref()
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
                .unwrap_or_default()
        };
        let event = match record.what {
            gpu_record::NAME => {
                let cut = raw.header.flags & (flags::DATA_TRUNCATED | flags::ENTRY_READ_FAILED)
                    != 0
                    || record.text_full_len > record.text_len;
                self.processes
                    .entry(pid)
                    .or_default()
                    .names
                    .insert(record.name_id, (text().into(), cut));
                return GpuDecoded::Consumed;
            }
            gpu_record::CLOCK => {
                self.processes.entry(pid).or_default().clock = record.clock_pair();
                return GpuDecoded::Consumed;
            }
            gpu_record::KERNEL | gpu_record::MEMCPY | gpu_record::MEMSET => {
                GpuEvent::Line(self.work(pid, record))
            }
            gpu_record::API => {
                let (start_ns, end_ns, _) = self.times(pid, record);
                GpuEvent::Api(ApiRecord {
                    pid,
                    tid: record.tid,
                    correlation_id: record.correlation_id,
                    start_ns,
                    end_ns,
                    cbid: record.cbid,
                    result: record.result,
                })
            }
            gpu_record::DROPPED => GpuEvent::Dropped {
                pid,
                count: record.dropped,
            },
            gpu_record::ERROR => GpuEvent::Line(GpuLine::Error(GpuErrorLine {
                pid,
                ts_ns: raw.header.ts_ns,
                stage: stage_name(record.stage),
                result: record.result,
                detail: record.detail,
                fatal: record.flags & gpu_flags::FATAL != 0,
                message: text(),
                ..GpuErrorLine::default()
            })),
            gpu_record::INFO => {
                let multi_subscriber = record.flags & gpu_flags::MULTI_SUBSCRIBER != 0;
                let line = GpuInfoLine {
                    pid,
                    ts_ns: raw.header.ts_ns,
                    cupti_version: record.detail,
                    libcupti: text(),
                    clock: if record.flags & gpu_flags::TIMESTAMP_CALLBACK != 0 {
                        "monotonic".into()
                    } else {
                        "converted".into()
                    },
                    subscribers: if multi_subscriber {
                        "multiple".into()
                    } else {
                        "single".into()
                    },
                    ..GpuInfoLine::default()
                };
                let session = Session {
                    pid,
                    library_pid: record.pid,
                    callback: record.start,
                    multi_subscriber,
                };
                GpuEvent::Started(line, session)
            }
            gpu_record::CLIENT => match record.detail {
                client::ATTACHED => GpuEvent::Attached {
                    pid,
                    ts_ns: record.start,
                },
                client::DETACHED => GpuEvent::Detached {
                    pid,
                    ts_ns: record.start,
                },
                client::HELD_AT_ATTACH => GpuEvent::HeldAtAttach {
                    pid,
                    ts_ns: record.start,
                },
                detail => GpuEvent::Client {
                    pid,
                    resumed: detail == client::RESUMED,
                    ts_ns: record.start,
                },
            },
            _ => return GpuDecoded::Unknown,
        };
        GpuDecoded::Event(event)
    }

    /// The process exec'd or exited: its names and clock are gone with it.
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }

    /// `(start, end, warning)` on the trace's clock.
    fn times(&self, pid: u32, record: &GpuRecord) -> (u64, u64, Option<&'static str>) {
        if record.flags & gpu_flags::NO_TIMESTAMPS != 0 {
            return (0, 0, Some("no_timestamps"));
        }
        if record.flags & gpu_flags::CUPTI_CLOCK == 0 {
            return (record.start, record.end, None);
        }
        match self.processes.get(&pid).and_then(|p| p.clock) {
            Some(pair) => (
                pair.to_monotonic(record.start),
                pair.to_monotonic(record.end),
                None,
            ),
            None => (0, 0, Some("no_clock")),
        }
    }

    fn work(&self, pid: u32, record: &GpuRecord) -> GpuLine {
        let (ts_ns, end, warning) = self.times(pid, record);
        let mut link = GpuLink {
            correlation_id: record.correlation_id,
            graph_id: (record.graph_id != 0).then_some(record.graph_id),
            graph_node_id: (record.graph_node_id != 0).then_some(record.graph_node_id),
            ..GpuLink::default()
        };
        link.warnings.extend(warning.map(Cow::Borrowed));
        let dur_ns = end.saturating_sub(ts_ns);
        let is_async = record.flags & gpu_flags::ASYNC != 0;
        match record.what {
            gpu_record::KERNEL => {
                let name = self
                    .processes
                    .get(&pid)
                    .and_then(|p| p.names.get(&record.name_id));
                let kernel = match name {
                    Some((text, _)) if text.is_empty() => {
                        link.warnings.push("name_truncated".into());
                        "unknown".to_owned()
                    }
                    Some((text, cut)) => {
                        if *cut {
                            link.warnings.push("name_truncated".into());
                        }
                        text.to_string()
                    }
                    None => "unknown".to_owned(),
                };
                GpuLine::Kernel(GpuKernelLine {
                    pid,
                    device: record.device_id,
                    context: record.context_id,
                    stream: record.stream_id,
                    ts_ns,
                    dur_ns,
                    kernel,
                    kernel_mangled: None,
                    grid: record.grid,
                    block: record.block,
                    static_shared_mem: record.static_shared_mem,
                    dynamic_shared_mem: record.dynamic_shared_mem,
                    registers_per_thread: record.registers_per_thread,
                    link,
                    ..GpuKernelLine::default()
                })
            }
            gpu_record::MEMCPY => GpuLine::Copy(GpuCopyLine {
                pid,
                device: record.device_id,
                context: record.context_id,
                stream: record.stream_id,
                ts_ns,
                dur_ns,
                kind: name_of(&COPY_KINDS, record.copy_kind),
                bytes: record.bytes,
                src_kind: name_of(&MEMORY_KINDS, record.src_kind),
                dst_kind: name_of(&MEMORY_KINDS, record.dst_kind),
                is_async,
                link,
                ..GpuCopyLine::default()
            }),
            _ => GpuLine::Memset(GpuMemsetLine {
                pid,
                device: record.device_id,
                context: record.context_id,
                stream: record.stream_id,
                ts_ns,
                dur_ns,
                bytes: record.bytes,
                value: record.memset_value,
                memory: name_of(&MEMORY_KINDS, record.src_kind),
                is_async,
                link,
                ..GpuMemsetLine::default()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::EventHeader;

    fn raw(pid: u32, record: GpuRecord, text: Option<&str>) -> RawGpu {
        RawGpu {
            header: EventHeader {
                pid,
                ts_ns: 42,
                ..EventHeader::default()
            },
            record,
            text: text.map(|t| t.as_bytes().to_vec()),
        }
    }

    fn line(decoded: GpuDecoded) -> GpuLine {
        match decoded {
            GpuDecoded::Event(GpuEvent::Line(line)) => line,
            other => panic!("not a line: {other:?}"),
        }
    }

    #[test]
    fn kernels_get_their_process_name_and_times() {
        let mut decoder = GpuDecoder::default();
        let name = GpuRecord {
            what: gpu_record::NAME,
            name_id: 1,
            text_len: 9,
            text_full_len: 9,
            ..GpuRecord::default()
        };
        assert_eq!(
            decoder.decode(raw(7, name, Some("_Z4gemmv"))),
            GpuDecoded::Consumed
        );
        let kernel = GpuRecord {
            what: gpu_record::KERNEL,
            start: 1000,
            end: 1500,
            correlation_id: 3,
            device_id: 1,
            context_id: 2,
            stream_id: 7,
            grid: [4, 2, 1],
            block: [128, 1, 1],
            static_shared_mem: 512,
            dynamic_shared_mem: 64,
            registers_per_thread: 40,
            name_id: 1,
            ..GpuRecord::default()
        };
        let GpuLine::Kernel(line7) = line(decoder.decode(raw(7, kernel, None))) else {
            panic!()
        };
        assert_eq!(
            (line7.kernel.as_str(), line7.ts_ns, line7.dur_ns),
            ("_Z4gemmv", 1000, 500)
        );
        assert_eq!((line7.device, line7.context, line7.stream), (1, 2, 7));
        assert_eq!((line7.grid, line7.block), ([4, 2, 1], [128, 1, 1]));
        assert_eq!(line7.link.correlation_id, 3);
        assert!(line7.link.warnings.is_empty());
        // Another process's id 1 is another name, or none.
        let GpuLine::Kernel(line8) = line(decoder.decode(raw(8, kernel, None))) else {
            panic!()
        };
        assert_eq!(line8.kernel, "unknown");
        decoder.forget(7);
        let GpuLine::Kernel(after) = line(decoder.decode(raw(7, kernel, None))) else {
            panic!()
        };
        assert_eq!(after.kernel, "unknown");
    }

    #[test]
    fn cupti_clock_times_are_converted_with_the_latest_pair() {
        let mut decoder = GpuDecoder::default();
        let copy = GpuRecord {
            what: gpu_record::MEMCPY,
            flags: gpu_flags::CUPTI_CLOCK | gpu_flags::ASYNC,
            start: 1_795_400_000_000_002_000,
            end: 1_795_400_000_000_003_000,
            copy_kind: 2,
            src_kind: 3,
            dst_kind: 2,
            bytes: 4096,
            ..GpuRecord::default()
        };
        let GpuLine::Copy(unconverted) = line(decoder.decode(raw(1, copy, None))) else {
            panic!()
        };
        assert_eq!((unconverted.ts_ns, unconverted.dur_ns), (0, 0));
        assert_eq!(unconverted.link.warnings, ["no_clock"]);
        let clock = GpuRecord {
            what: gpu_record::CLOCK,
            start: 1_795_400_000_000_000_000,
            end: 5_000_000_000,
            ..GpuRecord::default()
        };
        assert_eq!(decoder.decode(raw(1, clock, None)), GpuDecoded::Consumed);
        let GpuLine::Copy(copy) = line(decoder.decode(raw(1, copy, None))) else {
            panic!()
        };
        assert_eq!((copy.ts_ns, copy.dur_ns), (5_000_002_000, 1000));
        assert_eq!(
            (
                copy.kind.as_ref(),
                copy.src_kind.as_ref(),
                copy.dst_kind.as_ref()
            ),
            ("DtoH", "device", "pinned")
        );
        assert!(copy.is_async);
        assert!(copy.link.warnings.is_empty());
    }

    #[test]
    fn status_records_become_lines_and_unknown_ones_are_said() {
        let mut decoder = GpuDecoder::default();
        let error = GpuRecord {
            what: gpu_record::ERROR,
            flags: gpu_flags::FATAL,
            stage: gpu_stage::ENABLE_ACTIVITY,
            result: 35,
            detail: 10,
            ..GpuRecord::default()
        };
        let GpuLine::Error(error) = line(decoder.decode(raw(3, error, Some("refused")))) else {
            panic!()
        };
        assert_eq!(
            (
                error.stage.as_ref(),
                error.result,
                error.fatal,
                error.message.as_str()
            ),
            ("enable_activity", 35, true, "refused")
        );
        let info = GpuRecord {
            what: gpu_record::INFO,
            flags: gpu_flags::TIMESTAMP_CALLBACK,
            detail: 130001,
            start: 0x7f00_1234,
            pid: 33,
            ..GpuRecord::default()
        };
        let GpuDecoded::Event(GpuEvent::Started(info, session)) =
            decoder.decode(raw(3, info, Some("/x/libcupti.so.13")))
        else {
            panic!()
        };
        assert_eq!(
            session,
            Session {
                pid: 3,
                library_pid: 33,
                callback: 0x7f00_1234,
                multi_subscriber: false
            }
        );
        assert_eq!(info.subscribers, "single");
        let multi = GpuRecord {
            what: gpu_record::INFO,
            flags: gpu_flags::MULTI_SUBSCRIBER,
            ..GpuRecord::default()
        };
        let GpuDecoded::Event(GpuEvent::Started(multi, session)) =
            decoder.decode(raw(3, multi, None))
        else {
            panic!()
        };
        assert!(session.multi_subscriber);
        assert_eq!(
            (multi.subscribers.as_ref(), multi.clock.as_ref()),
            ("multiple", "converted")
        );
        let client = GpuRecord {
            what: gpu_record::CLIENT,
            detail: tracer_common::client::RESUMED,
            start: 99,
            ..GpuRecord::default()
        };
        assert_eq!(
            decoder.decode(raw(3, client, None)),
            GpuDecoded::Event(GpuEvent::Client {
                pid: 3,
                resumed: true,
                ts_ns: 99
            })
        );
        assert_eq!(
            (
                info.cupti_version,
                info.libcupti.as_str(),
                info.clock.as_ref()
            ),
            (130001, "/x/libcupti.so.13", "monotonic")
        );
        let dropped = GpuRecord {
            what: gpu_record::DROPPED,
            dropped: 9,
            ..GpuRecord::default()
        };
        assert_eq!(
            decoder.decode(raw(3, dropped, None)),
            GpuDecoded::Event(GpuEvent::Dropped { pid: 3, count: 9 })
        );
        let odd = GpuRecord {
            what: 99,
            ..GpuRecord::default()
        };
        assert_eq!(decoder.decode(raw(3, odd, None)), GpuDecoded::Unknown);
        assert_eq!(stage_name(12), "dropped_count");
        assert_eq!(stage_name(14), "control");
        assert_eq!(stage_name(40), "stage 40");
    }
}
