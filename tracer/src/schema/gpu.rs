//! `cudatrace run --gpu`'s lines: what the GPU ran (`gpu_kernel`, `gpu_copy`,
//! `gpu_memset`), each linked to the driver call that issued it, and how GPU recording went
//! in each process (`gpu_info`, `gpu_error`). docs/gpu.md says where they come from.
//!
//! Times are on the trace's clock (CLOCK_MONOTONIC ns, like every `ts_ns`): `ts_ns` is when
//! the GPU started the work and `dur_ns` how long it ran, so the work ended at
//! `ts_ns + dur_ns`. The link to the issuing call is `call_tid` and `call_ts_ns`: the `tid`
//! and `ts_ns` of its `call` line in the same process; both are absent when the record could
//! not be linked, and `unlinked` says why.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::{
    fields::{LineType, Tag, describe},
    footer::{EventLine, Footer},
};

/// Why a GPU line has no link to a call (`unlinked`).
pub mod unlinked {
    /// CUPTI's record of the issuing call never arrived (or was dropped).
    pub const NO_API_RECORD: &str = "no_api_record";
    /// No traced call of that thread encloses CUPTI's record of it (the call event was
    /// lost, or the function is not probed).
    pub const NO_CALL: &str = "no_call";
    /// The call was older than the calls kept per thread for linking (docs/gpu.md).
    pub const BEYOND_WINDOW: &str = "beyond_window";
}

/// Why a launch, copy or memset that the program made has no GPU line, as the footer's
/// `gpu.issuing` counts them (docs/gpu.md, "Every launch accounted for").
pub mod fate {
    /// Its stream was being captured into a graph: its work runs in the graph's launches.
    pub const CAPTURED: &str = "captured";
    /// It returned an error: no work was issued.
    pub const FAILED: &str = "failed";
    /// A copy or memset of 0 bytes: nothing to run (CUPTI records none).
    pub const EMPTY: &str = "empty";
    /// Another CUPTI client of the process held the activity API (`gpu_gap`).
    pub const CUPTI_HELD: &str = "cupti_held";
    /// CUPTI recorded the process's work after it again, but no record of the call came:
    /// its work is among the work lines written unlinked (`no_api_record`). Seen on CUPTI
    /// 13.0 after torch.profiler let go (docs/gpu.md, "Beside another CUPTI client").
    pub const NO_API_RECORD: &str = "no_api_record";
    /// The process ended (a crash, `_exit`, a signal) before CUPTI handed its records over.
    pub const NOT_FLUSHED: &str = "not_flushed";
    /// CUPTI was not recording in the process (it never started there, or failed).
    pub const NOT_RECORDED: &str = "not_recorded";
    /// None of those: CUPTI's records of it never came (see `cupti_dropped`).
    pub const MISSING: &str = "missing";
}

/// `"type":"gpu_kernel"`: a kernel that ran on the GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuKernelLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    pub pid: u32,
    /// CUPTI's device, context and stream ids (the stream id is not the `CUstream`).
    #[serde(default)]
    pub device: u32,
    #[serde(default)]
    pub context: u32,
    #[serde(default)]
    pub stream: u32,
    /// GPU start.
    pub ts_ns: u64,
    /// GPU duration.
    pub dur_ns: u64,
    /// Demangled name, or the name as CUPTI gave it where it is not mangled (`unknown`
    /// when CUPTI gave none).
    pub kernel: String,
    /// The name as CUPTI gave it, where it differs from `kernel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_mangled: Option<String>,
    /// CUPTI's name, where it differs from the launch's: the line keeps the launch's name
    /// (what the program asked the driver for), CUPTI's record may carry a stale one (a
    /// function handle reused for another kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cupti_kernel: Option<String>,
    #[serde(default)]
    pub grid: [u32; 3],
    #[serde(default)]
    pub block: [u32; 3],
    /// Bytes per block.
    #[serde(default)]
    pub static_shared_mem: u32,
    #[serde(default)]
    pub dynamic_shared_mem: u32,
    #[serde(default)]
    pub registers_per_thread: u32,
    #[serde(flatten)]
    pub link: GpuLink,
}

/// `"type":"gpu_copy"`: a memory copy that ran on the GPU (its copy engines).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuCopyLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    pub pid: u32,
    #[serde(default)]
    pub device: u32,
    #[serde(default)]
    pub context: u32,
    #[serde(default)]
    pub stream: u32,
    pub ts_ns: u64,
    pub dur_ns: u64,
    /// CUPTI's direction: `HtoD`, `DtoH`, `DtoD`, `HtoH`, `PtoP` (peer), `HtoA`, `AtoH`,
    /// `AtoA`, `AtoD`, `DtoA`, or `unknown`.
    pub kind: Cow<'static, str>,
    pub bytes: u64,
    /// Memory kinds: `pageable`, `pinned`, `device`, `array`, `managed`, `device_static`,
    /// `managed_static` or `unknown`.
    #[serde(default)]
    pub src_kind: Cow<'static, str>,
    #[serde(default)]
    pub dst_kind: Cow<'static, str>,
    /// Issued by an asynchronous call.
    #[serde(default, rename = "async", skip_serializing_if = "is_false")]
    pub is_async: bool,
    #[serde(flatten)]
    pub link: GpuLink,
}

