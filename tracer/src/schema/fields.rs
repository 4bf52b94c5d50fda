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
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("{:#x}", self.0))
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
