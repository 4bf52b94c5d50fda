//! Column kinds: how a value of a row becomes Arrow columns, and the type each column has.
//!
//! Integers are signed (Spark has no unsigned types, and DuckDB's unsigned subtraction
//! fails where the result is negative): `int32` where every value fits (pids, tids,
//! devices, ranks, grid and block sizes), else `int64`. Times and durations are `int64`
//! nanoseconds; pointers and handles are `int64` holding their 64 bits (user-space
//! addresses and CUDA handles are below 2^63, so they read as the same positive number).
//! Repeated strings (names, kinds, the trace's id) are dictionary-encoded in Arrow as in
//! the Parquet file; strings that are mostly distinct (paths, messages) are plain.

use std::{
    borrow::Cow,
    marker::PhantomData,
    sync::{Arc, OnceLock},
};

use arrow_array::{
    ArrayRef, BooleanArray, DictionaryArray, Int32Array, Int64Array, ListArray, StringArray,
    builder::{BooleanBuilder, Int32Builder, Int64Builder, ListBuilder, StringBuilder},
    new_empty_array,
    types::Int32Type,
};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field};
use foldhash::HashMap;

use crate::schema::Hex;

/// A kind of value and the columns it makes (one, or three for `[x,y,z]`).
pub trait Kind {
    type Builder: Default;
    type Value<'a>;
    /// The columns a value named `name` makes, in order.
    fn fields(name: &str, out: &mut Vec<Field>);
    fn append(builder: &mut Self::Builder, value: Self::Value<'_>);
    /// The columns built so far; the builder starts again empty.
    fn finish(builder: &mut Self::Builder, out: &mut Vec<ArrayRef>);
}

/// A kind that makes one column, which may be null.
pub trait Scalar {
    type Builder: Default;
    type Value<'a>;
    fn data_type() -> DataType;
    fn append(builder: &mut Self::Builder, value: Self::Value<'_>);
    fn append_nulls(builder: &mut Self::Builder, count: usize);
    fn finish(builder: &mut Self::Builder) -> ArrayRef;
    /// `len` nulls, on [`zeros`] (a batch of a field no row has: most of a call's).
    fn nulls(len: usize) -> ArrayRef;
}

/// Rows in a batch, at most (`table.rs` hands batches of this many to the writer).
pub const BATCH_ROWS: usize = 4096;

/// Zeros for a batch's all-null columns, shared by all of them: a null column costs no
/// allocation and no zeroing, batch after batch.
fn zeros() -> Buffer {
    static ZEROS: OnceLock<Buffer> = OnceLock::new();
    ZEROS
        .get_or_init(|| Buffer::from(vec![0u8; (BATCH_ROWS + 1) * 8]))
        .clone()
}

/// `len` nulls' validity.
fn no_values(len: usize) -> NullBuffer {
    NullBuffer::new(BooleanBuffer::new(zeros(), 0, len))
}

/// `len + 1` zero offsets: `len` empty strings or lists.
fn zero_offsets(len: usize) -> OffsetBuffer<i32> {
    OffsetBuffer::new(ScalarBuffer::new(zeros(), 0, len + 1))
}

/// Never null.
impl<S: Scalar> Kind for S {
    type Builder = S::Builder;
    type Value<'a> = S::Value<'a>;

    fn fields(name: &str, out: &mut Vec<Field>) {
        out.push(Field::new(name, S::data_type(), false));
    }

    fn append(builder: &mut Self::Builder, value: Self::Value<'_>) {
        S::append(builder, value);
    }

    fn finish(builder: &mut Self::Builder, out: &mut Vec<ArrayRef>) {
        out.push(S::finish(builder));
    }
}

/// Null where the value is `None`. Most of a call's fields are absent: nulls are
/// counted and added together when a value comes (or the batch ends), not one by one.
pub struct Opt<S>(PhantomData<S>);

#[derive(Default)]
pub struct OptBuilder<B> {
    builder: B,
    /// Nulls not added yet, after what the builder holds.
    nulls: usize,
    /// Values in this batch.
    values: usize,
}

impl<S: Scalar> Kind for Opt<S> {
    type Builder = OptBuilder<S::Builder>;
    type Value<'a> = Option<S::Value<'a>>;

