//! `--stacks`: Python stacks as Perfetto's interned callstacks, and each sample as a
//! `PerfSample`, which the trace processor reads into `stack_profile_mapping`,
//! `stack_profile_frame`, `stack_profile_callsite` and `perf_sample`, and the UI draws as
//! a "Callstacks" track per thread with a flame graph of the samples of an area selected.
//!
//! - a **file** is a mapping named by its path (one interned path, no addresses);
//! - a **frame** is a function at a line: its name `QUALNAME (FILE:LINE)` (the slice's
//!   `stack` argument writes frames so), its file's mapping, its line as `rel_pc` (0
//!   without one);
//! - a **stack** is its frames, outermost first; a stack cut at the frame budget gets
//!   an outermost frame `(cut at the frame budget)` of its own, mapping without a path;
//! - synthetic ids: every iid is the order of first use, from 1, the same in every export
//!   of the trace.
//!
//! Calls are samples of their own thread. GPU time (`--gpu`) goes to a process of its own
//! beside the caller's (pid [`GPU_TIME_PID_BASE`] + the pid), a thread per calling thread
//! (tid [`GPU_TIME_TID_BASE`] + the tid), named so: samples count, they carry no weight, so
//! each weight needs tracks of its own, and the UI's per-process flame graph would mix
//! the two in one process. The samples' timebase counter track is named after how
//! stacks were taken (every call, or 1 call in N at random).

use std::io::{self, Write};

use foldhash::{HashMap, HashSet};

use super::{PerfettoWriter, TrackKey};
use crate::{
    export::{
        exporter::CUT_MARKER,
        proto::{
            Callstack, Frame, InternedData, InternedString, Mapping, PerfSample,
            PerfSampleDefaults, PerfTimebase, ProcessDescriptor, ThreadDescriptor, TracePacket,
            TracePacketDefaults, TrackDescriptor,
        },
        timeline::{SampleWeight, StackFrame, StackSample},
    },
    schema::Header,
};

/// GPU-time samples of thread T are on thread this + T (tids are below 2^22, those of a
/// merge below 2^30).
pub const GPU_TIME_TID_BASE: u32 = 1 << 30;

/// ... of process P, in process this + P: above the GPU groups' pids (2^30 + at most
/// 2^17). A pid that would take it past what a descriptor holds (a merge of some 250
/// traces) keeps its GPU-time threads in its own process.
pub const GPU_TIME_PID_BASE: u32 = (1 << 30) + (1 << 24);

/// The process of process `pid`'s GPU-time threads.
pub fn gpu_time_pid(pid: u32) -> u32 {
    match GPU_TIME_PID_BASE.checked_add(pid) {
        Some(gpu) if gpu <= i32::MAX as u32 => gpu,
        _ => pid,
    }
}

#[derive(Default)]
pub(super) struct Profile {
    /// Mapping iids by file (the cut marker's: "").
    mappings: HashMap<String, u64>,
    /// Frame iids (also their function name's) by (mapping, name, line).
    frames: HashMap<(u64, String, u64), u64>,
    /// Callstack iids by frames.
    callstacks: HashMap<Vec<u64>, u64>,
    /// Interned data not yet written: it goes with the next sample.
    pending: InternedData,
    /// The sequence's defaults were written (before the first sample).
    defaults_written: bool,
    /// From the header: 1 call in `every` had its stack read.
    every: Option<u32>,
    gpu_threads: HashSet<(u32, u32)>,
    /// Processes' names as last given, for their GPU-time process's.
    process_names: HashMap<u32, String>,
}

impl Profile {
    pub fn process_name(&mut self, pid: u32, name: &str) {
        if self.process_names.get(&pid).map(String::as_str) != Some(name) {
            self.process_names.insert(pid, name.to_owned());
        }
    }

    pub fn header(&mut self, header: &Header) {
        self.every = header
            .stacks
            .as_ref()
            .and_then(|stacks| stacks.every)
            .filter(|every| *every > 1);
    }

    fn mapping(&mut self, file: &str) -> u64 {
        if let Some(iid) = self.mappings.get(file) {
            return *iid;
        }
        let iid = self.mappings.len() as u64 + 1;
        self.mappings.insert(file.to_owned(), iid);
        // The path's iid is the mapping's; the marker's mapping has no path.
        let mut path_string_ids = Vec::new();
        if !file.is_empty() {
            self.pending.mapping_paths.push(InternedString {
                iid: Some(iid),
                name: Some(file.to_owned()),
            });
            path_string_ids.push(iid);
        }
        self.pending.mappings.push(Mapping {
            iid: Some(iid),
            path_string_ids,
        });
        iid
    }

