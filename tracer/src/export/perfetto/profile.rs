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
//! Calls are samples of their own thread. GPU time (`--gpu`) goes on a thread of its own
//! beside it (tid `GPU_TIME_TID_BASE` + the tid: samples count, they carry no weight),
//! named so. The samples' timebase counter track is named after how stacks were taken
//! (every call, or 1 call in N at random).

use std::io::{self, Write};

use foldhash::{HashMap, HashSet};

use super::{PerfettoWriter, TrackKey};
use crate::{
    export::{
        exporter::CUT_MARKER,
        proto::{
            Callstack, Frame, InternedData, InternedString, Mapping, PerfSample,
            PerfSampleDefaults, PerfTimebase, ThreadDescriptor, TracePacket, TracePacketDefaults,
            TrackDescriptor,
        },
        timeline::{GPU_SAMPLE_NS, SampleWeight, StackFrame, StackSample},
    },
    schema::Header,
};

/// GPU-time samples of thread T are on thread this + T (tids are below 2^22, those of a
/// merge below 2^30): a thread of its own, so that each weight has its own flame graph.
pub const GPU_TIME_TID_BASE: u32 = 1 << 30;

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
}

impl Profile {
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
            let name = match frame.line {
                Some(line) => format!("{} ({}:{line})", frame.qualname, frame.file),
                None => format!("{} ({})", frame.qualname, frame.file),
            };
            ids.push(self.frame(mapping, name, frame.line.map_or(0, u64::from)));
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
    fn gpu_thread_name(&self, tid: u32) -> String {
        let mut name = format!(
            "GPU time of tid {tid}, a sample per {} µs",
            GPU_SAMPLE_NS / 1_000
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
        let tid = match sample.weight {
            SampleWeight::Call => sample.tid,
            SampleWeight::GpuTime => {
                let tid = GPU_TIME_TID_BASE + sample.tid;
                if self.profile.gpu_threads.insert((sample.pid, sample.tid)) {
                    let name = self.profile.gpu_thread_name(sample.tid);
                    let (uuid, _) = self.uuid(TrackKey::GpuTime(sample.pid, sample.tid));
                    let parent = self.uuid(TrackKey::Process(sample.pid)).0;
                    self.describe(TrackDescriptor {
                        uuid: Some(uuid),
                        parent_uuid: Some(parent),
                        thread: Some(ThreadDescriptor {
                            pid: Some(sample.pid as i32),
                            tid: Some(tid as i32),
                            thread_name: Some(name),
                        }),
                        ..TrackDescriptor::default()
                    })?;
                }
                tid
            }
        };
        let pending = std::mem::take(&mut self.profile.pending);
        let interned = pending != InternedData::default();
        self.latest_ts_ns = self.latest_ts_ns.max(sample.ts_ns);
        self.packet(TracePacket {
            timestamp: Some(sample.ts_ns),
            perf_sample: Some(PerfSample {
                pid: Some(sample.pid),
                tid: Some(tid),
                callstack_iid: Some(sample.callstack),
            }),
            interned_data: interned.then_some(pending),
            ..TracePacket::default()
        })
    }
}