    fn fields(name: &str, out: &mut Vec<Field>) {
        out.push(Field::new(name, S::data_type(), true));
    }

    fn append(builder: &mut Self::Builder, value: Self::Value<'_>) {
        match value {
            Some(value) => {
                if builder.nulls > 0 {
                    S::append_nulls(&mut builder.builder, builder.nulls);
                    builder.nulls = 0;
                }
                S::append(&mut builder.builder, value);
                builder.values += 1;
            }
            None => builder.nulls += 1,
        }
    }

    fn finish(builder: &mut Self::Builder, out: &mut Vec<ArrayRef>) {
        if builder.values == 0 {
            out.push(S::nulls(builder.nulls));
            builder.nulls = 0;
            return;
        }
        if builder.nulls > 0 {
            S::append_nulls(&mut builder.builder, builder.nulls);
            builder.nulls = 0;
        }
        builder.values = 0;
        out.push(S::finish(&mut builder.builder));
    }
}

pub struct I32;

impl Scalar for I32 {
    type Builder = Int32Builder;
    type Value<'a> = i32;

    fn data_type() -> DataType {
        DataType::Int32
    }

    fn append(builder: &mut Int32Builder, value: i32) {
        builder.append_value(value);
    }

    fn append_nulls(builder: &mut Int32Builder, count: usize) {
        builder.append_nulls(count);
    }

    fn finish(builder: &mut Int32Builder) -> ArrayRef {
        let array = builder.finish();
        // The next batch is as dense: no growing from empty.
        *builder = Int32Builder::with_capacity(BATCH_ROWS);
        Arc::new(array)
    }

    fn nulls(len: usize) -> ArrayRef {
        Arc::new(Int32Array::new(
            ScalarBuffer::new(zeros(), 0, len),
            Some(no_values(len)),
        ))
    }
}

pub struct I64;

impl Scalar for I64 {
    type Builder = Int64Builder;
    type Value<'a> = i64;

    fn data_type() -> DataType {
        DataType::Int64
    }

    fn append(builder: &mut Int64Builder, value: i64) {
        builder.append_value(value);
    }

    fn append_nulls(builder: &mut Int64Builder, count: usize) {
        builder.append_nulls(count);
    }

    fn finish(builder: &mut Int64Builder) -> ArrayRef {
        let array = builder.finish();
        *builder = Int64Builder::with_capacity(BATCH_ROWS);
        Arc::new(array)
    }

    fn nulls(len: usize) -> ArrayRef {
        Arc::new(Int64Array::new(
            ScalarBuffer::new(zeros(), 0, len),
            Some(no_values(len)),
        ))
    }
}

pub struct Bool;

impl Scalar for Bool {
    type Builder = BooleanBuilder;
    type Value<'a> = bool;

    fn data_type() -> DataType {
        DataType::Boolean
    }

    fn append(builder: &mut BooleanBuilder, value: bool) {
        builder.append_value(value);
    }

    fn append_nulls(builder: &mut BooleanBuilder, count: usize) {
        builder.append_nulls(count);
    }

    fn finish(builder: &mut BooleanBuilder) -> ArrayRef {
        Arc::new(builder.finish())
    }

    fn nulls(len: usize) -> ArrayRef {
        Arc::new(BooleanArray::new(
            BooleanBuffer::new(zeros(), 0, len),
            Some(no_values(len)),
        ))
    }
}

/// A repeated string: dictionary-encoded.
pub struct Str;

/// A dictionary of strings built by hand: a value equal to the last one (the trace's id
/// on every row, a function called again) takes its key without being hashed.
#[derive(Default)]
pub struct DictionaryBuilder {
    keys: Int32Builder,
    values: StringBuilder,
    known: HashMap<Box<str>, i32>,
    /// The key of the last value appended.
    last: Option<i32>,
}

impl DictionaryBuilder {
    /// The value of `key`, from the values built so far.
    fn value(&self, key: i32) -> &[u8] {
        let offsets = self.values.offsets_slice();
        let key = key as usize;
        &self.values.values_slice()[offsets[key] as usize..offsets[key + 1] as usize]
    }
}

impl Scalar for Str {
    type Builder = DictionaryBuilder;
    type Value<'a> = &'a str;

