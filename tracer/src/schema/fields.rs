//! What lines share: the `"type"` each opens with, pointers as hex strings, and how a JSON
//! error in a line is worded.

use std::{fmt, marker::PhantomData};

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{self, IgnoredAny, Visitor},
};

/// A kind of line: the value of its `"type"` key.
pub trait LineType {
    const TYPE: &'static str;
}

/// The `"type"` key of a line of type `L`: always `L::TYPE`. It is each line struct's first
/// field, so every line opens with its type (`{"type":"call",`: the reader's fast path).
/// Reading ignores it: the reader has dispatched on it already.
pub struct Tag<L>(PhantomData<fn() -> L>);

impl<L> Tag<L> {
    pub const fn new() -> Self {
        Tag(PhantomData)
    }
}

impl<L> Default for Tag<L> {
    fn default() -> Self {
        Tag::new()
    }
}

impl<L> Clone for Tag<L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L> Copy for Tag<L> {}

impl<L> PartialEq for Tag<L> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<L> Eq for Tag<L> {}

impl<L: LineType> fmt::Debug for Tag<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(L::TYPE)
    }
}

impl<L: LineType> Serialize for Tag<L> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(L::TYPE)
    }
}

impl<'de, L> Deserialize<'de> for Tag<L> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(deserializer)?;
        Ok(Tag::new())
    }
}

/// A pointer or handle, written as a `"0x..."` string (JSON numbers lose precision past 2^53).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Hex(pub u64);

impl Serialize for Hex {
    /// `{:#x}`, written by hand: every call line has a few, and the formatting machinery
    /// costs more than the digits.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; 18];
        let width = (64 - (self.0 | 1).leading_zeros()).div_ceil(4) as usize;
        text[..2].copy_from_slice(b"0x");
        for (index, byte) in text[2..2 + width].iter_mut().enumerate() {
            let shift = 4 * (width - 1 - index);
            *byte = DIGITS[(self.0 >> shift) as usize & 0xf];
        }
        // ASCII digits.
        let text = std::str::from_utf8(&text[..2 + width]).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(text)
    }
}

impl<'de> Deserialize<'de> for Hex {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(HexVisitor)
    }
}

/// Reads the string where it lies (a `String` would be allocated for each pointer).
struct HexVisitor;

impl Visitor<'_> for HexVisitor {
    type Value = Hex;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Hex, E> {
        let digits = text.strip_prefix("0x").unwrap_or(text);
        u64::from_str_radix(digits, 16).map(Hex).map_err(E::custom)
    }
}

/// serde_json's message with the column; every trace line is one line of text.
pub fn describe(error: &serde_json::Error) -> String {
    let text = error.to_string();
    if error.line() == 0 {
        return text;
    }
    let message = text
        .rsplit_once(" at line ")
        .map_or(text.as_str(), |(message, _)| message);
    format!("{message} at column {}", error.column())
}

#[cfg(test)]
mod tests {
    use super::Hex;

    #[test]
    fn pointers_are_written_as_format_writes_them() {
        for value in [0, 1, 0xf, 0x10, 0x7f00_0000_0000, u64::MAX, 1 << 63, 0xabc] {
            assert_eq!(
                serde_json::to_string(&Hex(value)).unwrap(),
                format!("\"{value:#x}\"")
            );
        }
    }
}
