//! Perfetto's native protobuf format: a `Trace` whose `TracePacket`s are written one at a
//! time (track descriptors first, then track events), on one packet sequence.
//!
//! Slices are a `TYPE_SLICE_BEGIN`/`TYPE_SLICE_END` pair; flows are `flow_ids` on the
//! launch and `terminating_flow_ids` on its synchronisation (or, `--gpu`, its GPU work). Timestamps are nanoseconds
//! since the time base, in the trace's default clock domain. Event names, categories and
//! argument names are interned: sent once, then referred to by number.
//!
//! `--stacks`: stacks are also interned callstacks, sampled per call and per µs of GPU
//! time (`profile.rs`).
//!
//! Here the writer, its tracks and interning; `sink.rs` turns the timeline's events into
//! packets, `packet.rs` and `wire.rs` encode track events without building messages.

mod packet;
mod profile;
mod sink;
mod wire;

use std::io::{self, Write};

use foldhash::HashMap;

use prost::Message;

use super::{
    arguments::{Arg, Arguments},
    call_args::{CALL_ARG_KEYS, SliceArgs},
    flows::FlowStart,
    proto::{
        InternedData, InternedString, SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE,
        TRACE_PACKET_TAG, TracePacket, TrackDescriptor, event_field,
    },
    timeline::{GpuCounter, Track},
};
use packet::{debug_annotation, debug_annotation_len, track_event_packet};

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
    /// `--stacks --gpu`: the thread of a thread's GPU-time samples, by pid and tid.
    GpuTime(u32, u32),
}

/// Output is gathered here and handed to the writer in blocks of this size.
const FLUSH_BYTES: usize = 256 << 10;

pub struct PerfettoWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
    packets: u64,
    /// The latest event timestamp written.
    latest_ts_ns: u64,
    /// The track of the last event and its uuid.
    last_track: Option<(Track, u64)>,
    uuids: HashMap<TrackKey, u64>,
    /// GPU groups' names, by device.
    gpu_names: HashMap<u32, String>,
    names: Interner,
    categories: Interner,
    annotation_names: Interner,
    known_names: KnownNames,
    /// A call's argument names' iids, by index in [`CALL_ARG_KEYS`], once looked up.
    call_iids: [Option<Option<u64>>; CALL_ARG_KEYS.len()],
    /// `--stacks`: interned frames and stacks, and how samples are drawn.
    profile: profile::Profile,
}

/// A list of (static) argument names, by address and length, and their iids.
type KnownList = (Vec<(usize, usize)>, Vec<Option<u64>>);

/// Argument names' iids remembered per list of (static) names: a direct-mapped table.
struct KnownNames {
    lists: Vec<Option<KnownList>>,
    scratch_keys: Vec<(usize, usize)>,
    scratch_iids: Vec<Option<u64>>,
}

impl KnownNames {
    const SLOTS: usize = 64;

    fn new() -> KnownNames {
        KnownNames {
            lists: vec![None; Self::SLOTS],
            scratch_keys: Vec::new(),
            scratch_iids: Vec::new(),
        }
    }

    /// The table slot of `scratch_keys`.
    fn slot(&self) -> usize {
        let hash = self
            .scratch_keys
            .iter()
            .fold(0u64, |hash, (address, length)| {
                (hash.rotate_left(5) ^ (*address as u64) ^ ((*length as u64) << 48))
                    .wrapping_mul(0x517c_c1b7_2722_0a95)
            });
        (hash >> 58) as usize % Self::SLOTS
    }
}

impl<W: Write> PerfettoWriter<W> {
    pub fn new(out: W) -> Self {
        PerfettoWriter {
            out,
            buf: Vec::with_capacity(FLUSH_BYTES + 4096),
            packets: 0,
            latest_ts_ns: 0,
            last_track: None,
            uuids: HashMap::default(),
            gpu_names: HashMap::default(),
            names: Interner::default(),
            categories: Interner::default(),
            annotation_names: Interner::default(),
            known_names: KnownNames::new(),
            call_iids: [None; CALL_ARG_KEYS.len()],
            profile: profile::Profile::default(),
        }
    }