/// `"type":"gpu_memset"`: a memset that ran on the GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuMemsetLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    pub pid: u32,
    #[serde(default)]
    pub device: u32,
    #[serde(default)]
    pub context: u32,
    #[serde(default)]
    pub stream: u32,
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub bytes: u64,
    #[serde(default)]
    pub value: u32,
    /// The memory set (memory kinds as in `gpu_copy`).
    #[serde(default)]
    pub memory: Cow<'static, str>,
    #[serde(default, rename = "async", skip_serializing_if = "is_false")]
    pub is_async: bool,
    #[serde(flatten)]
    pub link: GpuLink,
}

fn is_false(flag: &bool) -> bool {
    !*flag
}

/// What every GPU activity line ends with: the ids that tie it to its call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuLink {
    /// CUPTI's id of the issuing call, shared by all the work one call issued (the kernels
    /// of a graph launch); per process.
    pub correlation_id: u32,
    /// The graph the work ran in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_id: Option<u32>,
    /// CUPTI's id of the graph node that ran it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_node_id: Option<u64>,
    /// The issuing call's line: its `tid` and `ts_ns`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_tid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_ts_ns: Option<u64>,
    /// Work of a graph: the captured call that made its node (a launch, copy or memset
    /// made while its stream was captured), its `call` line's `tid` and `ts_ns`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_call_tid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_call_ts_ns: Option<u64>,
    /// From the end of the issuing call (as CUPTI timed it) to the GPU start; negative
    /// when the GPU started before the call returned. Absent without CUPTI's record of the
    /// call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_ns: Option<i64>,
    /// Why `call_tid`/`call_ts_ns` are absent ([`unlinked`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unlinked: Option<Cow<'static, str>>,
    /// `name_truncated` (the kernel name was cut at 4 KiB), `no_timestamps` (CUPTI could
    /// not time the work: `ts_ns` and `dur_ns` are 0), `no_clock` (times on CUPTI's clock
    /// with nothing to convert them: 0 too).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Cow<'static, str>>,
}

impl GpuLink {
    /// The issuing call's line, `(tid, ts_ns)`.
    pub fn call(&self) -> Option<(u32, u64)> {
        Some((self.call_tid?, self.call_ts_ns?))
    }

    /// Work of a graph: the captured call that made its node, `(tid, ts_ns)`.
    pub fn capture_call(&self) -> Option<(u32, u64)> {
        Some((self.capture_call_tid?, self.capture_call_ts_ns?))
    }

    /// Whether the work has GPU times (no `no_timestamps`/`no_clock` warning).
    pub fn timed(&self) -> bool {
        !self
            .warnings
            .iter()
            .any(|w| w == "no_timestamps" || w == "no_clock")
    }
}

/// `"type":"gpu_info"`: GPU recording started in a process (at its `cuInit`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuInfoLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    pub pid: u32,
    /// When cudatrace received it.
    pub ts_ns: u64,
    /// CUPTI's API version (`cuptiGetVersion`: 130001 for CUDA 13.0 Update 1).
    pub cupti_version: u32,
    /// The libcupti the process loaded.
    pub libcupti: String,
    /// `monotonic`: CUPTI stamps records with CLOCK_MONOTONIC (its timestamp callback);
    /// `converted`: CUPTI's own clock, converted with clock pairs.
    pub clock: Cow<'static, str>,
    /// `single`: CUPTI allows one activity client in the process; another one (the
    /// program's own profiler) takes recording away until it lets go (`gpu_gap` lines).
    /// `multiple`: cudatrace has a subscriber of its own beside the program's.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub subscribers: Cow<'static, str>,
}

/// `"type":"gpu_gap"`: another CUPTI client of the process (the program's own profiler)
/// held the activity API, and GPU work issued meanwhile was not recorded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuGapLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    pub pid: u32,
    /// When the other client took it: its `cuptiActivityRegisterCallbacks` call's `ts_ns`.
    pub from_ns: u64,
    /// When cudatrace had it back (absent: not before the process ended).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_ns: Option<u64>,
    /// The thread of that call.
    pub tid: u32,
    /// Launches, copies and memsets of the process from `from_ns` to `to_ns` whose work
    /// has no GPU line.
    pub calls: u64,
    /// Of those before `from_ns` whose records CUPTI still held when the other client
    /// took over (they went to it).
    pub handed_over: u64,
}

/// `"type":"gpu_error"`: something failed in a process's GPU recording.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuErrorLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    pub pid: u32,
    pub ts_ns: u64,
    /// What failed: `load_cupti`, `missing_function`, `register_callbacks`,
    /// `enable_activity`, `enable_driver_api`, `thread_id_type`, `timestamp_callback`,
    /// `read_buffer`, `flush`, `chain`, `timestamp`, `dropped_count` (docs/gpu.md).
    pub stage: Cow<'static, str>,
    /// CUPTI's result code (0 when CUPTI was not the one failing).
    pub result: u32,
    /// The activity kind or callback id involved.
    pub detail: u32,
    /// GPU activity is not recorded for this process from here on.
    pub fatal: bool,
    pub message: String,
}

