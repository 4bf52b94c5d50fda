//! The timeline's events as packets: processes, threads and GPUs as track descriptors,
//! slices, instants and counters as track events.

use std::io::{self, Write};

use super::{NamedEvent, PerfettoWriter, TrackKey};
use crate::{
    export::{
        call_args::SliceArgs,
        proto::{
            CounterDescriptor, ProcessDescriptor, ProcessTree, ProcessTreeProcess,
            ThreadDescriptor, TracePacket, TrackDescriptor, TrackEvent, UNIT_SIZE_BYTES,
            event_type,
        },
        timeline::{
            ExportStats, GPU_PID_BASE, GpuCounter, Instant, ProcessName, Slice, StackFrame,
            StackSample, TimelineSink, Track,
        },
    },
    schema::Header,
};

impl<W: Write> TimelineSink for PerfettoWriter<W> {
    fn header(&mut self, header: &Header, _base_ns: u64) -> io::Result<()> {
        self.profile.header(header);
        Ok(())
    }

    fn process(&mut self, process: &ProcessName<'_>) -> io::Result<()> {
        self.profile.process_name(process.pid, process.name);
        let (uuid, new) = self.uuid(TrackKey::Process(process.pid));
        if new {
            return self.describe(TrackDescriptor {
                uuid: Some(uuid),
                process: Some(ProcessDescriptor {
                    pid: Some(process.pid as i32),
                    process_name: Some(process.name.to_owned()),
                }),
                ..TrackDescriptor::default()
            });
        }
        // A rename: the trace processor keeps a process descriptor's first name, but takes
        // a process tree's, at its timestamp (after the events written so far).
        let mut cmdline = vec![process.name.to_owned()];
        if process.name.contains(' ') {
            // A lone cmdline entry is cut at its first space (programs that rewrite their
            // cmdline with spaces); a second, empty entry keeps the whole name.
            cmdline.push(String::new());
        }
        self.packet(TracePacket {
            timestamp: Some(self.latest_ts_ns),
            process_tree: Some(ProcessTree {
                processes: vec![ProcessTreeProcess {
                    pid: Some(process.pid as i32),
                    // 0 (the trace processor's placeholder) where the fork was not seen.
                    ppid: Some(process.parent.map_or(0, |parent| parent as i32)),
                    cmdline,
                }],
            }),
            ..TracePacket::default()
        })
    }

    fn thread(&mut self, track: Track, name: &str) -> io::Result<()> {
        let (uuid, _) = self.uuid(TrackKey::Event(track));
        let descriptor = match track {
            Track::Thread { pid, tid } => TrackDescriptor {
                uuid: Some(uuid),
                parent_uuid: Some(self.uuid(TrackKey::Process(pid)).0),
                thread: Some(ThreadDescriptor {
                    pid: Some(pid as i32),
                    tid: Some(tid as i32),
                    thread_name: Some(name.to_owned()),
                }),
                ..TrackDescriptor::default()
            },
            // A named track of the process, not a thread of its own.
            Track::Driver { pid, .. } | Track::Nccl { pid, .. } | Track::Layers { pid, .. } => {
                TrackDescriptor {
                    uuid: Some(uuid),
                    parent_uuid: Some(self.uuid(TrackKey::Process(pid)).0),
                    name: Some(name.to_owned()),
                    ..TrackDescriptor::default()
                }
            }
            // A stream track in its GPU's group (named by `gpu` first), under a track
            // that holds the GPU's streams: the trace processor links a track to a
            // process's track only as that process's, not as its child.
            Track::Gpu { device, .. } => {
                let (streams, new) = self.uuid(TrackKey::GpuStreams(device));
                if new {
                    let process = self.uuid(TrackKey::Process(GPU_PID_BASE + device)).0;
                    let name = self.gpu_names.get(&device).cloned();
                    self.describe(TrackDescriptor {
                        uuid: Some(streams),
                        parent_uuid: Some(process),
                        name: Some(name.unwrap_or_else(|| format!("GPU {device}"))),
                        ..TrackDescriptor::default()
                    })?;
                }
                TrackDescriptor {
                    uuid: Some(uuid),
                    parent_uuid: Some(streams),
                    name: Some(name.to_owned()),
                    ..TrackDescriptor::default()
                }
            }
            Track::Global => return Ok(()),
        };
        self.describe(descriptor)
    }

