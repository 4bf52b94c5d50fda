//! A slice's or marker's arguments: `args` in the JSON, debug annotations in the protobuf.
//!
//! They are what `serde_json::to_value` would make of a line, keys sorted as a JSON map
//! sorts them, but collected into one reused buffer instead of a map of allocated strings
//! and values: GPU work can be as many as launches. Any `Serialize` line (a GPU activity
//! record, an NCCL call's rank-track slice) gives its fields with [`Arguments::fill`]; a
//! map from elsewhere with [`Arguments::from_map`]. A call's own slice reads its fields
//! straight from the line instead (`call_args`).

use std::{borrow::Cow, fmt::Write as _, ops::Range};

use serde::{
    Serialize, Serializer,
    ser::{self, Impossible, SerializeMap, SerializeStruct},
};
use serde_json::{Map, Value};

/// One argument's value, as a writer sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg<'a> {
    /// A number that fits a `u64` (JSON's non-negative integers).
    Unsigned(u64),
    /// A negative integer.
    Signed(i64),
    Float(f64),
    Bool(bool),
    Text(&'a str),
    /// A pointer or handle: text, `0x` and lowercase hex digits (a call's, read straight
    /// from its line: see [`hex_digits`](super::call_args::hex_digits)).
    Hex(u64),
    /// Anything else (arrays, objects, `null`) as compact JSON.
    Json(&'a str),
}

#[derive(Clone, Debug)]
enum Stored {
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Bool(bool),
    Text(Range<usize>),
    Json(Range<usize>),
}

/// Arguments, in key order once [`sort`](Arguments::sort)ed.
#[derive(Clone, Debug, Default)]
pub struct Arguments {
    /// Strings and JSON texts of the values, one after another.
    text: String,
    entries: Vec<Entry>,
    /// The entries' order once sorted: (key prefix, index).
    order: Vec<(u64, u16)>,
    /// Orders already worked out, by the keys they sort (a line type's fields come in the
    /// same order each time: a few shapes, sorted once each).
    orders: Vec<Option<KnownOrder>>,
    /// The static keys' addresses of the entries being sorted.
    keys: Vec<(usize, usize)>,
}

/// The sorted order of one sequence of static keys.
#[derive(Clone, Debug)]
struct KnownOrder {
    /// The keys' addresses and lengths, as added.
    keys: Vec<(usize, usize)>,
    order: Vec<(u64, u16)>,
}

/// Orders remembered: a direct-mapped table.
const KNOWN_ORDERS: usize = 64;

#[derive(Clone, Debug)]
struct Entry {
    /// The key's first eight bytes, big-endian: sorting compares these first.
    prefix: u64,
    key: Cow<'static, str>,
    value: Stored,
}

impl Entry {
    fn new(key: Cow<'static, str>, value: Stored) -> Entry {
        let mut first = [0u8; 8];
        let length = key.len().min(8);
        first[..length].copy_from_slice(&key.as_bytes()[..length]);
        Entry {
            prefix: u64::from_be_bytes(first),
            key,
            value,
        }
    }
}

impl Arguments {
    pub fn clear(&mut self) {
        self.text.clear();
        self.entries.clear();
        self.order.clear();
    }

    /// Adds the fields `line` serialises (a struct), except those `skip` names.
    pub fn fill<T: Serialize>(&mut self, line: &T, skip: impl Fn(&str) -> bool) {
        // A line that is not a struct adds nothing.
        let _ = line.serialize(FieldCollector {
            arguments: self,
            skip,
        });
    }

    /// The entries of a JSON map.
    pub fn from_map(map: &Map<String, Value>) -> Arguments {
        let mut arguments = Arguments::default();
        for (key, value) in map {
            let stored = arguments.store(value);
            arguments
                .entries
                .push(Entry::new(Cow::Owned(key.clone()), stored));
        }
        arguments
    }

    /// Sets `key` to a string (replacing a field of that name).
    pub fn insert_text(&mut self, key: &'static str, value: &str) {
        let stored = self.push_text(value);
        match self.entries.iter_mut().find(|entry| entry.key == key) {
            Some(entry) => entry.value = stored,
            None => self.entries.push(Entry::new(Cow::Borrowed(key), stored)),
        }
    }

    /// Orders the entries by key, as a JSON map (byte-wise).
    pub fn sort(&mut self) {
        // The keys' addresses, if they are all static (a struct's field names).
        let mut keys = std::mem::take(&mut self.keys);
        keys.clear();
        for entry in &self.entries {
            match &entry.key {
                Cow::Borrowed(key) => keys.push((key.as_ptr() as usize, key.len())),
                Cow::Owned(_) => {
                    self.keys = keys;
                    return self.sort_now();
                }
            }
        }
        let slot = keys
            .iter()
            .fold(0u64, |hash, (address, length)| {
                (hash.rotate_left(5) ^ (*address as u64) ^ ((*length as u64) << 48))
                    .wrapping_mul(0x517c_c1b7_2722_0a95)
            })
            .wrapping_shr(58) as usize
            % KNOWN_ORDERS;
        if self.orders.is_empty() {
            self.orders.resize(KNOWN_ORDERS, None);
        }
        match &self.orders[slot] {
            Some(known) if known.keys == keys => self.order.clone_from(&known.order),
            _ => {
                self.sort_now();
                if self.order.len() == self.entries.len() {
                    self.orders[slot] = Some(KnownOrder {
                        keys: keys.clone(),
                        order: self.order.clone(),
                    });
                }
            }
        }
        self.keys = keys;
    }

    fn sort_now(&mut self) {
        // Small (prefix, index) pairs are sorted, not the entries.
        self.order.clear();
        self.order.extend(
            self.entries
                .iter()
                .enumerate()
                .map(|(index, entry)| (entry.prefix, index as u16)),
        );
        let entries = &self.entries;
        self.order.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0).then_with(|| {
                let (a, b) = (&entries[usize::from(a.1)], &entries[usize::from(b.1)]);
                a.key.as_bytes().cmp(b.key.as_bytes())
            })
        });
        if self.order.len() == self.entries.len() && self.entries.len() <= usize::from(u16::MAX) {
            return;
        }
        // Too many to index: sort the entries themselves.
        self.order.clear();
        self.entries.sort_unstable_by(|a, b| {
            a.prefix
                .cmp(&b.prefix)
                .then_with(|| a.key.as_bytes().cmp(b.key.as_bytes()))
        });
    }

    /// The keys' addresses and lengths in [`iter`](Arguments::iter)'s order, into `keys`,
    /// if all are static (a struct's field names): the same list means the same keys, so
    /// work done per key can be remembered per list.
    pub fn static_keys(&self, keys: &mut Vec<(usize, usize)>) -> bool {
        keys.clear();
        for (key, _) in self.iter_entries() {
            match key {
                Cow::Borrowed(key) => keys.push((key.as_ptr() as usize, key.len())),
                Cow::Owned(_) => return false,
            }
        }
        true
    }

    fn iter_entries(&self) -> impl Iterator<Item = (&Cow<'static, str>, &Stored)> {
        let sorted = self.order.len() == self.entries.len();
        (0..self.entries.len()).map(move |position| {
            let index = match sorted {
                true => usize::from(self.order[position].1),
                false => position,
            };
            let entry = &self.entries[index];
            (&entry.key, &entry.value)
        })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// In key order after [`sort`](Arguments::sort), else as added.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Arg<'_>)> {
        self.iter_entries().map(|(key, stored)| {
            let value = match stored {
                Stored::Unsigned(n) => Arg::Unsigned(*n),
                Stored::Signed(n) => Arg::Signed(*n),
                Stored::Float(x) => Arg::Float(*x),
                Stored::Bool(b) => Arg::Bool(*b),
                Stored::Text(range) => Arg::Text(&self.text[range.clone()]),
                Stored::Json(range) => Arg::Json(&self.text[range.clone()]),
            };
            (key.as_ref(), value)
        })
    }

    fn push_text(&mut self, text: &str) -> Stored {
        let start = self.text.len();
        self.text.push_str(text);
        Stored::Text(start..self.text.len())
    }

    fn store(&mut self, value: &Value) -> Stored {
        match value {
            Value::Bool(b) => Stored::Bool(*b),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(unsigned), _) => Stored::Unsigned(unsigned),
                (None, Some(signed)) => Stored::Signed(signed),
                _ => Stored::Float(n.as_f64().unwrap_or_default()),
            },
            Value::String(text) => self.push_text(text),
            other => {
                let start = self.text.len();
                // A `Value` always serialises.
                let _ = write!(self.text, "{other}");
                Stored::Json(start..self.text.len())
            }
        }
    }
}

