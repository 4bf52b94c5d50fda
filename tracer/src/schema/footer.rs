//! `"type":"footer"`: the trace's last line. What was written and lost, how tracing ended,
//! each process's device memory, and the `--gpu` and `--power` figures. A trace without it
//! was cut short.
//!
//! Readers take only [`FooterFigures`] from it; everything else they recompute from the
//! lines (the analysis), so the rest of the footer is written, never read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fields::{Hex, LineType, Tag};

#[derive(Clone, Debug, Default, Serialize)]
pub struct Footer {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    pub end_wall: String,
    pub duration_ns: u64,
    /// Lines written per type (`lost` counts `"type":"lost"` lines).
    pub events: EventCounts,
    pub calls_by_name: BTreeMap<String, u64>,
    /// Events the kernel dropped, by reason.
    pub lost: LostCounts,
    /// Calls the kernel saw start in traced processes.
    pub entries_seen: u64,
    /// Returns with no recorded entry (a call already running when probes attached).
    pub unmatched_returns: u64,
    /// Calls that entered and never returned: left by `longjmp` or an exception thrown
    /// through the library (found when a later call or an outer return shows their stack
    /// unwound). They have no line.
    pub abandoned_calls: u64,
    /// Processes stopped so that probes were attached before they went on.
    pub stops: StopFigures,
    /// Records the loader could not decode.
    pub undecodable: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_signal: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Live device memory per process: peaks, final figures and leaks
    /// (docs/trace-format.md, "Analysis fields").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryFooter>,
    /// `--power`: the NVML sampler's figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerFooter>,
    /// `--gpu`: how GPU records were linked to calls, and whether recording failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuFooter>,
    /// `--stacks`: the calls with a Python stack, and why the others have none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks: Option<StacksFooter>,
    /// `--start-at`/`--duration`: what the window left out, and whether it ended tracing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowFooter>,
}

/// `--start-at`/`--duration`: lines seen (and analysed: kernel names, communicators and
/// ranks come from them) but not written, being outside the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WindowFooter {
    /// Before the window opened.
    pub lines_before: u64,
    /// After it closed (until the probes were detached).
    pub lines_after: u64,
    /// The window's end ended tracing while the command ran on: the footer has no exit
    /// code (cudatrace waited for the command and exited with its code).
    pub closed: bool,
}

impl LineType for Footer {
    const TYPE: &'static str = "footer";
}

/// A line between the header and the footer: the footer counts each kind in `events`.
pub trait EventLine: LineType + Serialize {
    /// Counts this line in the footer, as it is written.
    fn count_in(&self, footer: &mut Footer);
}

/// Lines of each type between the header and the footer.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EventCounts {
    pub call: u64,
    pub process: u64,
    pub lost: u64,
    /// `"type":"driver"` lines (`--kernel`).
    pub driver: u64,
    /// `"type":"power"` lines (`--power`).
    pub power: u64,
    /// `--gpu` lines: kernels, copies and memsets that ran, recording starts and errors.
    #[serde(skip_serializing_if = "is_zero")]
    pub gpu_kernel: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub gpu_copy: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub gpu_memset: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub gpu_info: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub gpu_error: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub gpu_gap: u64,
    /// `"type":"library"` lines.
    pub library: u64,
    /// `--stacks`: `"type":"stack"` and `"type":"interpreter"` lines.
    #[serde(skip_serializing_if = "is_zero")]
    pub stack: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub interpreter: u64,
}

/// The footer's `stacks` object (`--stacks`): every call of the chosen families is counted
/// once, in `calls` or under the reason it has no `stack`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StacksFooter {
    /// Calls that carry a `stack`.
    pub calls: u64,
    /// Of those, calls whose stack was cut at the frame budget (`"cut":true`).
    pub cut: u64,
    /// Calls without a `stack`, by reason.
    pub without: StacklessCounts,
    /// Code objects read from the interpreters (each once, unless its address was reused).
    pub code_objects: u64,
    /// Of those, the records that could not name a frame, by why.
    pub code_objects_unusable: UnusableCodeCounts,
    /// Of those, code objects whose line table is longer than a code record holds (16 KiB),
    /// read apart from the process's memory.
    pub long_linetables: LongLinetableCounts,
    /// Processes whose frees of code objects the `py_code_freed` probe counts (a known
    /// stack then reads no identity per frame), and those where it could not be linked.
    pub code_free_probes: CodeFreeProbeCounts,
    /// Frames the probes read (those kept and the interpreter's own entry frames they
    /// skip): with `calls`, the depth the cost per frame is measured at.
    pub frames_walked: u64,
    /// Reads of the traced processes' memory the probes made (each window of frames one):
    /// with `calls`, the reads a stacked call costs. Added within version 4.
    pub memory_reads: u64,
    /// Of those, reads that faulted (a page not mapped or not resident), each as costly as
    /// about ten that did not. Added within version 4.
    pub memory_read_faults: u64,
    /// Bytes those reads asked for (a window's whole length): with `memory_reads`, what a
    /// read copies. Added within version 4.
    pub memory_read_bytes: u64,
    /// The stack records of calls whose walk found a stack, by how the probes sent it:
    /// known to them (its hash alone) or whole (its frames). Added within version 4.
    pub stack_records: StackRecordCounts,
}