/// Any `--gpu` line, as the writer takes it and readers get it back.
#[derive(Clone, Debug, PartialEq)]
pub enum GpuLine {
    Kernel(GpuKernelLine),
    Copy(GpuCopyLine),
    Memset(GpuMemsetLine),
    Info(GpuInfoLine),
    Error(GpuErrorLine),
    Gap(GpuGapLine),
}

/// Kernels, copies and memsets: work that ran on a GPU, with its times and link.
pub struct GpuWork<'a> {
    pub pid: u32,
    pub device: u32,
    pub stream: u32,
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub link: &'a GpuLink,
}

impl GpuLine {
    /// The work's place and times, for kernels, copies and memsets.
    pub fn work(&self) -> Option<GpuWork<'_>> {
        let (pid, device, stream, ts_ns, dur_ns, link) = match self {
            GpuLine::Kernel(k) => (k.pid, k.device, k.stream, k.ts_ns, k.dur_ns, &k.link),
            GpuLine::Copy(c) => (c.pid, c.device, c.stream, c.ts_ns, c.dur_ns, &c.link),
            GpuLine::Memset(m) => (m.pid, m.device, m.stream, m.ts_ns, m.dur_ns, &m.link),
            GpuLine::Info(_) | GpuLine::Error(_) | GpuLine::Gap(_) => return None,
        };
        Some(GpuWork {
            pid,
            device,
            stream,
            ts_ns,
            dur_ns,
            link,
        })
    }

    /// The process the line is about.
    pub fn pid(&self) -> u32 {
        match self {
            GpuLine::Kernel(k) => k.pid,
            GpuLine::Copy(c) => c.pid,
            GpuLine::Memset(m) => m.pid,
            GpuLine::Info(i) => i.pid,
            GpuLine::Error(e) => e.pid,
            GpuLine::Gap(g) => g.pid,
        }
    }

    pub fn link_mut(&mut self) -> Option<&mut GpuLink> {
        match self {
            GpuLine::Kernel(k) => Some(&mut k.link),
            GpuLine::Copy(c) => Some(&mut c.link),
            GpuLine::Memset(m) => Some(&mut m.link),
            GpuLine::Info(_) | GpuLine::Error(_) | GpuLine::Gap(_) => None,
        }
    }

    /// Parses a line whose `"type"` is `kind`, one of the five above; `None` for another.
    pub(super) fn read(kind: &str, bytes: &[u8]) -> Option<Result<Self, String>> {
        fn read<T: for<'de> Deserialize<'de>>(kind: &str, bytes: &[u8]) -> Result<T, String> {
            serde_json::from_slice(bytes).map_err(|e| format!("{kind} line: {}", describe(&e)))
        }
        Some(match kind {
            GpuKernelLine::TYPE => read(kind, bytes).map(GpuLine::Kernel),
            GpuCopyLine::TYPE => read(kind, bytes).map(GpuLine::Copy),
            GpuMemsetLine::TYPE => read(kind, bytes).map(GpuLine::Memset),
            GpuInfoLine::TYPE => read(kind, bytes).map(GpuLine::Info),
            GpuErrorLine::TYPE => read(kind, bytes).map(GpuLine::Error),
            GpuGapLine::TYPE => read(kind, bytes).map(GpuLine::Gap),
            _ => return None,
        })
    }
}

/// Openings of the lines that come as often as launches: parsed in one pass, like calls.
pub const FAST_PREFIXES: [(&[u8], &str); 3] = [
    (br#"{"type":"gpu_kernel","#, GpuKernelLine::TYPE),
    (br#"{"type":"gpu_copy","#, GpuCopyLine::TYPE),
    (br#"{"type":"gpu_memset","#, GpuMemsetLine::TYPE),
];

impl LineType for GpuKernelLine {
    const TYPE: &'static str = "gpu_kernel";
}
impl LineType for GpuCopyLine {
    const TYPE: &'static str = "gpu_copy";
}
impl LineType for GpuMemsetLine {
    const TYPE: &'static str = "gpu_memset";
}
impl LineType for GpuInfoLine {
    const TYPE: &'static str = "gpu_info";
}
impl LineType for GpuErrorLine {
    const TYPE: &'static str = "gpu_error";
}
impl LineType for GpuGapLine {
    const TYPE: &'static str = "gpu_gap";
}

impl EventLine for GpuKernelLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.gpu_kernel += 1;
    }
}
impl EventLine for GpuCopyLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.gpu_copy += 1;
    }
}
impl EventLine for GpuMemsetLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.gpu_memset += 1;
    }
}
impl EventLine for GpuInfoLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.gpu_info += 1;
    }
}
impl EventLine for GpuErrorLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.gpu_error += 1;
    }
}
impl EventLine for GpuGapLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.gpu_gap += 1;
    }
}