/// Serialises a struct's fields into [`Arguments`].
struct FieldCollector<'a, F> {
    arguments: &'a mut Arguments,
    skip: F,
}

impl<F: Fn(&str) -> bool> FieldCollector<'_, F> {
    fn add<T: ?Sized + Serialize>(&mut self, key: Cow<'static, str>, value: &T) {
        if (self.skip)(&key) {
            return;
        }
        let start = self.arguments.text.len();
        let stored = match value.serialize(ScalarCollector {
            text: &mut self.arguments.text,
        }) {
            Ok(stored) => stored,
            // Anything else as `to_value` gives it (an object's keys sorted).
            Err(NotAScalar) => {
                self.arguments.text.truncate(start);
                match serde_json::to_value(value) {
                    Ok(value) => self.arguments.store(&value),
                    Err(_) => return,
                }
            }
        };
        self.arguments.entries.push(Entry::new(key, stored));
    }
}

impl<F: Fn(&str) -> bool> SerializeStruct for FieldCollector<'_, F> {
    type Ok = ();
    type Error = NotAScalar;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), NotAScalar> {
        self.add(Cow::Borrowed(key), value);
        Ok(())
    }

    fn end(self) -> Result<(), NotAScalar> {
        Ok(())
    }
}

/// A struct with a `#[serde(flatten)]` field (the GPU activity lines) serialises as a map.
impl<F: Fn(&str) -> bool> SerializeMap for FieldCollector<'_, F> {
    type Ok = ();
    type Error = NotAScalar;

    fn serialize_key<T: ?Sized + Serialize>(&mut self, _: &T) -> Result<(), NotAScalar> {
        // Entries come whole (serialize_entry): a lone key is not expected.
        Err(NotAScalar)
    }

    fn serialize_value<T: ?Sized + Serialize>(&mut self, _: &T) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }

    fn serialize_entry<K: ?Sized + Serialize, V: ?Sized + Serialize>(
        &mut self,
        key: &K,
        value: &V,
    ) -> Result<(), NotAScalar> {
        let mut name = String::new();
        let Ok(Stored::Text(_)) = key.serialize(ScalarCollector { text: &mut name }) else {
            return Err(NotAScalar);
        };
        self.add(interned(&name), value);
        Ok(())
    }

    fn end(self) -> Result<(), NotAScalar> {
        Ok(())
    }
}