/// Stack records of calls whose walk reached a stack, by path: a known stack costs the
/// probes its frames' walk and a hash lookup; a stack sent whole also each frame's code
/// identity, a code-object lookup per frame and a record of its frames. Read back by
/// `summary` (missing fields 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StackRecordCounts {
    /// The probes knew the stack (seen in this process image under the current count of
    /// code objects freed): its hash alone was sent.
    pub known: u64,
    /// Of `known`, those whose hash came in the call's own record (one ring record for
    /// the call and its stack, not two). Not counted before it was (read as 0).
    pub known_in_call: u64,
    /// The stack was sent with its frames: new to the probes.
    pub sent_whole: u64,
    /// Of those, stacks the trace already had (the same frames, sent whole before): new to
    /// the probes only because the count of code objects freed moved, the layout was given
    /// again (the probe on code frees linked at the process's first stack, a fork child),
    /// the probes' cache of stacks evicted it, or one of its code objects was not read
    /// before.
    pub sent_again: u64,
}

/// Calls of the chosen families that have no `stack`, by reason (docs/trace-format.md).
/// Never a guess: a call whose stack cannot be read exactly has none. Read back by
/// `summary` (missing fields 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StacklessCounts {
    /// The process runs no Python interpreter cudatrace found.
    pub not_python: u64,
    /// It runs one cudatrace cannot read (its `interpreter` line says why).
    pub unsupported_python: u64,
    /// The interpreter was not initialised yet, or was finalising.
    pub not_initialized: u64,
    /// The calling thread has no Python thread state (a thread Python did not start:
    /// cuBLAS's, NCCL's, PyTorch's autograd threads).
    pub no_thread_state: u64,
    /// More than one thread state matched the thread, or the process runs
    /// sub-interpreters.
    pub ambiguous_thread_state: u64,
    /// The thread holds no Python frame.
    pub no_python_frames: u64,
    /// Reading the interpreter's memory failed (a page not resident, memory freed under
    /// the walk).
    pub read_fault: u64,
    /// A code object of the stack could not be read (not a code object, a name longer
    /// than cudatrace keeps, its record lost, too many new ones in one call).
    pub code_unresolved: u64,
    /// The stack's record was lost (the ring buffer was full).
    pub record_lost: u64,
    /// `--stack-every N`: calls the random draw left out, whose stack was not walked (by
    /// design, not a failure). Absent when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub sampled_out: u64,
    /// `--stack-rate HZ`: calls past the thread's HZ a second, whose stack was not walked
    /// (by design, not a failure). Absent when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub rate_limited: u64,
}

/// Code records that could not name a frame, by why (a record may have more than one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UnusableCodeCounts {
    /// Not a code object (its type is not `PyCode_Type`).
    pub not_code: u64,
    /// A read failed (a page not resident): read again at the next call, its pages faulted
    /// in meanwhile.
    pub read_fault: u64,
    /// A name that is not a compact string, or longer than kept.
    pub bad_name: u64,
}

/// Code objects whose line table is longer than 16 KiB (`LINETABLE_CAP`): their frames are
/// named all the same, and their line table read through `/proc/PID/mem`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LongLinetableCounts {
    /// Read whole, under the code object's identity: their frames have their lines.
    pub read: u64,
    /// Not read (the code object or its process gone by then): their frames have no `line`.
    pub unread: u64,
}

/// Processes whose interpreter does not count its own code objects freed (3.10 to 3.13),
/// by whether `py_code_freed` was linked in them at their first stack, on a kernel with
/// uprobe_multi (6.6+; elsewhere it is not tried and neither counts): `not_linked` ones are
/// read with each frame's identity, as exactly and more slowly (stderr says why). A process
/// that ended before its first stack was read is in neither.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CodeFreeProbeCounts {
    pub linked: u64,
    pub not_linked: u64,
}

