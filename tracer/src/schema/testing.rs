//! Test helpers for [`CallLine`]: its fields as serde knows them, and a call with every
//! field set.

use serde::{
    Deserialize, Deserializer,
    de::{self, Visitor},
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