/// Map keys most interned (each kept for the life of the process).
const MAX_INTERNED_KEYS: usize = 1024;

/// A map key as a `'static` string, so that remembered sort orders and annotation names
/// work for maps as for structs: a map line's keys are its field names, a few dozen.
fn interned(key: &str) -> Cow<'static, str> {
    use std::{cell::RefCell, collections::HashSet};
    thread_local! {
        static KEYS: RefCell<HashSet<&'static str>> = RefCell::new(HashSet::new());
    }
    KEYS.with_borrow_mut(|keys| {
        if let Some(known) = keys.get(key) {
            return Cow::Borrowed(*known);
        }
        if keys.len() >= MAX_INTERNED_KEYS {
            return Cow::Owned(key.to_owned());
        }
        let leaked: &'static str = Box::leak(key.into());
        keys.insert(leaked);
        Cow::Borrowed(leaked)
    })
}

/// A value that is not a scalar (or a line that is not a struct).
#[derive(Debug)]
struct NotAScalar;

impl std::fmt::Display for NotAScalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not a scalar")
    }
}

impl std::error::Error for NotAScalar {}

impl ser::Error for NotAScalar {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        NotAScalar
    }
}

/// Scalars the way `serde_json::to_value` numbers them: non-negative integers unsigned.
struct ScalarCollector<'a> {
    text: &'a mut String,
}

impl ScalarCollector<'_> {
    fn text(self, text: &str) -> Result<Stored, NotAScalar> {
        let start = self.text.len();
        self.text.push_str(text);
        Ok(Stored::Text(start..self.text.len()))
    }
}

impl<'a> Serializer for ScalarCollector<'a> {
    type Ok = Stored;
    type Error = NotAScalar;
    type SerializeSeq = ArrayWriter<'a>;
    type SerializeTuple = ArrayWriter<'a>;
    type SerializeTupleStruct = Impossible<Stored, NotAScalar>;
    type SerializeTupleVariant = Impossible<Stored, NotAScalar>;
    type SerializeMap = Impossible<Stored, NotAScalar>;
    type SerializeStruct = Impossible<Stored, NotAScalar>;
    type SerializeStructVariant = Impossible<Stored, NotAScalar>;

