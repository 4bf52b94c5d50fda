//! The few messages of Perfetto's trace format that `--format perfetto` writes, with the
//! field numbers of Perfetto's protos/perfetto/trace/{trace,trace_packet}.proto,
//! track_event/{track_event,track_descriptor,process_descriptor,thread_descriptor,
//! counter_descriptor,debug_annotation}.proto, ps/process_tree.proto,
//! interned_data/interned_data.proto, trace_packet_defaults.proto and
//! profiling/{profile_common,profile_packet}.proto (`--stacks`' samples), and
//! common/perf_events.proto. Fields not listed are never written.
//!
//! Self-contained (only `prost`): the CLI tests include this file to decode exports.

use std::collections::HashMap;

/// `Trace`: the file is its `packet` field repeated, so packets can be streamed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Trace {
    #[prost(message, repeated, tag = "1")]
    pub packet: Vec<TracePacket>,
}

/// `Trace.packet`, and its tag (field 1, length-delimited) before each streamed packet.
pub const TRACE_PACKET_FIELD: u32 = 1;
pub const TRACE_PACKET_TAG: u8 = (1 << 3) | 2;

/// Field numbers of the messages below, for the writer's hand encoding of track event
/// packets (tested against these messages' own encoding).
pub mod packet_field {
    pub const TIMESTAMP: u32 = 8;
    pub const TRUSTED_PACKET_SEQUENCE_ID: u32 = 10;
    pub const TRACK_EVENT: u32 = 11;
    pub const INTERNED_DATA: u32 = 12;
    pub const SEQUENCE_FLAGS: u32 = 13;
}

pub mod event_field {
    pub const CATEGORY_IIDS: u32 = 3;
    pub const DEBUG_ANNOTATIONS: u32 = 4;
    pub const TYPE: u32 = 9;
    pub const NAME_IID: u32 = 10;
    pub const TRACK_UUID: u32 = 11;
    pub const CATEGORIES: u32 = 22;
    pub const NAME: u32 = 23;
    pub const COUNTER_VALUE: u32 = 30;
    pub const FLOW_IDS: u32 = 47;
    pub const TERMINATING_FLOW_IDS: u32 = 48;
}

pub mod annotation_field {
    pub const NAME_IID: u32 = 1;
    pub const BOOL_VALUE: u32 = 2;
    pub const UINT_VALUE: u32 = 3;
    pub const INT_VALUE: u32 = 4;
    pub const DOUBLE_VALUE: u32 = 5;
    pub const STRING_VALUE: u32 = 6;
    pub const LEGACY_JSON_VALUE: u32 = 9;
    pub const NAME: u32 = 10;
}

/// `TracePacket.sequence_flags`: SEQ_INCREMENTAL_STATE_CLEARED (the first packet) and
/// SEQ_NEEDS_INCREMENTAL_STATE (packets that refer to interned names).
pub const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
pub const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct TracePacket {
    /// A process renamed by an exec (see [`ProcessTree`]).
    #[prost(message, optional, tag = "2")]
    pub process_tree: Option<ProcessTree>,
    /// Nanoseconds, in the trace's default clock domain.
    #[prost(uint64, optional, tag = "8")]
    pub timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "10")]
    pub trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "11")]
    pub track_event: Option<TrackEvent>,
    /// Names this packet adds to the sequence's interning tables.
    #[prost(message, optional, tag = "12")]
    pub interned_data: Option<InternedData>,
    #[prost(uint32, optional, tag = "13")]
    pub sequence_flags: Option<u32>,
    /// `--stacks`: names the samples' timebase (see [`PerfSampleDefaults`]).
    #[prost(message, optional, tag = "59")]
    pub trace_packet_defaults: Option<TracePacketDefaults>,
    #[prost(message, optional, tag = "60")]
    pub track_descriptor: Option<TrackDescriptor>,
    /// `--stacks`: one sample of a thread's Python stack.
    #[prost(message, optional, tag = "66")]
    pub perf_sample: Option<PerfSample>,
}

