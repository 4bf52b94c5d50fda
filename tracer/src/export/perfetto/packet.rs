//! Track event packets and their debug annotations, encoded field by field without
//! building prost's messages (nearly every packet of an export is one).

use super::{SEQUENCE_ID, wire};
use crate::export::{
    arguments::Arg,
    call_args::hex_digits,
    proto::{InternedData, TRACE_PACKET_FIELD, annotation_field, packet_field},
};

/// A `TracePacket` holding one `TrackEvent`, encoded field by field as prost encodes a
/// [`TracePacket`] (fields in tag order) without building one: the event as `event`
/// writes it, then the interned data it gives (after the event, whose argument names may
/// be interned as they are written), then the sequence `flags`.
/// `large`: the event will likely take 128 bytes or more (names and arguments), so two
/// bytes are set aside for the lengths.
pub(super) fn track_event_packet<'d>(
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

/// A `DebugAnnotation`'s fields in tag order: the name's iid, the value, the name in full
/// where it is not interned. Values as the JSON map had them: non-negative integers
/// unsigned, arrays and objects as JSON.
// Inlinable from any codegen unit: written once per argument of every slice.
#[inline]
pub(super) fn debug_annotation(buf: &mut Vec<u8>, key: &str, iid: Option<u64>, value: Arg<'_>) {
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
#[inline]
pub(super) fn debug_annotation_len(key: &str, iid: Option<u64>, value: Arg<'_>) -> usize {
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