    fn serialize_bool(self, v: bool) -> Result<Stored, NotAScalar> {
        Ok(Stored::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Stored, NotAScalar> {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Result<Stored, NotAScalar> {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Result<Stored, NotAScalar> {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Result<Stored, NotAScalar> {
        Ok(match u64::try_from(v) {
            Ok(unsigned) => Stored::Unsigned(unsigned),
            Err(_) => Stored::Signed(v),
        })
    }
    fn serialize_u8(self, v: u8) -> Result<Stored, NotAScalar> {
        Ok(Stored::Unsigned(v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<Stored, NotAScalar> {
        Ok(Stored::Unsigned(v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<Stored, NotAScalar> {
        Ok(Stored::Unsigned(v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<Stored, NotAScalar> {
        Ok(Stored::Unsigned(v))
    }
    /// Not finite: `null`, as serde_json has it; the caller asks serde_json.
    fn serialize_f32(self, v: f32) -> Result<Stored, NotAScalar> {
        self.serialize_f64(v.into())
    }
    fn serialize_f64(self, v: f64) -> Result<Stored, NotAScalar> {
        if v.is_finite() {
            Ok(Stored::Float(v))
        } else {
            Err(NotAScalar)
        }
    }
    fn serialize_char(self, v: char) -> Result<Stored, NotAScalar> {
        self.text(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<Stored, NotAScalar> {
        self.text(v)
    }
    /// Pointers (`Hex`) are written this way: formatted straight into the buffer.
    fn collect_str<T: ?Sized + std::fmt::Display>(self, value: &T) -> Result<Stored, NotAScalar> {
        let start = self.text.len();
        write!(self.text, "{value}").map_err(|_| NotAScalar)?;
        Ok(Stored::Text(start..self.text.len()))
    }
    fn serialize_some<T: ?Sized + Serialize>(self, value: &T) -> Result<Stored, NotAScalar> {
        value.serialize(self)
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Stored, NotAScalar> {
        value.serialize(self)
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<Stored, NotAScalar> {
        self.text(variant)
    }

    // The rest through serde_json (`null`, bytes, arrays, objects, enums with data).
    fn serialize_bytes(self, _: &[u8]) -> Result<Stored, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_none(self) -> Result<Stored, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_unit(self) -> Result<Stored, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Stored, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Stored, NotAScalar> {
        Err(NotAScalar)
    }
    /// An array (`grid`, `block`, `warnings`) of scalars: written as JSON here.
    fn serialize_seq(self, _: Option<usize>) -> Result<ArrayWriter<'a>, NotAScalar> {
        let start = self.text.len();
        self.text.push('[');
        Ok(ArrayWriter {
            text: self.text,
            start,
        })
    }
    fn serialize_tuple(self, length: usize) -> Result<ArrayWriter<'a>, NotAScalar> {
        self.serialize_seq(Some(length))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotAScalar> {
        Err(NotAScalar)
    }
}

/// An array being written as JSON: its scalar elements as serde_json writes them (anything
/// else is left to `to_value`).
struct ArrayWriter<'a> {
    text: &'a mut String,
    start: usize,
}

impl ArrayWriter<'_> {
    fn element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), NotAScalar> {
        if self.text.len() > self.start + 1 {
            self.text.push(',');
        }
        let at = self.text.len();
        let stored = value.serialize(ScalarCollector {
            text: &mut *self.text,
        })?;
        match stored {
            Stored::Unsigned(n) => {
                self.text.push_str(itoa::Buffer::new().format(n));
            }
            Stored::Signed(n) => {
                self.text.push_str(itoa::Buffer::new().format(n));
            }
            Stored::Bool(b) => self.text.push_str(if b { "true" } else { "false" }),
            Stored::Float(x) => {
                let json = serde_json::to_string(&x).map_err(|_| NotAScalar)?;
                self.text.push_str(&json);
            }
            // The string was pushed at `at`: quoted and escaped in place.
            Stored::Text(range) => {
                let raw = self.text.split_off(range.start);
                match serde_json::to_string(&raw) {
                    Ok(json) => self.text.push_str(&json),
                    Err(_) => return Err(NotAScalar),
                }
            }
            Stored::Json(_) => return Err(NotAScalar),
        }
        debug_assert!(self.text.len() > at);
        Ok(())
    }

    fn finish(self) -> Result<Stored, NotAScalar> {
        self.text.push(']');
        Ok(Stored::Json(self.start..self.text.len()))
    }
}

impl ser::SerializeSeq for ArrayWriter<'_> {
    type Ok = Stored;
    type Error = NotAScalar;

    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), NotAScalar> {
        self.element(value)
    }

    fn end(self) -> Result<Stored, NotAScalar> {
        self.finish()
    }
}

impl ser::SerializeTuple for ArrayWriter<'_> {
    type Ok = Stored;
    type Error = NotAScalar;

    fn serialize_element<T: ?Sized + Serialize>(&mut self, value: &T) -> Result<(), NotAScalar> {
        self.element(value)
    }

    fn end(self) -> Result<Stored, NotAScalar> {
        self.finish()
    }
}

/// The line itself: only a struct is taken apart.
impl<'a, F: Fn(&str) -> bool> Serializer for FieldCollector<'a, F> {
    type Ok = ();
    type Error = NotAScalar;
    type SerializeSeq = Impossible<(), NotAScalar>;
    type SerializeTuple = Impossible<(), NotAScalar>;
    type SerializeTupleStruct = Impossible<(), NotAScalar>;
    type SerializeTupleVariant = Impossible<(), NotAScalar>;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<(), NotAScalar>;

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, NotAScalar> {
        Ok(self)
    }

    fn serialize_bool(self, _: bool) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_i8(self, _: i8) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_i16(self, _: i16) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_i32(self, _: i32) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_i64(self, _: i64) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_u8(self, _: u8) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_u16(self, _: u16) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_u32(self, _: u32) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_u64(self, _: u64) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_f32(self, _: f32) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_f64(self, _: f64) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_char(self, _: char) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_str(self, _: &str) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_none(self) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_unit(self) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, NotAScalar> {
        Err(NotAScalar)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, NotAScalar> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, NotAScalar> {
        Err(NotAScalar)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{CallLine, Hex};

    /// What the export wrote before: `to_value`, keys removed, a JSON map.
    fn as_map(call: &CallLine, skip: &[&str]) -> Map<String, Value> {
        let Value::Object(mut map) = serde_json::to_value(call).unwrap() else {
            panic!("not an object")
        };
        for key in skip {
            map.remove(*key);
        }
        map
    }

    fn as_value(arg: Arg<'_>) -> Value {
        match arg {
            Arg::Unsigned(n) => n.into(),
            Arg::Signed(n) => n.into(),
            Arg::Float(x) => x.into(),
            Arg::Bool(b) => b.into(),
            Arg::Text(text) => text.into(),
            Arg::Hex(value) => format!("{value:#x}").into(),
            Arg::Json(json) => serde_json::from_str(json).unwrap(),
        }
    }

    #[test]
    fn a_call_gives_what_to_value_gives_in_key_order() {
        let call = CallLine {
            name: "cuLaunchKernel".into(),
            pid: 1,
            tid: 2,
            ts_ns: 3,
            dur_ns: Some(4),
            ret: Some(0),
            grid: Some([1, 2, 3]),
            stream: Some(Hex(0x10)),
            device: Some(0),
            version: Some(-7),
            kernel: Some("k\"é".into()),
            warnings: vec!["entry_read_failed".into()],
            ..CallLine::default()
        };
        let skip = ["type", "name", "pid", "tid", "dur_ns"];
        let mut arguments = Arguments::default();
        arguments.fill(&call, |key| skip.contains(&key));
        arguments.insert_text("call", "cuLaunchKernel");
        arguments.sort();
        let mut expected = as_map(&call, &skip);
        expected.insert("call".into(), "cuLaunchKernel".into());
        let got: Vec<(String, Value)> = arguments
            .iter()
            .map(|(k, v)| (k.to_owned(), as_value(v)))
            .collect();
        let want: Vec<(String, Value)> = expected.into_iter().collect();
        assert_eq!(got, want);
        // As `to_value` numbers them: a non-negative i32 is unsigned.
        let device = arguments.iter().find(|(k, _)| *k == "device").unwrap().1;
        assert_eq!(device, Arg::Unsigned(0));
        let version = arguments.iter().find(|(k, _)| *k == "version").unwrap().1;
        assert_eq!(version, Arg::Signed(-7));
        let grid = arguments.iter().find(|(k, _)| *k == "grid").unwrap().1;
        assert_eq!(grid, Arg::Json("[1,2,3]"));
        let warnings = arguments.iter().find(|(k, _)| *k == "warnings").unwrap().1;
        assert_eq!(warnings, Arg::Json(r#"["entry_read_failed"]"#));

        // Reused: cleared, then filled again.
        arguments.clear();
        assert_eq!(arguments.iter().count(), 0);
        arguments.fill(&call, |_| false);
        assert_eq!(
            arguments.iter().next().unwrap(),
            ("type", Arg::Text("call"))
        );
    }

    /// Values of every shape, as `to_value` and a JSON map would have them.
    #[test]
    fn any_line_gives_what_to_value_gives() {
        #[derive(Serialize)]
        struct Line {
            zebra: Vec<Vec<u32>>,
            apple: (i8, f32, Option<bool>, String, char),
            nested: std::collections::HashMap<String, Vec<String>>,
            mixed: Vec<Option<f64>>,
            escaped: Vec<&'static str>,
            unit: (),
            nothing: Option<u8>,
            not_finite: f64,
            a: u8,
            aa: u8,
            ab_longer_than_eight: u8,
            ab_longer_than_eigh: u8,
        }
        let line = Line {
            zebra: vec![vec![1], vec![]],
            apple: (-1, 0.1, None, "é\"".into(), 'x'),
            nested: [("k".to_owned(), vec!["v".to_owned()]), ("a".into(), vec![])]
                .into_iter()
                .collect(),
            mixed: vec![Some(1.5), None, Some(-0.0)],
            escaped: vec!["a\nb", "\\", "plain"],
            unit: (),
            nothing: None,
            not_finite: f64::NAN,
            a: 1,
            aa: 2,
            ab_longer_than_eight: 3,
            ab_longer_than_eigh: 4,
        };
        let mut arguments = Arguments::default();
        arguments.fill(&line, |key| key == "a");
        arguments.sort();
        let Value::Object(mut expected) = serde_json::to_value(&line).unwrap() else {
            panic!()
        };
        expected.remove("a");
        let got: Vec<(String, Value)> = arguments
            .iter()
            .map(|(k, v)| (k.to_owned(), as_value(v)))
            .collect();
        let want: Vec<(String, Value)> = expected.clone().into_iter().collect();
        assert_eq!(got, want);
        // And the JSON texts are the map's own.
        for (key, arg) in arguments.iter() {
            if let Arg::Json(json) = arg {
                assert_eq!(json, expected[key].to_string(), "{key}");
            }
        }
    }

    /// A struct with a flattened part serialises as a map: its entries, as `to_value` has
    /// them, and a second line of the same shape the same way.
    #[test]
    fn a_flattened_struct_gives_what_to_value_gives() {
        #[derive(Serialize)]
        struct Link {
            zeta: u32,
            #[serde(skip_serializing_if = "Option::is_none")]
            beta: Option<i64>,
        }
        #[derive(Serialize)]
        struct Line {
            kernel: String,
            pid: u32,
            #[serde(flatten)]
            link: Link,
        }
        for beta in [Some(-200), None, Some(5)] {
            let line = Line {
                kernel: "k".into(),
                pid: 7,
                link: Link { zeta: 3, beta },
            };
            let mut arguments = Arguments::default();
            arguments.fill(&line, |key| key == "pid");
            arguments.sort();
            let Value::Object(mut expected) = serde_json::to_value(&line).unwrap() else {
                panic!()
            };
            expected.remove("pid");
            let got: Vec<(String, Value)> = arguments
                .iter()
                .map(|(k, v)| (k.to_owned(), as_value(v)))
                .collect();
            let want: Vec<(String, Value)> = expected.into_iter().collect();
            assert_eq!(got, want);
            assert_eq!(got.len(), 2 + usize::from(beta.is_some()));
        }
    }

    #[test]
    fn a_map_gives_its_entries() {
        let map: Map<String, Value> = serde_json::from_str(
            r#"{"a":1,"b":-2,"c":1.5,"d":true,"e":"x","f":[1,"y"],"g":{"z":null},"h":null}"#,
        )
        .unwrap();
        let arguments = Arguments::from_map(&map);
        let got: Vec<(&str, Arg<'_>)> = arguments.iter().collect();
        assert_eq!(
            got,
            [
                ("a", Arg::Unsigned(1)),
                ("b", Arg::Signed(-2)),
                ("c", Arg::Float(1.5)),
                ("d", Arg::Bool(true)),
                ("e", Arg::Text("x")),
                ("f", Arg::Json(r#"[1,"y"]"#)),
                ("g", Arg::Json(r#"{"z":null}"#)),
                ("h", Arg::Json("null")),
            ]
        );
    }
}
