//! The protobuf wire format, written straight into a buffer.

use prost::encoding::{WireType, encoded_len_varint};

/// Seven bits a byte, low first, the high bit set on all but the last (as prost).
#[inline]
pub fn raw_varint(buf: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        buf.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    buf.push(value as u8);
}

#[inline]
fn key(buf: &mut Vec<u8>, field: u32, wire_type: WireType) {
    raw_varint(buf, u64::from(field << 3 | wire_type as u32));
}

#[inline]
pub fn varint(buf: &mut Vec<u8>, field: u32, value: u64) {
    key(buf, field, WireType::Varint);
    raw_varint(buf, value);
}

#[inline]
pub fn fixed64(buf: &mut Vec<u8>, field: u32, value: u64) {
    key(buf, field, WireType::SixtyFourBit);
    buf.extend_from_slice(&value.to_le_bytes());
}

/// A length-delimited field's key and length; its `length` bytes follow.
#[inline]
pub fn length_delimited(buf: &mut Vec<u8>, field: u32, length: usize) {
    key(buf, field, WireType::LengthDelimited);
    raw_varint(buf, length as u64);
}

#[inline]
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
