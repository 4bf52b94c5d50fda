//! Perfetto's native protobuf format: a `Trace` whose `TracePacket`s are written one at a
//! time (track descriptors first, then track events), on one packet sequence.
//!
//! Slices are a `TYPE_SLICE_BEGIN`/`TYPE_SLICE_END` pair; flows are `flow_ids` on the
//! launch and `terminating_flow_ids` on its synchronisation (or, `--gpu`, its GPU work). Timestamps are nanoseconds
//! since the time base, in the trace's default clock domain. Event names, categories and
//! argument names are interned: sent once, then referred to by number.

use std::io::{self, Write};

use foldhash::HashMap;

use prost::Message;

use super::{
    arguments::{Arg, Arguments},
    call_args::{CALL_ARG_KEYS, SliceArgs, hex_digits},
    flows::FlowStart,
    proto::{
        CounterDescriptor, InternedData, InternedString, ProcessDescriptor, ProcessTree,
        ProcessTreeProcess, SEQ_INCREMENTAL_STATE_CLEARED, SEQ_NEEDS_INCREMENTAL_STATE,
        TRACE_PACKET_FIELD, TRACE_PACKET_TAG, ThreadDescriptor, TracePacket, TrackDescriptor,
        TrackEvent, UNIT_SIZE_BYTES, annotation_field, event_field, event_type, packet_field,
    },
    timeline::{
        ExportStats, GPU_PID_BASE, GpuCounter, Instant, ProcessName, Slice, TimelineSink, Track,
    },
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
        }
    }

    /// The sequence flags of the next packet: the first clears the incremental state, track
    /// events depend on it (the interned names).
    fn next_flags(&mut self, track_event: bool) -> Option<u32> {
        self.packets += 1;
        match (self.packets, track_event) {
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
        packet.sequence_flags = self.next_flags(packet.track_event.is_some());
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

/// A `TracePacket` holding one `TrackEvent`, encoded field by field as prost encodes a
/// [`TracePacket`] (fields in tag order) without building one: the event as `event`
/// writes it, then the interned data it gives (after the event, whose argument names may
/// be interned as they are written), then the sequence `flags`.
/// `large`: the event will likely take 128 bytes or more (names and arguments), so two
/// bytes are set aside for the lengths.
fn track_event_packet<'d>(
    buf: &mut Vec<u8>,
    ts_ns: u64,
    large: bool,
    flags: Option<u32>,
    event: impl FnOnce(&mut Vec<u8>) -> Option<&'d InternedData>,
) {
    let guess = if large { 2 } else { 1 };
    wire::message(buf, TRACE_PACKET_FIELD, guess, |packet| {
        wire::varint(packet, packet_field::TIMESTAMP, ts_ns);
        wire::varint(
            packet,
            packet_field::TRUSTED_PACKET_SEQUENCE_ID,
            SEQUENCE_ID.into(),
        );
        let mut interned_data = None;
        wire::message(packet, packet_field::TRACK_EVENT, guess, |track_event| {
            interned_data = event(track_event);
        });
        if let Some(data) = interned_data {
            prost::encoding::message::encode(packet_field::INTERNED_DATA, data, packet);
        }
        if let Some(flags) = flags {
            wire::varint(packet, packet_field::SEQUENCE_FLAGS, flags.into());
        }
    });
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

/// A `DebugAnnotation`'s fields in tag order: the name's iid, the value, the name in full
/// where it is not interned. Values as the JSON map had them: non-negative integers
/// unsigned, arrays and objects as JSON.
fn debug_annotation(buf: &mut Vec<u8>, key: &str, iid: Option<u64>, value: Arg<'_>) {
    if let Some(iid) = iid {
        wire::varint(buf, annotation_field::NAME_IID, iid);
    }
    match value {
        Arg::Bool(flag) => wire::varint(buf, annotation_field::BOOL_VALUE, flag.into()),
        Arg::Unsigned(n) => wire::varint(buf, annotation_field::UINT_VALUE, n),
        Arg::Signed(n) => wire::varint(buf, annotation_field::INT_VALUE, n as u64),
        Arg::Float(x) => wire::fixed64(buf, annotation_field::DOUBLE_VALUE, x.to_bits()),
        Arg::Text(text) => wire::string(buf, annotation_field::STRING_VALUE, text),
        Arg::Hex(value) => {
            let mut text = [0; 18];
            wire::bytes(
                buf,
                annotation_field::STRING_VALUE,
                hex_digits(&mut text, value),
            );
        }
        Arg::Json(json) => wire::string(buf, annotation_field::LEGACY_JSON_VALUE, json),
    }
    if iid.is_none() {
        wire::string(buf, annotation_field::NAME, key);
    }
}

/// The bytes [`debug_annotation`] writes.
fn debug_annotation_len(key: &str, iid: Option<u64>, value: Arg<'_>) -> usize {
    use prost::encoding::{encoded_len_varint, key_len};
    let delimited =
        |field: u32, length: usize| key_len(field) + encoded_len_varint(length as u64) + length;
    let name = match iid {
        Some(iid) => key_len(annotation_field::NAME_IID) + encoded_len_varint(iid),
        None => delimited(annotation_field::NAME, key.len()),
    };
    let value = match value {
        Arg::Bool(flag) => key_len(annotation_field::BOOL_VALUE) + encoded_len_varint(flag.into()),
        Arg::Unsigned(n) => key_len(annotation_field::UINT_VALUE) + encoded_len_varint(n),
        Arg::Signed(n) => key_len(annotation_field::INT_VALUE) + encoded_len_varint(n as u64),
        Arg::Float(_) => key_len(annotation_field::DOUBLE_VALUE) + 8,
        Arg::Text(text) => delimited(annotation_field::STRING_VALUE, text.len()),
        Arg::Hex(value) => {
            let digits = (64 - (value | 1).leading_zeros()).div_ceil(4) as usize;
            delimited(annotation_field::STRING_VALUE, 2 + digits)
        }
        Arg::Json(json) => delimited(annotation_field::LEGACY_JSON_VALUE, json.len()),
    };
    name + value
}

/// The protobuf wire format, written straight into a buffer.
mod wire {
    use prost::encoding::{WireType, encoded_len_varint};

    /// Seven bits a byte, low first, the high bit set on all but the last (as prost).
    pub fn raw_varint(buf: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            buf.push((value as u8 & 0x7f) | 0x80);
            value >>= 7;
        }
        buf.push(value as u8);
    }

    fn key(buf: &mut Vec<u8>, field: u32, wire_type: WireType) {
        raw_varint(buf, u64::from(field << 3 | wire_type as u32));
    }

    pub fn varint(buf: &mut Vec<u8>, field: u32, value: u64) {
        key(buf, field, WireType::Varint);
        raw_varint(buf, value);
    }

    pub fn fixed64(buf: &mut Vec<u8>, field: u32, value: u64) {
        key(buf, field, WireType::SixtyFourBit);
        buf.extend_from_slice(&value.to_le_bytes());
    }

    /// A length-delimited field's key and length; its `length` bytes follow.
    pub fn length_delimited(buf: &mut Vec<u8>, field: u32, length: usize) {
        key(buf, field, WireType::LengthDelimited);
        raw_varint(buf, length as u64);
    }

    pub fn string(buf: &mut Vec<u8>, field: u32, text: &str) {
        bytes(buf, field, text.as_bytes());
    }

    pub fn bytes(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
        key(buf, field, WireType::LengthDelimited);
        raw_varint(buf, bytes.len() as u64);
        buf.extend_from_slice(bytes);
    }

    /// A nested message: its length is known once `body` has written it, so `guess` bytes
    /// are set aside for it and the body moved when the length needs another width.
    pub fn message(buf: &mut Vec<u8>, field: u32, guess: usize, body: impl FnOnce(&mut Vec<u8>)) {
        key(buf, field, WireType::LengthDelimited);
        let length_at = buf.len();
        buf.resize(length_at + guess, 0);
        body(buf);
        let length = buf.len() - length_at - guess;
        let width = encoded_len_varint(length as u64);
        if width > guess {
            let extra = width - guess;
            buf.splice(length_at..length_at, std::iter::repeat_n(0, extra));
        } else if width < guess {
            buf.copy_within(length_at + guess.., length_at + width);
            buf.truncate(length_at + width + length);
        }
        let mut rest = length;
        for (index, byte) in buf[length_at..length_at + width].iter_mut().enumerate() {
            let more = if index + 1 < width { 0x80 } else { 0 };
            *byte = (rest & 0x7f) as u8 | more;
            rest >>= 7;
        }
    }
}

/// Like a `BufWriter`, what was gathered is handed on when the writer is dropped (after a
/// failed read, the events before it).
impl<W: Write> Drop for PerfettoWriter<W> {
    fn drop(&mut self) {
        let _ = self.out.write_all(&self.buf);
    }
}

impl<W: Write> TimelineSink for PerfettoWriter<W> {
    fn header(&mut self, _header: &Header, _base_ns: u64) -> io::Result<()> {
        Ok(())
    }

    fn process(&mut self, process: &ProcessName<'_>) -> io::Result<()> {
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

    fn finish(&mut self, _stats: &ExportStats) -> io::Result<()> {
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::{Arg, debug_annotation, debug_annotation_len, wire};

    /// Every kind of value, named by iid or in full, short and long: the length is what
    /// is written.
    #[test]
    fn annotation_lengths_are_what_is_written() {
        let long = "k".repeat(300);
        let values = [
            Arg::Bool(true),
            Arg::Unsigned(0),
            Arg::Unsigned(u64::MAX),
            Arg::Signed(-1),
            Arg::Float(1.5),
            Arg::Text(""),
            Arg::Text(&long),
            Arg::Hex(0),
            Arg::Hex(0x7f00_0000_1234),
            Arg::Hex(u64::MAX),
            Arg::Json("[1,2,3]"),
        ];
        for value in values {
            for (key, iid) in [("bytes", Some(1)), ("bytes", Some(300)), ("name", None)] {
                let mut written = Vec::new();
                debug_annotation(&mut written, key, iid, value);
                assert_eq!(
                    written.len(),
                    debug_annotation_len(key, iid, value),
                    "{value:?}"
                );
            }
        }
    }

    /// A nested message's length takes the width it needs, whatever was set aside for it,
    /// as prost writes it.
    #[test]
    fn nested_lengths_are_written_as_prost_writes_them() {
        for length in [0, 1, 127, 128, 16_383, 16_384, 300_000] {
            let body = vec![7u8; length];
            let mut expected = vec![1u8];
            prost::encoding::bytes::encode(4, &body, &mut expected);
            for guess in [1, 2, 3] {
                let mut written = vec![1u8];
                wire::message(&mut written, 4, guess, |buf| buf.extend_from_slice(&body));
                assert!(written == expected, "length {length}, guess {guess}");
            }
        }
    }
}
