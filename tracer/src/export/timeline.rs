//! The timeline an export draws, whatever the format: tracks, slices, instants, counters
//! and flow arrows, and what a format's writer ([`TimelineSink`]) must do with them.

use std::io;

use super::{arguments::Arguments, call_args::SliceArgs, flows::FlowStart};
use crate::schema::Header;

/// Figures of one export, printed on stderr and checked by the tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    pub lines: u64,
    /// Complete slices: calls and driver events.
    pub slices: u64,
    pub driver_slices: u64,
    /// Process (fork/exec/exit) and lost-event markers.
    pub instants: u64,
    pub counters: u64,
    pub flows: u64,
    /// Events the filters left out.
    pub filtered: u64,
    pub unknown_lines: u64,
    pub skipped_lines: u64,
    /// The cut line of a trace without footer, as a warning (`TraceLines::cut`).
    pub cut_warning: Option<String>,
    /// Launches whose arrow was dropped because their stream had too many waiting.
    pub flows_dropped: u64,
    /// `--gpu`: kernels, copies and memsets drawn on the GPU tracks (among `slices`).
    pub gpu_slices: u64,
    /// NCCL collective calls drawn again on their rank's track (among `slices`).
    pub nccl_slices: u64,
    /// `--stacks`: layer entries drawn on the threads' layer tracks (among `slices`).
    pub layer_slices: u64,
    /// `--stacks --gpu`: launches of layer entries drawn without their kernel (it never
    /// came, or too many entries waited).
    pub layer_launches_without_kernel: u64,
    /// `--stacks`, Perfetto: a sample per call drawn with a stack (its thread's calls
    /// profile).
    pub call_samples: u64,
    /// `--stacks --gpu`, Perfetto: GPU-time samples, one per `--gpu-sample-us` of its
    /// stack's kernels on its thread.
    pub gpu_samples: u64,
    /// The GPU time of stacked kernels left below a whole sample, per thread and stack,
    /// at the end (each less than a sample's).
    pub gpu_ns_unsampled: u64,
}

impl ExportStats {
    /// Adds another export's figures (the traces of a merge).
    pub fn add(&mut self, other: &ExportStats) {
        self.lines += other.lines;
        self.slices += other.slices;
        self.driver_slices += other.driver_slices;
        self.instants += other.instants;
        self.counters += other.counters;
        self.flows += other.flows;
        self.filtered += other.filtered;
        self.unknown_lines += other.unknown_lines;
        self.skipped_lines += other.skipped_lines;
        self.flows_dropped += other.flows_dropped;
        self.gpu_slices += other.gpu_slices;
        self.nccl_slices += other.nccl_slices;
        self.call_samples += other.call_samples;
        self.gpu_samples += other.gpu_samples;
        self.gpu_ns_unsampled += other.gpu_ns_unsampled;
    }
}

/// Where an event is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Track {
    /// A thread's libcuda calls and process events.
    Thread { pid: u32, tid: u32 },
    /// What the NVIDIA kernel module did for a thread (`--kernel`), beside its calls.
    Driver { pid: u32, tid: u32 },
    /// `--stacks`: the Python layers a thread's calls were made in, beside its calls.
    Layers { pid: u32, tid: u32 },
    /// Trace-wide markers (lost events).
    Global,
    /// NCCL: the collective calls of one process on one (communicator, rank), beside its
    /// threads; `index` numbers these tracks across the export, from 1.
    Nccl { pid: u32, index: u32 },
    /// `--gpu`: the work one process ran on one stream of one GPU (CUPTI's ids), in the
    /// GPU's group (`device`: the group's number, the NVML GPU's in a `--power` trace). Work of one stream that overlaps (programmatic dependent launch, or
    /// clock jitter) goes to `lane` 1, 2, ... beside it: viewers drop slices that overlap
    /// on one track.
    Gpu {
        device: u32,
        pid: u32,
        stream: u32,
        lane: u32,
    },
}

/// A GPU's counter track (`--power` traces), drawn in the GPU's group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuCounter {
    /// `power_mw`: NVML's power reading (a 1 s average on Ampere and newer but GA100).
    Power,
    /// `power_instant_mw`.
    InstantPower,
    /// Energy since the first sample: the counter's, or integrated power's.
    Energy,
    SmClock,
    MemClock,
    GpuUtilization,
    MemUtilization,
    Temperature,
    MemoryUsed,
}

/// Each GPU is a process-like group of its own, pid this plus the device (above any Linux
/// pid, at most 2^22), named `GPU N: NAME` (`GPU N` where the trace has no name for it):
/// its `--power` counters and its `--gpu` stream tracks.
pub const GPU_PID_BASE: u32 = 1 << 30;