    fn data_type() -> DataType {
        DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
    }

    fn append(builder: &mut DictionaryBuilder, value: &str) {
        if let Some(key) = builder.last
            && builder.value(key) == value.as_bytes()
        {
            builder.keys.append_value(key);
            return;
        }
        let key = match builder.known.get(value) {
            Some(key) => *key,
            None => {
                // A batch holds at most a few thousand rows: far fewer keys than 2^31.
                let key = builder.known.len() as i32;
                builder.values.append_value(value);
                builder.known.insert(value.into(), key);
                key
            }
        };
        builder.keys.append_value(key);
        builder.last = Some(key);
    }

    fn append_nulls(builder: &mut DictionaryBuilder, count: usize) {
        builder.keys.append_nulls(count);
    }

    fn finish(builder: &mut DictionaryBuilder) -> ArrayRef {
        let keys = builder.keys.finish();
        let values = Arc::new(builder.values.finish());
        builder.known.clear();
        builder.last = None;
        builder.keys = Int32Builder::with_capacity(BATCH_ROWS);
        Arc::new(
            DictionaryArray::<Int32Type>::try_new(keys, values).expect("keys index the values"),
        )
    }

    fn nulls(len: usize) -> ArrayRef {
        let keys = Int32Array::new(ScalarBuffer::new(zeros(), 0, len), Some(no_values(len)));
        let values = new_empty_array(&DataType::Utf8);
        Arc::new(DictionaryArray::<Int32Type>::try_new(keys, values).expect("no key is valid"))
    }
}

/// A string mostly different from row to row: plain.
pub struct Text;

impl Scalar for Text {
    type Builder = StringBuilder;
    type Value<'a> = &'a str;

    fn data_type() -> DataType {
        DataType::Utf8
    }

    fn append(builder: &mut StringBuilder, value: &str) {
        builder.append_value(value);
    }

    fn append_nulls(builder: &mut StringBuilder, count: usize) {
        builder.append_nulls(count);
    }

    fn finish(builder: &mut StringBuilder) -> ArrayRef {
        Arc::new(builder.finish())
    }

    fn nulls(len: usize) -> ArrayRef {
        Arc::new(StringArray::new(
            zero_offsets(len),
            Buffer::from(Vec::<u8>::new()),
            Some(no_values(len)),
        ))
    }
}

/// Pointers or handles: a list of `int64`.
pub struct Pointers;

impl Scalar for Pointers {
    type Builder = ListBuilder<Int64Builder>;
    type Value<'a> = &'a [Hex];

    fn data_type() -> DataType {
        DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true)))
    }

    fn append(builder: &mut Self::Builder, value: &[Hex]) {
        for pointer in value {
            builder.values().append_value(pointer.0 as i64);
        }
        builder.append(true);
    }

    fn append_nulls(builder: &mut Self::Builder, count: usize) {
        builder.append_nulls(count);
    }

    fn finish(builder: &mut Self::Builder) -> ArrayRef {
        Arc::new(builder.finish())
    }

    fn nulls(len: usize) -> ArrayRef {
        Arc::new(ListArray::new(
            Arc::new(Field::new_list_field(DataType::Int64, true)),
            zero_offsets(len),
            new_empty_array(&DataType::Int64),
            Some(no_values(len)),
        ))
    }
}

/// Small numbers: a list of `int32`.
pub struct Numbers;

impl Scalar for Numbers {
    type Builder = ListBuilder<Int32Builder>;
    type Value<'a> = &'a [u32];