impl StacklessCounts {
    /// Each reason as `run` and `summary` name it, with its count.
    pub fn reasons(&self) -> [(&'static str, u64); 11] {
        [
            ("not Python", self.not_python),
            ("unsupported Python", self.unsupported_python),
            ("interpreter not initialised", self.not_initialized),
            (
                "no thread state (a thread Python did not start)",
                self.no_thread_state,
            ),
            ("ambiguous thread state", self.ambiguous_thread_state),
            ("no Python frame", self.no_python_frames),
            ("read fault", self.read_fault),
            ("code object unresolved", self.code_unresolved),
            ("record lost", self.record_lost),
            ("sampled out (--stack-every)", self.sampled_out),
            ("rate limited (--stack-rate)", self.rate_limited),
        ]
    }

    /// The reasons with calls, `REASON COUNT` each, comma-separated.
    pub fn said(&self) -> String {
        self.reasons()
            .iter()
            .filter(|(_, count)| *count > 0)
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn total(&self) -> u64 {
        self.not_python
            + self.unsupported_python
            + self.not_initialized
            + self.no_thread_state
            + self.ambiguous_thread_state
            + self.no_python_frames
            + self.read_fault
            + self.code_unresolved
            + self.record_lost
            + self.sampled_out
            + self.rate_limited
    }
}

impl EventCounts {
    /// Every line counted. (Taken apart field by field: a new kind of line must be added
    /// here too, or this does not compile.)
    pub fn total(&self) -> u64 {
        let EventCounts {
            call,
            process,
            lost,
            driver,
            power,
            gpu_kernel,
            gpu_copy,
            gpu_memset,
            gpu_info,
            gpu_error,
            gpu_gap,
            library,
            stack,
            interpreter,
        } = self;
        [
            call,
            process,
            lost,
            driver,
            power,
            gpu_kernel,
            gpu_copy,
            gpu_memset,
            gpu_info,
            gpu_error,
            gpu_gap,
            library,
            stack,
            interpreter,
        ]
        .into_iter()
        .sum()
    }
}

/// Stops for attaching: each from the stop (in the process's own syscall exit) to the
/// `SIGCONT` after its probes were attached.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct StopFigures {
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// The kernel could not stop the process: its probes may have come late.
    pub failed: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct LostCounts {
    /// Call events dropped because the ring buffer was full.
    pub ring_full: u64,
    /// Calls nested deeper than the per-thread frame stack.
    pub too_deep: u64,
    /// Calls of threads beyond the frame table's capacity.
    pub frames_full: u64,
    /// Process (fork/exec/exit) events dropped because the ring buffer was full.
    pub process_ring_full: u64,
    /// Driver (`--kernel`) events dropped because the ring buffer was full.
    pub driver_ring_full: u64,
    /// `--gpu`: GPU records dropped because the ring buffer was full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_ring_full: Option<u64>,
    /// `--gpu`: GPU records that could not be read from the traced process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_read_failed: Option<u64>,
    /// `--gpu`: records CUPTI itself dropped (its buffers were full).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cupti_dropped: Option<u64>,
    /// `--gpu`: launches, copies and memsets whose work was not recorded because another
    /// CUPTI client held the activity API (`gpu_gap` lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_cupti_held: Option<u64>,
    /// `--gpu`: those whose record CUPTI never gave while it recorded the process's work
    /// (the work is written, unlinked; the call has no result or duration from CUPTI).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_no_api_record: Option<u64>,
    /// `--gpu`: those of processes that ended before CUPTI handed their records over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_not_flushed: Option<u64>,
    /// `--gpu`: those of processes where CUPTI was not recording.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_not_recorded: Option<u64>,
    /// `--gpu`: those whose records never came for no reason above.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_missing: Option<u64>,
    /// New child processes the traced-process map (or the map of children being created)
    /// had no room for: not traced, or without their own probes.
    pub traced_full: u64,
    /// `--kernel`: NVIDIA device fds the fd map had no room for: their ioctls and mmaps
    /// are not seen.
    pub fds_full: u64,
    /// Opens a pending-open map had no room for: the file is not checked for being a
    /// probe-set library, or (`--kernel`) an NVIDIA device.
    pub opens_full: u64,
    /// `--kernel`: ioctls and mmaps the in-flight map had no room for: their events.
    pub syscalls_full: u64,
    /// `--kernel` with kprobes: kernel function calls the in-flight map had no room for.
    pub kfuncs_full: u64,
    /// Records still in the ring when a signal-stopped run's last drain ran out of time
    /// (read and counted, not written).
    pub not_drained: u64,
    /// Library opens and forks the loader never heard of because the ring buffer was full
    /// (their processes were not stopped; their first calls may be missed).
    pub attach_ring_full: u64,
    /// Kernels without attach cookies (before 5.15): calls whose probe could not be told
    /// from the address it fired at (no recorded mapping of a planned library there).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unidentified_probe: u64,
    /// Children that had to be seen in their own context before their first user
    /// instruction (stopped for their own probes, or named in cudatrace's pid namespace)
    /// and ended unseen: their calls may be missing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub child_unseen: u64,
    /// Libraries a process could not be given its probes on (the probe table full, a file
    /// that cannot be read, an attach the kernel refused): its calls into them are
    /// missing. Each has a `lost` line naming the library, the process and why.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub library_not_attached: u64,
    /// Lines produced but not in the trace: writing it failed (a full disk), and the lines
    /// from there on are missing (the footer's `error` says why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unwritten: Option<u64>,
    /// Call events lost: `ring_full + too_deep + frames_full + unidentified_probe` and the
    /// calls among `not_drained`.
    pub calls: u64,
    /// Everything lost.
    pub total: u64,
}

/// The footer's `power` object: the sampler's own figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PowerFooter {
    /// Ticks sampled (each gives one line per device, unless dropped).
    pub samples: u64,
    /// Ticks skipped because the sampler was still busy with an earlier one.
    pub skipped_ticks: u64,
    /// Ticks whose lines were dropped because the event loop had fallen behind
    /// (the channel was full).
    pub dropped_samples: u64,
    /// NVML errors during sampling, by `function: ERROR`.
    pub read_errors: BTreeMap<String, u64>,
    /// One device's reads in one tick, mean and max.
    pub read_ns_mean: u64,
    pub read_ns_max: u64,
    /// Set when the sampler did not stop in time: its last samples are missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The footer's `gpu` object (`--gpu`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuFooter {
    /// CUPTI's records of the driver calls that issued GPU work.
    pub api_records: u64,
    /// Kernel, copy and memset lines linked to their call.
    pub linked: u64,
    /// Those written without a link, by reason (never dropped).
    pub unlinked: UnlinkedCounts,
    /// Processes where GPU recording started (`gpu_info` lines).
    pub processes: u64,
    /// Processes where it failed for good (`gpu_error` lines with `fatal`).
    pub fatal_errors: u64,
    /// Every launch, copy and memset the program made, and what became of its work.
    pub issuing: IssuingCalls,
    /// Kernel lines whose CUPTI name differs from their launch's (`cupti_kernel`).
    pub name_mismatches: u64,
    /// Work lines of graphs linked to the captured call that made their node, and not.
    pub graph_nodes: GraphNodeLinks,
    /// Times another CUPTI client held the activity API (`gpu_gap` lines).
    pub gaps: u64,
}

/// The launches, copies and memsets of the traced processes (successful or not) and what
/// became of each: `calls` = the sum of the others (docs/gpu.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IssuingCalls {
    pub calls: u64,
    /// Work of it has a GPU line.
    pub with_work: u64,
    /// The `schema::gpu::fate` reasons.
    pub captured: u64,
    pub failed: u64,
    pub empty: u64,
    pub cupti_held: u64,
    pub no_api_record: u64,
    pub not_flushed: u64,
    pub not_recorded: u64,
    pub missing: u64,
}