    fn slice(&mut self, slice: &Slice<'_>) -> io::Result<()> {
        let track_uuid = self.track_uuid(slice.track)?;
        self.named_event(
            slice.ts_ns,
            NamedEvent {
                kind: event_type::SLICE_BEGIN,
                track_uuid,
                name: slice.name,
                category: slice.category,
                flow_out: slice.flow_out,
                flows_in: slice.flows_in,
            },
            slice.args,
        )?;
        self.plain_event(
            slice.ts_ns.saturating_add(slice.dur_ns),
            event_type::SLICE_END,
            track_uuid,
            None,
        )
    }

    fn instant(&mut self, instant: &Instant<'_>) -> io::Result<()> {
        let track_uuid = self.track_uuid(instant.track)?;
        self.named_event(
            instant.ts_ns,
            NamedEvent {
                kind: event_type::INSTANT,
                track_uuid,
                name: instant.name,
                category: instant.category,
                flow_out: &[],
                flows_in: &[],
            },
            SliceArgs::Collected(instant.args),
        )
    }

    fn counter(&mut self, pid: u32, ts_ns: u64, bytes: u64) -> io::Result<()> {
        let (uuid, new) = self.uuid(TrackKey::Memory(pid));
        if new {
            let parent = self.uuid(TrackKey::Process(pid)).0;
            self.describe(TrackDescriptor {
                uuid: Some(uuid),
                parent_uuid: Some(parent),
                name: Some("device memory".into()),
                counter: Some(CounterDescriptor {
                    unit: Some(UNIT_SIZE_BYTES),
                }),
                ..TrackDescriptor::default()
            })?;
        }
        self.plain_event(
            ts_ns,
            event_type::COUNTER,
            uuid,
            Some(i64::try_from(bytes).unwrap_or(i64::MAX)),
        )
    }

    fn gpu(&mut self, device: u32, name: &str) -> io::Result<()> {
        self.gpu_names.insert(device, name.to_owned());
        self.process(&ProcessName {
            pid: GPU_PID_BASE + device,
            name,
            parent: None,
        })
    }

    fn gpu_counter(
        &mut self,
        device: u32,
        counter: GpuCounter,
        ts_ns: u64,
        value: f64,
    ) -> io::Result<()> {
        let (uuid, new) = self.uuid(TrackKey::Gpu(device, counter));
        if new {
            let parent = self.uuid(TrackKey::Process(GPU_PID_BASE + device)).0;
            self.describe(TrackDescriptor {
                uuid: Some(uuid),
                parent_uuid: Some(parent),
                name: Some(counter.track_name()),
                counter: Some(CounterDescriptor::default()),
                ..TrackDescriptor::default()
            })?;
        }
        // A sample every few milliseconds at most: built as a message.
        self.latest_ts_ns = self.latest_ts_ns.max(ts_ns);
        self.packet(TracePacket {
            timestamp: Some(ts_ns),
            track_event: Some(TrackEvent {
                r#type: Some(event_type::COUNTER),
                track_uuid: Some(uuid),
                double_counter_value: Some(value),
                ..TrackEvent::default()
            }),
            ..TracePacket::default()
        })
    }

    fn intern_stack(&mut self, frames: &[StackFrame<'_>], cut: bool) -> io::Result<Option<u64>> {
        self.intern_stack_frames(frames, cut)
    }

    fn stack_sample(&mut self, sample: &StackSample) -> io::Result<()> {
        self.sample(sample)
    }

    fn finish(&mut self, _stats: &ExportStats) -> io::Result<()> {
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        self.out.flush()
    }
}
