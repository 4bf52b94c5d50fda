//! `"type":"header"`: the trace's first line. What was traced, on which clock, with which
//! probes on which library.
//!
//! Readers take what viewers need (`command`, `pids`, the clock's start, the probes'
//! families); the other fields are for people and other tools, and are skipped when read,
//! so a trace stays readable whatever they hold.

use serde::{Deserialize, Serialize};

use super::{
    fields::{LineType, Tag},
    power::PowerInfo,
};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Header {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    /// Always `cudatrace`.
    #[serde(skip_deserializing)]
    pub format: String,
    /// [`super::FORMAT_VERSION`].
    #[serde(skip_deserializing)]
    pub version: u32,
    #[serde(skip_deserializing)]
    pub cudatrace_version: String,
    /// `command`, `pid` (-p) or `all` (--all).
    #[serde(skip_deserializing)]
    pub mode: String,
    pub command: Vec<String>,
    /// The processes traced from the start, the command's first.
    pub pids: Vec<u32>,
    #[serde(skip_deserializing)]
    pub start_wall: String,
    #[serde(skip_deserializing)]
    pub start_wall_ns: u64,
    /// Event `ts_ns` values are on this clock; wall = start_wall_ns + (ts_ns - start_monotonic_ns).
    #[serde(skip_deserializing)]
    pub clock: String,
    /// Taken before the probes were attached: no event is earlier. Absent from some
    /// hand-written traces (time 0 then).
    pub start_monotonic_ns: Option<u64>,
    #[serde(skip_deserializing)]
    pub host: String,
    #[serde(skip_deserializing)]
    pub kernel: String,
    /// `--functions`: `catalog`, `all`, or the patterns given.
    #[serde(skip_deserializing)]
    pub functions: String,
    /// `--launch-entry-only`: the launches (probes marked `entry_only`) were probed at
    /// entry alone, and their call lines have no `ret` nor `dur_ns`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub launch_entry_only: bool,
    /// The first libcuda attached at start (each file attached has a `library` line).
    #[serde(skip_deserializing)]
    pub libcuda: LibcudaInfo,
    /// Where the probes go and how they are attached.
    #[serde(skip_deserializing)]
    pub attach: AttachInfo,
    #[serde(skip_deserializing)]
    pub ring_bytes: u32,
    pub probes: Vec<ProbeInfo>,
    #[serde(skip_deserializing)]
    pub missing_functions: Vec<String>,
    #[serde(skip_deserializing)]
    pub aliases: Vec<(String, String)>,
    #[serde(skip_deserializing)]
    pub attach_failures: Vec<AttachFailureInfo>,
    /// `--kernel`: the driver hooks in use.
    #[serde(skip_serializing_if = "Option::is_none", skip_deserializing)]
    pub kernel_hooks: Option<KernelHooksInfo>,
    /// `--power`: the NVML library and the sampled GPUs (readers use it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerInfo>,
    /// `--gpu`: what was injected. Readers take its presence: GPU lines will follow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuHeaderInfo>,
    /// `--start-at`/`--duration`: the window recorded, on both clocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowInfo>,
    /// The launcher's job ids in cudatrace's environment ([`JOB_ID_VARIABLES`] that are
    /// set): traces of one run have the same (`analysis::ranks::runs`).
    #[serde(
        skip_serializing_if = "std::collections::BTreeMap::is_empty",
        skip_deserializing
    )]
    pub job_ids: std::collections::BTreeMap<String, String>,
    /// `--stacks`: which calls get Python stacks. Readers take its presence: `stack` lines
    /// and call lines' `stack` may follow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks: Option<StacksInfo>,
}

/// `--start-at`/`--duration`: the lines written are those of this window (a call by its
/// start, GPU work by its call's); the end is absent without `--duration`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WindowInfo {
    pub start_wall: String,
    pub start_wall_ns: u64,
    /// The start on the trace's clock (`ts_ns`), from the header's own pair of clocks.
    pub start_monotonic_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_wall: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_wall_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_monotonic_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ns: Option<u64>,
}

impl WindowInfo {
    /// Whether an event at `ts_ns` (the trace's clock) is in the window.
    pub fn contains(&self, ts_ns: u64) -> bool {
        ts_ns >= self.start_monotonic_ns && self.end_monotonic_ns.is_none_or(|end| ts_ns < end)
    }
}

/// The header's `stacks` object (`--stacks`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StacksInfo {
    /// The families whose calls get a stack (`launch`, `alloc`, `copy`, `memset`, `sync`,
    /// `module`, `collective`), or `all`.
    pub families: Vec<String>,
    /// The frame budget: a stack deeper than this keeps its innermost `depth` frames and is
    /// marked `cut`.
    pub depth: u32,
    /// `--stack-every N`: each call's stack was walked with a chance of 1 in N, drawn at
    /// random; the others have none (the footer's `sampled_out`). Absent: every call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub every: Option<u32>,
    /// `--stack-rate HZ`: at most HZ calls a second per thread had their stack walked; the
    /// others have none (the footer's `rate_limited`). Absent: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<u32>,
}