impl IssuingCalls {
    /// Each reason with its count, in the footer's order.
    pub fn reasons(&self) -> [(&'static str, u64); 8] {
        [
            ("captured into graphs", self.captured),
            ("failed", self.failed),
            ("of 0 bytes", self.empty),
            (
                "not recorded while another CUPTI client held it",
                self.cupti_held,
            ),
            (
                "without CUPTI's record of the call (their work unlinked)",
                self.no_api_record,
            ),
            ("not flushed before their process ended", self.not_flushed),
            (
                "not recorded (no CUPTI in their process)",
                self.not_recorded,
            ),
            ("missing", self.missing),
        ]
    }
}

/// Graph work lines and the captured calls that made their nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GraphNodeLinks {
    pub linked: u64,
    pub unlinked: u64,
}

/// GPU lines written without a link to their call, by reason (`schema::gpu::unlinked`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UnlinkedCounts {
    pub no_api_record: u64,
    pub no_call: u64,
    pub beyond_window: u64,
}

impl UnlinkedCounts {
    pub fn total(&self) -> u64 {
        self.no_api_record + self.no_call + self.beyond_window
    }
}

/// The footer's `memory` object.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryFooter {
    /// One entry per process (a pid between exec and exit) that made calls.
    pub processes: Vec<ProcessMemory>,
}

