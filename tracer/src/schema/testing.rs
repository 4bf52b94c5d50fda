//! Test helpers: a struct's fields as serde knows them, a call with every field set, and
//! every key a line can write.

use std::collections::BTreeSet;

use serde::{
    Deserialize, Deserializer, Serialize, Serializer,
    de::{self, Visitor},
    ser,
};
use serde_json::{Value, json};

use super::CallLine;

/// The names of a struct's fields as its derived `Deserialize` knows them.
pub fn field_names<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    struct Fields(Option<&'static [&'static str]>);
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("stop")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Stop
        }
    }
    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = Some(fields);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields = Fields(None);
    let _ = T::deserialize(&mut fields);
    fields.0.expect("a struct")
}

/// A call with every field set, each to the first of `candidates` its type takes.
pub fn every_field(candidates: &[Value]) -> CallLine {
    let Value::Object(mut object) =
        json!({"type": "call", "name": "cuLaunchKernel", "pid": 1, "tid": 2, "ts_ns": 3})
    else {
        unreachable!()
    };
    for field in field_names::<CallLine>() {
        if object.contains_key(*field) {
            continue;
        }
        let accepted = candidates.iter().find(|candidate| {
            let mut trial = object.clone();
            trial.insert((*field).into(), (*candidate).clone());
            serde_json::from_value::<CallLine>(Value::Object(trial)).is_ok()
        });
        if let Some(value) = accepted {
            object.insert((*field).into(), value.clone());
        }
    }
    serde_json::from_value(Value::Object(object)).unwrap()
}

/// Every key `line` can write, as paths (`lost.total`; an array's objects' keys under the
/// array's name: `frames.file`): those it writes, and those it leaves out
/// (`skip_serializing_if`), which serde names all the same. What is inside a field left
/// out is not seen, nor a map's keys, which are data (a line written as a map, because a
/// part of it is flattened, has its keys seen, but not those it leaves out).
pub fn written_keys<T: Serialize>(line: &T) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    line.serialize(Keys {
        path: String::new(),
        keys: &mut keys,
    })
    .expect("a line serialises");
    keys
}

/// A value at `path` (empty: the line), adding the keys inside it to `keys`.
struct Keys<'a> {
    path: String,
    keys: &'a mut BTreeSet<String>,
}

impl<'a> Keys<'a> {
    fn at(&mut self, key: &str) -> Keys<'_> {
        let path = match self.path.is_empty() {
            true => key.to_owned(),
            false => format!("{}.{key}", self.path),
        };
        self.keys.insert(path.clone());
        Keys {
            path,
            keys: &mut *self.keys,
        }
    }

    fn inside(self) -> Inside<'a> {
        Inside {
            keys: self,
            map_key: None,
        }
    }
}

/// The fields or elements of a value at a path.
struct Inside<'a> {
    keys: Keys<'a>,
    /// The map key whose value comes next.
    map_key: Option<String>,
}

impl Inside<'_> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), serde_json::Error> {
        value.serialize(Keys {
            path: self.keys.path.clone(),
            keys: &mut *self.keys.keys,
        })
    }

    fn field<T: Serialize + ?Sized>(
        &mut self,
        key: &str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        value.serialize(self.keys.at(key))
    }
}

macro_rules! leaves {
    ($($method:ident($type:ty),)*) => {
        $(fn $method(self, _: $type) -> Result<(), serde_json::Error> {
            Ok(())
        })*
    };
}

impl<'a> Serializer for Keys<'a> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = Inside<'a>;
    type SerializeTuple = Inside<'a>;
    type SerializeTupleStruct = Inside<'a>;
    type SerializeTupleVariant = Inside<'a>;
    type SerializeMap = Inside<'a>;
    type SerializeStruct = Inside<'a>;
    type SerializeStructVariant = Inside<'a>;

    leaves! {
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_f32(f32),
        serialize_f64(f64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_unit_struct(&'static str),
    }

    fn serialize_none(self) -> Result<(), serde_json::Error> {
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), serde_json::Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), serde_json::Error> {
        Ok(())
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> Result<(), serde_json::Error> {
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        value.serialize(self)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Inside<'a>, serde_json::Error> {
        Ok(self.inside())
    }

    fn serialize_tuple(self, _: usize) -> Result<Inside<'a>, serde_json::Error> {
        Ok(self.inside())
    }

    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Inside<'a>, serde_json::Error> {
        Ok(self.inside())
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Inside<'a>, serde_json::Error> {
        Ok(self.inside())
    }

    fn serialize_map(self, _: Option<usize>) -> Result<Inside<'a>, serde_json::Error> {
        Ok(self.inside())
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Inside<'a>, serde_json::Error> {
        Ok(self.inside())
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Inside<'a>, serde_json::Error> {
        Ok(self.inside())
    }
}

impl ser::SerializeSeq for Inside<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Self::Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl ser::SerializeTuple for Inside<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Self::Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl ser::SerializeTupleStruct for Inside<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Self::Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl ser::SerializeTupleVariant for Inside<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Self::Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// A map's keys are data, except the line's own (a line with a flattened part).
impl ser::SerializeMap for Inside<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Self::Error> {
        let key = serde_json::to_value(key)?;
        self.map_key = key.as_str().map(str::to_owned);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Self::Error> {
        match self.map_key.take() {
            Some(key) if self.keys.path.is_empty() => self.field(&key, value),
            _ => Ok(()),
        }
    }
    fn end(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl ser::SerializeStruct for Inside<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Self::Error> {
        self.field(key, value)
    }
    fn skip_field(&mut self, key: &'static str) -> Result<(), Self::Error> {
        self.keys.at(key);
        Ok(())
    }
    fn end(self) -> Result<(), Self::Error> {
        Ok(())
    }
}

impl ser::SerializeStructVariant for Inside<'_> {
    type Ok = ();
    type Error = serde_json::Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Self::Error> {
        self.field(key, value)
    }
    fn skip_field(&mut self, key: &'static str) -> Result<(), Self::Error> {
        self.keys.at(key);
        Ok(())
    }
    fn end(self) -> Result<(), Self::Error> {
        Ok(())
    }
}