    fn frame(&mut self, mapping: u64, name: String, line: u64) -> u64 {
        let next = self.frames.len() as u64 + 1;
        let key = (mapping, name, line);
        if let Some(iid) = self.frames.get(&key) {
            return *iid;
        }
        self.pending.function_names.push(InternedString {
            iid: Some(next),
            name: Some(key.1.clone()),
        });
        self.pending.frames.push(Frame {
            iid: Some(next),
            function_name_id: Some(next),
            mapping_id: Some(mapping),
            rel_pc: Some(line),
        });
        self.frames.insert(key, next);
        next
    }

    fn callstack(&mut self, frames: &[StackFrame<'_>], cut: bool) -> u64 {
        let mut ids = Vec::with_capacity(frames.len() + 1);
        if cut {
            let mapping = self.mapping("");
            ids.push(self.frame(mapping, CUT_MARKER.to_owned(), 0));
        }
        for frame in frames.iter().rev() {
            let mapping = self.mapping(frame.file);
            let line = frame.line.map_or(0, u64::from);
            ids.push(self.frame(mapping, frame.name.clone(), line));
        }
        if let Some(iid) = self.callstacks.get(&ids) {
            return *iid;
        }
        let iid = self.callstacks.len() as u64 + 1;
        self.pending.callstacks.push(Callstack {
            iid: Some(iid),
            frame_ids: ids.clone(),
        });
        self.callstacks.insert(ids, iid);
        iid
    }

    /// What the samples' timebase counter track is named: how the stacks were taken.
    fn timebase_name(&self) -> String {
        match self.every {
            Some(every) => format!(
                "Python stacks: 1 call in {every} sampled at random (--stack-every {every})"
            ),
            None => "Python stacks: every call".to_owned(),
        }
    }

    /// The GPU-time thread's name.
    fn gpu_thread_name(&self, tid: u32, sample_ns: u64) -> String {
        let mut name = format!(
            "GPU time of tid {tid}, a sample per {} µs",
            sample_ns / 1_000
        );
        if let Some(every) = self.every {
            name.push_str(&format!(", of 1 call in {every} sampled"));
        }
        name
    }
}

impl<W: Write> PerfettoWriter<W> {
    pub(super) fn intern_stack_frames(
        &mut self,
        frames: &[StackFrame<'_>],
        cut: bool,
    ) -> io::Result<Option<u64>> {
        Ok(Some(self.profile.callstack(frames, cut)))
    }

    pub(super) fn sample(&mut self, sample: &StackSample) -> io::Result<()> {
        if !self.profile.defaults_written {
            self.profile.defaults_written = true;
            let name = self.profile.timebase_name();
            self.packet(TracePacket {
                timestamp: Some(sample.ts_ns),
                trace_packet_defaults: Some(TracePacketDefaults {
                    perf_sample_defaults: Some(PerfSampleDefaults {
                        timebase: Some(PerfTimebase { name: Some(name) }),
                    }),
                }),
                ..TracePacket::default()
            })?;
        }
        let (pid, tid) = match sample.weight {
            SampleWeight::Call => (sample.pid, sample.tid),
            SampleWeight::GpuTime { sample_ns } => {
                let (pid, tid) = (gpu_time_pid(sample.pid), GPU_TIME_TID_BASE + sample.tid);
                if self.profile.gpu_threads.insert((sample.pid, sample.tid)) {
                    let (process, new) = self.uuid(TrackKey::Process(pid));
                    if new {
                        let caller = match self.profile.process_names.get(&sample.pid) {
                            Some(name) => format!("{name} (pid {})", sample.pid),
                            None => format!("pid {}", sample.pid),
                        };
                        self.describe(TrackDescriptor {
                            uuid: Some(process),
                            process: Some(ProcessDescriptor {
                                pid: Some(pid as i32),
                                process_name: Some(format!("GPU time of {caller}")),
                            }),
                            ..TrackDescriptor::default()
                        })?;
                    }
                    let name = self.profile.gpu_thread_name(sample.tid, sample_ns);
                    let (uuid, _) = self.uuid(TrackKey::GpuTime(sample.pid, sample.tid));
                    self.describe(TrackDescriptor {
                        uuid: Some(uuid),
                        parent_uuid: Some(process),
                        thread: Some(ThreadDescriptor {
                            pid: Some(pid as i32),
                            tid: Some(tid as i32),
                            thread_name: Some(name),
                        }),
                        ..TrackDescriptor::default()
                    })?;
                }
                (pid, tid)
            }
        };
        let pending = std::mem::take(&mut self.profile.pending);
        let interned = pending != InternedData::default();
        self.latest_ts_ns = self.latest_ts_ns.max(sample.ts_ns);
        self.packet(TracePacket {
            timestamp: Some(sample.ts_ns),
            perf_sample: Some(PerfSample {
                pid: Some(pid),
                tid: Some(tid),
                callstack_iid: Some(sample.callstack),
            }),
            interned_data: interned.then_some(pending),
            ..TracePacket::default()
        })
    }
}