    fn data_type() -> DataType {
        DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true)))
    }

    fn append(builder: &mut Self::Builder, value: &[u32]) {
        for number in value {
            builder.values().append_value(*number as i32);
        }
        builder.append(true);
    }

    fn append_nulls(builder: &mut Self::Builder, count: usize) {
        builder.append_nulls(count);
    }

    fn finish(builder: &mut Self::Builder) -> ArrayRef {
        Arc::new(builder.finish())
    }

    fn nulls(len: usize) -> ArrayRef {
        Arc::new(ListArray::new(
            Arc::new(Field::new_list_field(DataType::Int32, true)),
            zero_offsets(len),
            new_empty_array(&DataType::Int32),
            Some(no_values(len)),
        ))
    }
}

/// Words (warnings, errors): a list of strings.
pub struct Words;

impl Scalar for Words {
    type Builder = ListBuilder<StringBuilder>;
    type Value<'a> = &'a [Cow<'static, str>];

    fn data_type() -> DataType {
        DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true)))
    }

    fn append(builder: &mut Self::Builder, value: &[Cow<'static, str>]) {
        for word in value {
            builder.values().append_value(word);
        }
        builder.append(true);
    }

    fn append_nulls(builder: &mut Self::Builder, count: usize) {
        builder.append_nulls(count);
    }

    fn finish(builder: &mut Self::Builder) -> ArrayRef {
        Arc::new(builder.finish())
    }

    fn nulls(len: usize) -> ArrayRef {
        Arc::new(ListArray::new(
            Arc::new(Field::new_list_field(DataType::Utf8, true)),
            zero_offsets(len),
            new_empty_array(&DataType::Utf8),
            Some(no_values(len)),
        ))
    }
}

/// `[x,y,z]` (a grid or block): three `int32` columns, `NAME_x`, `NAME_y`, `NAME_z`,
/// null together.
pub struct Dim3;

#[derive(Default)]
pub struct Dim3Builder([OptBuilder<Int32Builder>; 3]);

impl Kind for Dim3 {
    type Builder = Dim3Builder;
    type Value<'a> = Option<[u32; 3]>;

    fn fields(name: &str, out: &mut Vec<Field>) {
        for axis in ["x", "y", "z"] {
            out.push(Field::new(format!("{name}_{axis}"), DataType::Int32, true));
        }
    }

    fn append(builder: &mut Dim3Builder, value: Option<[u32; 3]>) {
        for (axis, column) in builder.0.iter_mut().enumerate() {
            // Launch dimensions are below 2^31 (CUDA's limits).
            <Opt<I32> as Kind>::append(column, value.map(|dims| dims[axis] as i32));
        }
    }

    fn finish(builder: &mut Dim3Builder, out: &mut Vec<ArrayRef>) {
        for column in &mut builder.0 {
            <Opt<I32> as Kind>::finish(column, out);
        }
    }
}

/// A pointer or handle as its 64 bits.
pub fn pointer(hex: Hex) -> i64 {
    hex.0 as i64
}

/// A count, size or time of the trace (below 2^63) as `int64`.
pub fn int(value: u64) -> i64 {
    value as i64
}

/// How docs/trace-format.md writes a column's type.
#[cfg(test)]
pub fn doc_type(field: &Field) -> String {
    let base = match field.data_type() {
        DataType::Int32 => "int32".to_owned(),
        DataType::Int64 => "int64".to_owned(),
        DataType::Boolean => "bool".to_owned(),
        DataType::Utf8 => "string".to_owned(),
        DataType::Dictionary(_, _) => "string (dictionary)".to_owned(),
        DataType::List(item) => match item.data_type() {
            DataType::Int32 => "list of int32".to_owned(),
            DataType::Int64 => "list of int64".to_owned(),
            DataType::Utf8 => "list of string".to_owned(),
            other => panic!("no documented type for a list of {other}"),
        },
        other => panic!("no documented type for {other}"),
    };
    match field.is_nullable() {
        true => format!("{base} or null"),
        false => base,
    }
}
