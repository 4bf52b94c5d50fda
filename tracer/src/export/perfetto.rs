//! Perfetto's native protobuf format: a `Trace` whose `TracePacket`s are written one at a
//! time (track descriptors first, then track events), on one packet sequence.
//!
//! Slices are a `TYPE_SLICE_BEGIN`/`TYPE_SLICE_END` pair; flows are `flow_ids` on the
//! launch and `terminating_flow_ids` on its synchronisation (or, `--gpu`, its GPU work). Timestamps are nanoseconds
//! since the time base, in the trace's default clock domain. Event names, categories and
//! argument names are interned: sent once, then referred to by number.

use std::{
    collections::HashMap,
    io::{self, Write},
};

use prost::Message;
use serde_json::{Map, Value};

use super::{
    proto::{
        CounterDescriptor, DebugAnnotation, InternedData, InternedString, ProcessDescriptor,
        SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE, TRACE_PACKET_TAG,
        ThreadDescriptor, TracePacket, TrackDescriptor, TrackEvent, UNIT_SIZE_BYTES, event_type,
    },
    timeline::{ExportStats, GPU_PID_BASE, GpuCounter, Instant, Slice, TimelineSink, Track},
};
use crate::schema::Header;

/// The one packet sequence of the file.
const SEQUENCE_ID: u32 = 1;
/// Strings interned per table; further ones are written in full (memory stays bounded
/// when names are many, e.g. copies named by their size).
const MAX_INTERNED: usize = 65_536;

/// One interning table: strings to their `iid` (from 1).
#[derive(Default)]
struct Interner {
    ids: HashMap<String, u64>,
}

impl Interner {
    /// The iid of `text`, adding it to `new` the first time; `None` once the table is full.
    fn iid(&mut self, text: &str, new: &mut Vec<InternedString>) -> Option<u64> {
        if let Some(iid) = self.ids.get(text) {
            return Some(*iid);
        }
        if self.ids.len() >= MAX_INTERNED {
            return None;
        }
        let iid = self.ids.len() as u64 + 1;
        self.ids.insert(text.to_owned(), iid);
        new.push(InternedString {
            iid: Some(iid),
            name: Some(text.to_owned()),
        });
        Some(iid)
    }
}

/// A track this writer has described.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum TrackKey {
    Process(u32),
    Event(Track),
    Memory(u32),
    /// A GPU counter (`--power`) in its GPU's group, `Process(GPU_PID_BASE + device)`.
    Gpu(u32, GpuCounter),
    /// `--gpu`: the track holding a GPU's stream tracks, in its GPU's group.
    GpuStreams(u32),
}

pub struct PerfettoWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
    packets: u64,
    uuids: HashMap<TrackKey, u64>,
    /// GPU groups' names, by device.
    gpu_names: HashMap<u32, String>,
    names: Interner,
    categories: Interner,
    annotation_names: Interner,
}

impl<W: Write> PerfettoWriter<W> {
    pub fn new(out: W) -> Self {
        PerfettoWriter {
            out,
            buf: Vec::with_capacity(4096),
            packets: 0,
            uuids: HashMap::new(),
            gpu_names: HashMap::new(),
            names: Interner::default(),
            categories: Interner::default(),
            annotation_names: Interner::default(),
        }
    }

    fn packet(&mut self, mut packet: TracePacket) -> io::Result<()> {
        packet.trusted_packet_sequence_id = Some(SEQUENCE_ID);
        if self.packets == 0 {
            packet.sequence_flags = Some(SEQ_INCREMENTAL_STATE_CLEARED);
        } else if packet.track_event.is_some() {
            packet.sequence_flags = Some(SEQ_NEEDS_INCREMENTAL_STATE);
        }
        self.packets += 1;
        self.buf.clear();
        self.buf.push(TRACE_PACKET_TAG);
        packet
            .encode_length_delimited(&mut self.buf)
            .map_err(io::Error::other)?;
        self.out.write_all(&self.buf)
    }

    fn uuid(&mut self, key: TrackKey) -> (u64, bool) {
        let next = self.uuids.len() as u64 + 1;
        let mut new = false;
        let uuid = *self.uuids.entry(key).or_insert_with(|| {
            new = true;
            next
        });
        (uuid, new)
    }

    fn describe(&mut self, descriptor: TrackDescriptor) -> io::Result<()> {
        self.packet(TracePacket {
            track_descriptor: Some(descriptor),
            ..TracePacket::default()
        })
    }

    /// The track's uuid; the global track is described on first use (the exporter names
    /// processes and threads before their first event).
    fn track_uuid(&mut self, track: Track) -> io::Result<u64> {
        let (uuid, new) = self.uuid(TrackKey::Event(track));
        if new && track == Track::Global {
            self.describe(TrackDescriptor {
                uuid: Some(uuid),
                name: Some("cudatrace".into()),
                ..TrackDescriptor::default()
            })?;
        }
        Ok(uuid)
    }

    fn event(&mut self, ts_ns: u64, event: TrackEvent) -> io::Result<()> {
        self.event_with(ts_ns, event, None)
    }