impl StacksInfo {
    /// N of `--stack-every` (1: every call).
    pub fn every(&self) -> u32 {
        self.every.unwrap_or(1).max(1)
    }
}

/// The environment variables that name a launcher's job: Slurm's, torchrun's (set for its
/// workers, and for a cudatrace it starts), PBS's, LSF's, Flux's.
pub const JOB_ID_VARIABLES: [&str; 5] = [
    "SLURM_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "PBS_JOBID",
    "LSB_JOBID",
    "FLUX_JOB_ID",
];

impl LineType for Header {
    const TYPE: &'static str = "header";
}

impl Header {
    pub(super) fn read(bytes: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("header line: {e}"))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LibcudaInfo {
    pub path: String,
    pub version: Option<String>,
    /// True when tracing cudatrace's stand-in library, not NVIDIA's driver.
    pub standin: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AttachInfo {
    /// `process`: into each traced process only (uprobe_multi with a pid filter);
    /// `host`: into every process that maps the library (`--all`, or kernels without
    /// uprobe_multi), untraced processes' calls being dropped after the trap.
    pub scope: String,
    /// `uprobe_multi` (links for many symbols each, Linux 6.6+), `perf_event` (one link
    /// per symbol), or `uprobe_multi+perf_event` (some symbols went to per-symbol links).
    pub mechanism: String,
    /// Why uprobe_multi is not used, where it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
    /// The kernel's error for the first uprobe_multi link it refused at start (a function
    /// it cannot probe fails a whole link): the refused functions are in
    /// `attach_failures`, the others were attached with smaller links.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// One attached symbol.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeInfo {
    /// The attach cookie.
    #[serde(skip_deserializing)]
    pub id: u32,
    /// The library file's id (its `library` line).
    #[serde(default)]
    pub lib: u32,
    /// The exported symbol.
    pub symbol: String,
    /// The catalog function it belongs to; outside the catalog, the symbol itself.
    #[serde(skip_deserializing)]
    pub function: String,
    /// `init`, `context`, `memory`, ... (the catalog's `Family`); `other` for functions
    /// outside the catalog, probed generically.
    pub family: String,
    /// Probed at entry alone (`--launch-entry-only`): its calls have no `ret`, `dur_ns`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub entry_only: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AttachFailureInfo {
    pub symbol: String,
    pub error: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelHooksInfo {
    /// `kprobe` or `tracepoint`.
    pub mechanism: String,
    /// Why it was chosen.
    pub reason: String,
    /// Kernel functions with kprobes (kprobe mechanism).
    pub functions: Vec<String>,
    /// Whether `nvidia:nvidia_dev_xid` is attached.
    pub xid: bool,
    /// Files whose path starts with this are NVIDIA device files.
    pub device_prefix: String,
}

/// `--gpu`: the injection library and the libcupti it loads in the traced processes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuHeaderInfo {
    /// The injection library as written for this run (removed at its end).
    pub library: String,
    /// The libcupti named to it.
    pub libcupti: String,
    /// Where that libcupti was found: `--cupti`, `python wheels (PYTHON)`, `CUDA toolkit`
    /// or `loader`.
    pub libcupti_from: String,
    /// The command's `CUDA_VISIBLE_DEVICES` when the run started (absent: unset): which
    /// GPU each CUDA device of the `gpu_*` lines is (`analysis::device_map`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_visible_devices: Option<String>,
    /// The command's `CUDA_DEVICE_ORDER` (absent: unset).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_device_order: Option<String>,
    /// `cupti`: the launches are probed at entry alone, and each launch line's `ret` and
    /// `dur_ns` come from CUPTI's record of the call (absent from lines CUPTI recorded
    /// no call for). Absent in traces of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_results: Option<String>,
    /// The injection library a user's own `CUDA_INJECTION64_PATH` named, started after
    /// cudatrace's (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chained: Option<String>,
}

/// The one check of a trace's first line, for every reader: a cudatrace header of a
/// version this cudatrace reads (1 to [`super::FORMAT_VERSION`]). Returns the version;
/// the error names what was found (`version -1`, `version "5"`, `version 1e20`).
pub fn check_header(first_line: &[u8]) -> Result<u32, String> {
    let value: serde_json::Value = serde_json::from_slice(first_line)
        .map_err(|e| format!("its first line is not JSON ({e})"))?;
    if value["type"] != "header" || value["format"] != "cudatrace" {
        return Err("its first line is not a cudatrace header".into());
    }
    let Some(found) = value.get("version") else {
        return Err("its header has no format version".into());
    };
    let newest = u64::from(super::FORMAT_VERSION);
    match found.as_u64() {
        Some(version @ 1..) if version <= newest => Ok(version as u32),
        number => Err(format!(
            "trace format version {found}: this cudatrace reads versions 1 to {newest}{}",
            match number {
                Some(version) if version > newest => " (a newer cudatrace wrote it?)",
                _ => " (that is no version number)",
            }
        )),
    }
}