/// `PerfSample`: a thread's callstack (an interned [`Callstack`]) at the packet's time.
/// The trace processor puts it in `perf_sample`, and its `timebase_count` (0 here) on its
/// session's timebase counter track.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PerfSample {
    #[prost(uint32, optional, tag = "2")]
    pub pid: Option<u32>,
    #[prost(uint32, optional, tag = "3")]
    pub tid: Option<u32>,
    #[prost(uint64, optional, tag = "4")]
    pub callstack_iid: Option<u64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TracePacketDefaults {
    #[prost(message, optional, tag = "12")]
    pub perf_sample_defaults: Option<PerfSampleDefaults>,
}

/// Names the sequence's perf session: its timebase counter track takes `timebase.name`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PerfSampleDefaults {
    #[prost(message, optional, tag = "1")]
    pub timebase: Option<PerfTimebase>,
}

/// `PerfEvents.Timebase`: only its name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PerfTimebase {
    #[prost(string, optional, tag = "10")]
    pub name: Option<String>,
}

/// `Mapping`: a Python file, named by one interned path (`mapping_paths`); no addresses.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(uint64, repeated, packed = "false", tag = "7")]
    pub path_string_ids: Vec<u64>,
}

/// `Frame`: a Python frame, its function name interned (`function_names`), its line as
/// `rel_pc`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Frame {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(uint64, optional, tag = "2")]
    pub function_name_id: Option<u64>,
    #[prost(uint64, optional, tag = "3")]
    pub mapping_id: Option<u64>,
    #[prost(uint64, optional, tag = "4")]
    pub rel_pc: Option<u64>,
}

/// `Callstack`: frames, outermost ("bottom") first.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Callstack {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(uint64, repeated, packed = "false", tag = "2")]
    pub frame_ids: Vec<u64>,
}

/// `TrackEvent.Type`.
pub mod event_type {
    pub const SLICE_BEGIN: i32 = 1;
    pub const SLICE_END: i32 = 2;
    pub const INSTANT: i32 = 3;
    pub const COUNTER: i32 = 4;
}

/// Strings sent once per sequence and referred to by their `iid` (never 0) afterwards.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternedData {
    #[prost(message, repeated, tag = "1")]
    pub event_categories: Vec<InternedString>,
    #[prost(message, repeated, tag = "2")]
    pub event_names: Vec<InternedString>,
    #[prost(message, repeated, tag = "3")]
    pub debug_annotation_names: Vec<InternedString>,
    #[prost(message, repeated, tag = "5")]
    pub function_names: Vec<InternedString>,
    #[prost(message, repeated, tag = "6")]
    pub frames: Vec<Frame>,
    #[prost(message, repeated, tag = "7")]
    pub callstacks: Vec<Callstack>,
    #[prost(message, repeated, tag = "17")]
    pub mapping_paths: Vec<InternedString>,
    #[prost(message, repeated, tag = "19")]
    pub mappings: Vec<Mapping>,
}

/// `EventCategory`, `EventName`, `DebugAnnotationName` and `InternedString` (function
/// names, mapping paths: `bytes str = 2`) share this shape.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InternedString {
    #[prost(uint64, optional, tag = "1")]
    pub iid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TrackEvent {
    #[prost(uint64, repeated, packed = "false", tag = "3")]
    pub category_iids: Vec<u64>,
    #[prost(message, repeated, tag = "4")]
    pub debug_annotations: Vec<DebugAnnotation>,
    #[prost(uint64, optional, tag = "10")]
    pub name_iid: Option<u64>,
    /// A [`event_type`] value.
    #[prost(int32, optional, tag = "9")]
    pub r#type: Option<i32>,
    #[prost(uint64, optional, tag = "11")]
    pub track_uuid: Option<u64>,
    #[prost(string, repeated, tag = "22")]
    pub categories: Vec<String>,
    #[prost(string, optional, tag = "23")]
    pub name: Option<String>,
    #[prost(int64, optional, tag = "30")]
    pub counter_value: Option<i64>,
    #[prost(double, optional, tag = "44")]
    pub double_counter_value: Option<f64>,
    /// Declared `repeated fixed64` in proto2: not packed.
    #[prost(fixed64, repeated, packed = "false", tag = "47")]
    pub flow_ids: Vec<u64>,
    #[prost(fixed64, repeated, packed = "false", tag = "48")]
    pub terminating_flow_ids: Vec<u64>,
}