    fn event_with(
        &mut self,
        ts_ns: u64,
        event: TrackEvent,
        interned_data: Option<InternedData>,
    ) -> io::Result<()> {
        self.packet(TracePacket {
            timestamp: Some(ts_ns),
            track_event: Some(event),
            interned_data,
            ..TracePacket::default()
        })
    }

    /// A named event: its name, category and argument names interned.
    fn named_event(
        &mut self,
        ts_ns: u64,
        mut event: TrackEvent,
        name: &str,
        category: &str,
        args: &Map<String, Value>,
    ) -> io::Result<()> {
        let mut new = InternedData::default();
        match self.names.iid(name, &mut new.event_names) {
            Some(iid) => event.name_iid = Some(iid),
            None => event.name = Some(name.to_owned()),
        }
        match self.categories.iid(category, &mut new.event_categories) {
            Some(iid) => event.category_iids = vec![iid],
            None => event.categories = vec![category.to_owned()],
        }
        event.debug_annotations = annotations(args);
        for (annotation, key) in event.debug_annotations.iter_mut().zip(args.keys()) {
            match self
                .annotation_names
                .iid(key, &mut new.debug_annotation_names)
            {
                Some(iid) => annotation.name_iid = Some(iid),
                None => annotation.name = Some(key.clone()),
            }
        }
        let fresh = !(new.event_names.is_empty()
            && new.event_categories.is_empty()
            && new.debug_annotation_names.is_empty());
        self.event_with(ts_ns, event, fresh.then_some(new))
    }
}

/// Argument values; their names are set by the caller.
fn annotations(args: &Map<String, Value>) -> Vec<DebugAnnotation> {
    args.values()
        .map(|value| {
            let mut annotation = DebugAnnotation::default();
            match value {
                Value::Bool(flag) => annotation.bool_value = Some(*flag),
                Value::Number(n) => {
                    if let Some(unsigned) = n.as_u64() {
                        annotation.uint_value = Some(unsigned);
                    } else if let Some(signed) = n.as_i64() {
                        annotation.int_value = Some(signed);
                    } else {
                        annotation.double_value = n.as_f64();
                    }
                }
                Value::String(text) => annotation.string_value = Some(text.clone()),
                other => annotation.legacy_json_value = Some(other.to_string()),
            }
            annotation
        })
        .collect()
}

impl<W: Write> TimelineSink for PerfettoWriter<W> {
    fn header(&mut self, _header: &Header, _base_ns: u64) -> io::Result<()> {
        Ok(())
    }

    fn process(&mut self, pid: u32, name: &str) -> io::Result<()> {
        // Described again with the same uuid after a rename.
        let (uuid, _) = self.uuid(TrackKey::Process(pid));
        self.describe(TrackDescriptor {
            uuid: Some(uuid),
            process: Some(ProcessDescriptor {
                pid: Some(pid as i32),
                process_name: Some(name.to_owned()),
            }),
            ..TrackDescriptor::default()
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
            Track::Driver { pid, .. } | Track::Nccl { pid, .. } => TrackDescriptor {
                uuid: Some(uuid),
                parent_uuid: Some(self.uuid(TrackKey::Process(pid)).0),
                name: Some(name.to_owned()),
                ..TrackDescriptor::default()
            },
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
            TrackEvent {
                r#type: Some(event_type::SLICE_BEGIN),
                track_uuid: Some(track_uuid),
                flow_ids: slice.flow_out.to_vec(),
                terminating_flow_ids: slice.flows_in.iter().map(|start| start.id).collect(),
                ..TrackEvent::default()
            },
            slice.name,
            slice.category,
            slice.args,
        )?;
        self.event(
            slice.ts_ns.saturating_add(slice.dur_ns),
            TrackEvent {
                r#type: Some(event_type::SLICE_END),
                track_uuid: Some(track_uuid),
                ..TrackEvent::default()
            },
        )
    }

    fn instant(&mut self, instant: &Instant<'_>) -> io::Result<()> {
        let track_uuid = self.track_uuid(instant.track)?;
        self.named_event(
            instant.ts_ns,
            TrackEvent {
                r#type: Some(event_type::INSTANT),
                track_uuid: Some(track_uuid),
                ..TrackEvent::default()
            },
            instant.name,
            instant.category,
            instant.args,
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
        self.event(
            ts_ns,
            TrackEvent {
                r#type: Some(event_type::COUNTER),
                track_uuid: Some(uuid),
                counter_value: Some(i64::try_from(bytes).unwrap_or(i64::MAX)),
                ..TrackEvent::default()
            },
        )
    }

    fn gpu(&mut self, device: u32, name: &str) -> io::Result<()> {
        self.gpu_names.insert(device, name.to_owned());
        self.process(GPU_PID_BASE + device, name)
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
        self.event(
            ts_ns,
            TrackEvent {
                r#type: Some(event_type::COUNTER),
                track_uuid: Some(uuid),
                double_counter_value: Some(value),
                ..TrackEvent::default()
            },
        )
    }

    fn finish(&mut self, _stats: &ExportStats) -> io::Result<()> {
        self.out.flush()
    }
}