    /// The sequence flags of the next packet: the first clears the incremental state, track
    /// events and samples depend on it (the interned names and stacks).
    fn next_flags(&mut self, needs_state: bool) -> Option<u32> {
        self.packets += 1;
        match (self.packets, needs_state) {
            (1, _) => Some(SEQ_INCREMENTAL_STATE_CLEARED),
            (_, true) => Some(SEQ_NEEDS_INCREMENTAL_STATE),
            (_, false) => None,
        }
    }

    /// Hands the output on once a block is full.
    fn written(&mut self) -> io::Result<()> {
        if self.buf.len() >= FLUSH_BYTES {
            self.out.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    /// A packet built as a message (descriptors, renames: a few per process).
    fn packet(&mut self, mut packet: TracePacket) -> io::Result<()> {
        packet.trusted_packet_sequence_id = Some(SEQUENCE_ID);
        packet.sequence_flags =
            self.next_flags(packet.track_event.is_some() || packet.perf_sample.is_some());
        self.buf.push(TRACE_PACKET_TAG);
        packet
            .encode_length_delimited(&mut self.buf)
            .map_err(io::Error::other)?;
        self.written()
    }

    /// A track event packet (nearly every packet): see [`track_event_packet`].
    fn event_packet(
        &mut self,
        ts_ns: u64,
        interned_data: Option<&InternedData>,
        large: bool,
        event: impl FnOnce(&mut Vec<u8>),
    ) -> io::Result<()> {
        let flags = self.next_event(ts_ns);
        track_event_packet(&mut self.buf, ts_ns, large, flags, |track_event| {
            event(track_event);
            interned_data
        });
        self.written()
    }

    /// Notes a track event at `ts_ns`; gives its packet's sequence flags.
    fn next_event(&mut self, ts_ns: u64) -> Option<u32> {
        self.latest_ts_ns = self.latest_ts_ns.max(ts_ns);
        self.next_flags(true)
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
        // Runs of events on one track: its uuid, once looked up, stays.
        if let Some((last, uuid)) = self.last_track
            && last == track
        {
            return Ok(uuid);
        }
        let (uuid, new) = self.uuid(TrackKey::Event(track));
        self.last_track = Some((track, uuid));
        if new && track == Track::Global {
            self.describe(TrackDescriptor {
                uuid: Some(uuid),
                name: Some("cudatrace".into()),
                ..TrackDescriptor::default()
            })?;
        }
        Ok(uuid)
    }

    /// A named event (a slice's begin, an instant): its name, category and argument names
    /// interned.
    fn named_event(
        &mut self,
        ts_ns: u64,
        event: NamedEvent<'_>,
        args: SliceArgs<'_>,
    ) -> io::Result<()> {
        let mut new = InternedData::default();
        let name_iid = self.names.iid(event.name, &mut new.event_names);
        let category_iid = self
            .categories
            .iid(event.category, &mut new.event_categories);
        // A call's argument names are interned as they are written, below.
        let annotation_iids = match args {
            SliceArgs::Collected(arguments) => {
                self.annotation_iids(arguments, &mut new.debug_annotation_names)
            }
            SliceArgs::Call(_) => std::mem::take(&mut self.known_names.scratch_iids),
        };
        let large = !args.is_empty() || event.name.len() > 64;
        let flags = self.next_event(ts_ns);
        let annotation_names = &mut self.annotation_names;
        let call_iids = &mut self.call_iids;
        let new = &mut new;
        track_event_packet(&mut self.buf, ts_ns, large, flags, |track_event| {
            // TrackEvent fields in tag order.
            if let Some(iid) = category_iid {
                wire::varint(track_event, event_field::CATEGORY_IIDS, iid);
            }
            let mut annotation = |key: &str, iid: Option<u64>, value: Arg<'_>| {
                // Its length is known before it is written: no room to set aside.
                let length = debug_annotation_len(key, iid, value);
                wire::length_delimited(track_event, event_field::DEBUG_ANNOTATIONS, length);
                let start = track_event.len();
                debug_annotation(track_event, key, iid, value);
                debug_assert_eq!(track_event.len() - start, length);
            };
            match args {
                SliceArgs::Collected(arguments) => {
                    for ((key, value), iid) in arguments.iter().zip(&annotation_iids) {
                        annotation(key, *iid, value);
                    }
                }
                SliceArgs::Call(call) => call.visit(|index, key, value| {
                    let iid = *call_iids[index].get_or_insert_with(|| {
                        annotation_names.iid(key, &mut new.debug_annotation_names)
                    });
                    annotation(key, iid, value);
                }),
            }
            wire::varint(track_event, event_field::TYPE, event.kind as u64);
            if let Some(iid) = name_iid {
                wire::varint(track_event, event_field::NAME_IID, iid);
            }
            wire::varint(track_event, event_field::TRACK_UUID, event.track_uuid);
            if category_iid.is_none() {
                wire::string(track_event, event_field::CATEGORIES, event.category);
            }
            if name_iid.is_none() {
                wire::string(track_event, event_field::NAME, event.name);
            }
            for id in event.flow_out {
                wire::fixed64(track_event, event_field::FLOW_IDS, *id);
            }
            for start in event.flows_in {
                wire::fixed64(track_event, event_field::TERMINATING_FLOW_IDS, start.id);
            }
            let fresh = !(new.event_names.is_empty()
                && new.event_categories.is_empty()
                && new.debug_annotation_names.is_empty());
            fresh.then_some(&*new)
        });
        self.known_names.scratch_iids = annotation_iids;
        self.written()
    }

    /// The iids of the arguments' names, in order (`None`: written in full). A line type's
    /// names come in the same order each time: the list is remembered per list of names.
    fn annotation_iids(
        &mut self,
        args: &Arguments,
        new: &mut Vec<InternedString>,
    ) -> Vec<Option<u64>> {
        let known = &mut self.known_names;
        let mut iids = std::mem::take(&mut known.scratch_iids);
        iids.clear();
        if args.static_keys(&mut known.scratch_keys) {
            let slot = known.slot();
            if let Some((keys, remembered)) = &known.lists[slot]
                && *keys == known.scratch_keys
            {
                iids.extend_from_slice(remembered);
                return iids;
            }
            for (key, _) in args.iter() {
                iids.push(self.annotation_names.iid(key, new));
            }
            let known = &mut self.known_names;
            known.lists[slot] = Some((known.scratch_keys.clone(), iids.clone()));
            return iids;
        }
        for (key, _) in args.iter() {
            iids.push(self.annotation_names.iid(key, new));
        }
        iids
    }

    /// A slice's end or a counter value: an event with no name.
    fn plain_event(
        &mut self,
        ts_ns: u64,
        kind: i32,
        track_uuid: u64,
        counter_value: Option<i64>,
    ) -> io::Result<()> {
        self.event_packet(ts_ns, None, false, |track_event| {
            wire::varint(track_event, event_field::TYPE, kind as u64);
            wire::varint(track_event, event_field::TRACK_UUID, track_uuid);
            if let Some(value) = counter_value {
                wire::varint(track_event, event_field::COUNTER_VALUE, value as u64);
            }
        })
    }
}

/// What a named event carries besides its arguments.
struct NamedEvent<'a> {
    kind: i32,
    track_uuid: u64,
    name: &'a str,
    category: &'a str,
    flow_out: &'a [u64],
    flows_in: &'a [FlowStart],
}

/// Like a `BufWriter`, what was gathered is handed on when the writer is dropped (after a
/// failed read, the events before it).
impl<W: Write> Drop for PerfettoWriter<W> {
    fn drop(&mut self) {
        let _ = self.out.write_all(&self.buf);
    }
}

#[cfg(test)]
mod tests;