/// One argument of an event (a `oneof` value in the proto: exactly one is set).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DebugAnnotation {
    #[prost(uint64, optional, tag = "1")]
    pub name_iid: Option<u64>,
    #[prost(bool, optional, tag = "2")]
    pub bool_value: Option<bool>,
    #[prost(uint64, optional, tag = "3")]
    pub uint_value: Option<u64>,
    #[prost(int64, optional, tag = "4")]
    pub int_value: Option<i64>,
    #[prost(double, optional, tag = "5")]
    pub double_value: Option<f64>,
    #[prost(string, optional, tag = "6")]
    pub string_value: Option<String>,
    /// Shown as JSON by the viewer (arrays such as `grid`).
    #[prost(string, optional, tag = "9")]
    pub legacy_json_value: Option<String>,
    #[prost(string, optional, tag = "10")]
    pub name: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    pub uuid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
    #[prost(message, optional, tag = "3")]
    pub process: Option<ProcessDescriptor>,
    #[prost(message, optional, tag = "4")]
    pub thread: Option<ThreadDescriptor>,
    #[prost(uint64, optional, tag = "5")]
    pub parent_uuid: Option<u64>,
    #[prost(message, optional, tag = "8")]
    pub counter: Option<CounterDescriptor>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessDescriptor {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(string, optional, tag = "6")]
    pub process_name: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ThreadDescriptor {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    pub tid: Option<i32>,
    #[prost(string, optional, tag = "5")]
    pub thread_name: Option<String>,
}

/// Processes as a system probe lists them. The trace processor takes a process's name from
/// the first `ProcessDescriptor` only (later ones never override it), but from each
/// `ProcessTree` in timestamp order: an exec's new name is sent this way.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessTree {
    #[prost(message, repeated, tag = "1")]
    pub processes: Vec<ProcessTreeProcess>,
}

/// `ProcessTree.Process`: the trace processor names the process after `cmdline[0]`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessTreeProcess {
    #[prost(int32, optional, tag = "1")]
    pub pid: Option<i32>,
    #[prost(int32, optional, tag = "2")]
    pub ppid: Option<i32>,
    #[prost(string, repeated, tag = "3")]
    pub cmdline: Vec<String>,
}

/// `CounterDescriptor.Unit`: UNIT_SIZE_BYTES.
pub const UNIT_SIZE_BYTES: i32 = 3;

#[derive(Clone, PartialEq, prost::Message)]
pub struct CounterDescriptor {
    #[prost(int32, optional, tag = "3")]
    pub unit: Option<i32>,
}

/// Puts the interned names back into the events (`name`, `categories`, annotation
/// `name`), in packet order, to read a decoded trace (the tests).
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "the writer streams packets; tests decode")
)]
pub fn resolve_interned(trace: &mut Trace) {
    let mut names: HashMap<u64, String> = HashMap::new();
    let mut categories: HashMap<u64, String> = HashMap::new();
    let mut annotations: HashMap<u64, String> = HashMap::new();
    for packet in &mut trace.packet {
        if let Some(data) = &packet.interned_data {
            for (table, entries) in [
                (&mut names, &data.event_names),
                (&mut categories, &data.event_categories),
                (&mut annotations, &data.debug_annotation_names),
            ] {
                for entry in entries {
                    table.insert(
                        entry.iid.unwrap_or(0),
                        entry.name.clone().unwrap_or_default(),
                    );
                }
            }
        }
        let Some(event) = &mut packet.track_event else {
            continue;
        };
        if let Some(iid) = event.name_iid {
            event.name = names.get(&iid).cloned();
        }
        for iid in &event.category_iids {
            event.categories.extend(categories.get(iid).cloned());
        }
        for annotation in &mut event.debug_annotations {
            if let Some(iid) = annotation.name_iid {
                annotation.name = annotations.get(&iid).cloned();
            }
        }
    }
}