/// The memory figures of one process; also `cudatrace summary --json`'s `memory` entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessMemory {
    pub pid: u32,
    pub peak_device_bytes: u64,
    /// `ts_ns` of the call that first reached the peak (0 when nothing was allocated).
    pub peak_ts_ns: u64,
    /// Device bytes still held at the end (the leaks' device bytes).
    pub final_device_bytes: u64,
    pub peak_host_pinned_bytes: u64,
    pub final_host_pinned_bytes: u64,
    pub peak_mapped_bytes: u64,
    pub final_mapped_bytes: u64,
    pub final_reserved_bytes: u64,
    /// Successful allocating calls (device, physical, host pinned).
    pub allocations: u64,
    /// Successful frees matched to an allocation.
    pub frees: u64,
    /// Successful frees of memory never seen allocated (allocated before attaching).
    pub unmatched_frees: u64,
    /// Successful `cuIpcOpenMemHandle`s: other processes' device memory mapped here (not
    /// in this process's device bytes; absent when 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub ipc_opens: u64,
    /// Of those, still open at the end (absent when 0).
    #[serde(skip_serializing_if = "is_zero")]
    pub final_ipc_open: u64,
    /// Every allocation never freed (device, physical and host pinned).
    pub leak_count: u64,
    pub leaks: Vec<Leak>,
    /// Leaks beyond those listed (the analysis lists at most a thousand per process).
    #[serde(skip_serializing_if = "is_zero")]
    pub leaks_not_listed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// An allocation still live at the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Leak {
    /// `device` (dptr), `physical` (cuMemCreate handle) or `host_pinned` (host).
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dptr: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handle: Option<Hex>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<Hex>,
    pub bytes: u64,
    /// The allocating call's name.
    pub call: &'static str,
    /// When it was allocated.
    pub ts_ns: u64,
    /// `--stacks`: the allocating call's Python stack (its `stack` line's id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<u64>,
}

/// What readers take from a footer: the figures the lines alone cannot give. Read
/// leniently: any footer, even a hand-written or damaged one, still marks a complete trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FooterFigures {
    /// `lost.total`; without it, readers add up the `lost` lines.
    pub lost_total: Option<u64>,
    pub exit_code: Option<i32>,
    /// `gpu.issuing` (`run --gpu`): what became of every launch, copy and memset, which
    /// only `run` knew (which had work, which were in a gap).
    pub gpu_issuing: Option<IssuingCalls>,
    /// `stacks.without` (`run --stacks`): why calls have no stack, which only `run` knew.
    pub stacks_without: Option<StacklessCounts>,
    /// `stacks.stack_records` (`run --stacks`, within version 4): how the probes sent the
    /// stacks, which only `run` knew.
    pub stack_records: Option<StackRecordCounts>,
}

impl FooterFigures {
    pub(super) fn read(value: &Value) -> Self {
        FooterFigures {
            lost_total: value
                .get("lost")
                .and_then(|lost| lost.get("total"))
                .and_then(Value::as_u64),
            exit_code: value
                .get("exit_code")
                .and_then(Value::as_i64)
                .and_then(|code| i32::try_from(code).ok()),
            gpu_issuing: value
                .get("gpu")
                .and_then(|gpu| gpu.get("issuing"))
                .map(|issuing| {
                    let figure = |key: &str| issuing.get(key).and_then(Value::as_u64).unwrap_or(0);
                    IssuingCalls {
                        calls: figure("calls"),
                        with_work: figure("with_work"),
                        captured: figure("captured"),
                        failed: figure("failed"),
                        empty: figure("empty"),
                        cupti_held: figure("cupti_held"),
                        no_api_record: figure("no_api_record"),
                        not_flushed: figure("not_flushed"),
                        not_recorded: figure("not_recorded"),
                        missing: figure("missing"),
                    }
                }),
            stacks_without: value
                .get("stacks")
                .and_then(|stacks| stacks.get("without"))
                .and_then(|without| StacklessCounts::deserialize(without).ok()),
            stack_records: value
                .get("stacks")
                .and_then(|stacks| stacks.get("stack_records"))
                .and_then(|records| StackRecordCounts::deserialize(records).ok()),
        }
    }
}
