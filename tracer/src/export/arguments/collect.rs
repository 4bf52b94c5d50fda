//! Collecting a `Serialize` line's fields into [`Arguments`]: a serde `Serializer` that
//! takes a struct apart, scalars stored as `serde_json::to_value` numbers them and arrays
//! written as JSON.

use std::{borrow::Cow, fmt::Write as _};

use serde::{
    Serialize, Serializer,
    ser::{self, Impossible, SerializeMap, SerializeStruct},
};

use super::{Arguments, Entry, Stored};

/// Serialises a struct's fields into [`Arguments`].
pub(super) struct FieldCollector<'a, F> {
    pub(super) arguments: &'a mut Arguments,
    pub(super) skip: F,
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
pub(super) struct NotAScalar;

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
