//! A slice's or marker's arguments: `args` in the JSON, debug annotations in the protobuf.
//!
//! They are what `serde_json::to_value` would make of a line, keys sorted as a JSON map
//! sorts them, but collected into one reused buffer instead of a map of allocated strings
//! and values: GPU work can be as many as launches. Any `Serialize` line (a GPU activity
//! record, an NCCL call's rank-track slice) gives its fields with [`Arguments::fill`]; a
//! map from elsewhere with [`Arguments::from_map`]. A call's own slice reads its fields
//! straight from the line instead (`call_args`).

use std::{borrow::Cow, fmt::Write as _, ops::Range};

use serde::Serialize;
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

mod collect;
#[cfg(test)]
mod tests;

use collect::FieldCollector;