impl GpuCounter {
    /// The counter's name and unit. Its track is named `NAME UNIT` in both formats (the
    /// JSON's counter event `NAME` with the series `UNIT`, as the trace processor names it).
    pub fn name_and_unit(self) -> (&'static str, &'static str) {
        match self {
            GpuCounter::Power => ("power", "W"),
            GpuCounter::InstantPower => ("instant power", "W"),
            GpuCounter::Energy => ("energy", "J"),
            GpuCounter::SmClock => ("SM clock", "MHz"),
            GpuCounter::MemClock => ("memory clock", "MHz"),
            GpuCounter::GpuUtilization => ("GPU utilisation", "%"),
            GpuCounter::MemUtilization => ("memory utilisation", "%"),
            GpuCounter::Temperature => ("temperature", "C"),
            GpuCounter::MemoryUsed => ("memory used", "bytes"),
        }
    }

    pub fn track_name(self) -> String {
        let (name, unit) = self.name_and_unit();
        format!("{name} {unit}")
    }
}

/// A slice: a call or a driver event. Times are ns since the base.
pub struct Slice<'a> {
    pub track: Track,
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub name: &'a str,
    /// `name` is known to hold nothing JSON escapes (see [`SliceArgs::is_plain`]).
    pub plain_name: bool,
    pub category: &'a str,
    /// In key order.
    pub args: SliceArgs<'a>,
    /// A launch: the flows it starts (to its synchronisation, to its GPU work).
    pub flow_out: &'a [u64],
    /// A synchronisation: the launches it waited for.
    pub flows_in: &'a [FlowStart],
}

/// A process's name, given before its first event and again after an exec renamed it.
pub struct ProcessName<'a> {
    pub pid: u32,
    pub name: &'a str,
    /// The process that forked it, where the trace saw the fork.
    pub parent: Option<u32>,
}

pub struct Instant<'a> {
    pub track: Track,
    pub ts_ns: u64,
    pub name: &'a str,
    pub category: &'a str,
    pub args: &'a Arguments,
}

/// The GPU time one GPU-time sample stands for by default (`--gpu-sample-us`): a
/// stack's kernels on a thread get one sample each time their summed time passes a
/// multiple of it.
pub const GPU_SAMPLE_NS: u64 = 1_000;

/// A frame of a Python stack drawn as a profile.
#[derive(Clone, Debug)]
pub struct StackFrame<'a> {
    /// `QUALNAME (FILE:LINE)`, as a slice's `stack` argument writes it.
    pub name: String,
    pub file: &'a str,
    pub line: Option<u32>,
}

/// What a stack sample counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleWeight {
    /// One call made from the stack.
    Call,
    /// `sample_ns` of GPU time of kernels launched from the stack.
    GpuTime { sample_ns: u64 },
}

/// One sample of a thread's stack, at `ts_ns` (since the base).
#[derive(Clone, Copy, Debug)]
pub struct StackSample {
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    /// What [`TimelineSink::intern_stack`] gave the stack.
    pub callstack: u64,
    pub weight: SampleWeight,
}

/// Where the timeline goes (Trace Event JSON or Perfetto protobuf). The exporter names
/// a process and a thread before the first event on their tracks.
pub trait TimelineSink {
    /// The trace's header, before any event.
    fn header(&mut self, header: &Header, base_ns: u64) -> io::Result<()>;
    /// Names (or renames, after an exec) a process.
    fn process(&mut self, process: &ProcessName<'_>) -> io::Result<()>;
    /// Names a thread's track (or its driver track, or a GPU stream's track: then `name`
    /// is the stream's, and its GPU's group was named first by [`Self::gpu`]).
    fn thread(&mut self, track: Track, name: &str) -> io::Result<()>;
    fn slice(&mut self, slice: &Slice<'_>) -> io::Result<()>;
    fn instant(&mut self, instant: &Instant<'_>) -> io::Result<()>;
    /// The process's device bytes from `ts_ns` on.
    fn counter(&mut self, pid: u32, ts_ns: u64, bytes: u64) -> io::Result<()>;
    /// Names GPU `device`'s group, before its first counter or stream track.
    fn gpu(&mut self, device: u32, name: &str) -> io::Result<()>;
    /// A GPU counter's value from `ts_ns` on.
    fn gpu_counter(
        &mut self,
        device: u32,
        counter: GpuCounter,
        ts_ns: u64,
        value: f64,
    ) -> io::Result<()>;
    fn finish(&mut self, stats: &ExportStats) -> io::Result<()>;
    /// `--stacks`: a stack (innermost frame first; `cut`: its outer frames are missing)
    /// for samples to name. `None`: the format draws no samples, and none are sent.
    fn intern_stack(&mut self, _frames: &[StackFrame<'_>], _cut: bool) -> io::Result<Option<u64>> {
        Ok(None)
    }
    /// `--stacks`: a sample of a stack [`Self::intern_stack`] gave.
    fn stack_sample(&mut self, _sample: &StackSample) -> io::Result<()> {
        Ok(())
    }
}
