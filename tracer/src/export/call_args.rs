//! A call's slice arguments, read straight from its [`CallLine`]: the fields that
//! [`Arguments::fill`] would collect from it through serde and then sort, given in key
//! order without collecting or sorting anything. Nearly every slice is a call, and
//! collecting through serde cost a third of the export's main thread.
//!
//! The fields are listed here a second time, in key order; a test checks the list
//! against `CallLine`'s own (serde's) and the values against [`Arguments::fill`]'s, so a
//! field added to `CallLine` and not here fails the tests.

use super::arguments::{Arg, Arguments};
use crate::schema::{CallLine, Hex};

/// Fields a call's slice does not repeat as arguments (the slice itself says them).
#[cfg(test)]
const NOT_ARGUMENTS: [&str; 5] = ["type", "name", "pid", "tid", "dur_ns"];

/// A slice's arguments, as the writers read them.
#[derive(Clone, Copy)]
pub enum SliceArgs<'a> {
    /// Collected and sorted ([`Arguments::sort`]).
    Collected(&'a Arguments),
    /// A call's decoded fields.
    Call(CallArgs<'a>),
}

impl SliceArgs<'_> {
    pub fn is_empty(&self) -> bool {
        match self {
            SliceArgs::Collected(arguments) => arguments.is_empty(),
            // `ts_ns` is always there.
            SliceArgs::Call(_) => false,
        }
    }

    /// No key or text value has a quote, a backslash or a control character: a JSON
    /// writer copies them as they are. Known only for a call read without escapes
    /// (whose field names are plain).
    pub fn is_plain(&self) -> bool {
        match self {
            SliceArgs::Collected(_) => false,
            SliceArgs::Call(call) => call.plain,
        }
    }
}

/// A call's arguments: every field but [`NOT_ARGUMENTS`], and, for a launch (whose slice
/// is named by its kernel), the function called as `call`.
#[derive(Clone, Copy)]
pub struct CallArgs<'a> {
    pub record: &'a CallLine,
    /// Add `call`.
    pub with_call: bool,
    /// The line had no escapes, so neither have its strings.
    pub plain: bool,
}

/// The keys [`CallArgs::visit`] can give, in key order (byte-wise, as a JSON map sorts
/// them); `visit` gives each with its index here.
pub const CALL_ARG_KEYS: [&str; 69] = [
    "addr",
    "advice",
    "advice_name",
    "alignment",
    "args",
    "block",
    "bytes",
    "call",
    "color",
    "comm",
    "comms",
    "context",
    "count",
    "datatype",
    "datatype_size",
    "depth",
    "device",
    "dptr",
    "dst",
    "dst_context",
    "event",
    "flags",
    "function",
    "graph",
    "graph_result",
    "grid",
    "group",
    "handle",
    "height",
    "host",
    "image",
    "ipc_handle",
    "kernel",
    "kernel_handle",
    "kernel_mangled",
    "key",
    "kind",
    "lib",
    "library",
    "library_option_count",
    "live_bytes",
    "location",
    "location_id",
    "module",
    "new_comm",
    "nranks",
    "offset",
    "op",
    "path",
    "peer",
    "pitch",
    "pool",
    "priority",
    "rank",
    "ret",
    "ret_name",
    "root",
    "shared_mem",
    "source_graph",
    "src",
    "src_context",
    "stream",
    "symbol",
    "ts_ns",
    "unique_id",
    "value",
    "version",
    "warnings",
    "width",
];

/// A signed field as `serde_json::to_value` numbers it: non-negative integers unsigned.
fn signed(value: i32) -> Arg<'static> {
    match u64::try_from(value) {
        Ok(unsigned) => Arg::Unsigned(unsigned),
        Err(_) => Arg::Signed(value.into()),
    }
}

/// `{:#x}` into `text`, as [`Hex`] serialises.
pub fn hex_digits(text: &mut [u8; 18], value: u64) -> &[u8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let width = (64 - (value | 1).leading_zeros()).div_ceil(4) as usize;
    text[..2].copy_from_slice(b"0x");
    for (index, byte) in text[2..2 + width].iter_mut().enumerate() {
        let shift = 4 * (width - 1 - index);
        *byte = DIGITS[(value >> shift) as usize & 0xf];
    }
    &text[..2 + width]
}

/// `[x,y,z]` into `text`.
fn triple(text: &mut [u8; 34], values: [u32; 3]) -> &str {
    let mut length = 0;
    for (index, value) in values.into_iter().enumerate() {
        text[length] = if index == 0 { b'[' } else { b',' };
        length += 1;
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(value).as_bytes();
        text[length..length + digits.len()].copy_from_slice(digits);
        length += digits.len();
    }
    text[length] = b']';
    // from_utf8 would check (about 80 instructions) what is known: two launch fields a call.
    debug_assert!(text[..=length].is_ascii());
    // SAFETY: only ASCII was written (brackets, commas and itoa's digits), and ASCII is UTF-8.
    unsafe { std::str::from_utf8_unchecked(&text[..=length]) }
}

impl CallArgs<'_> {
    /// Gives each argument present, in key order, with its index in [`CALL_ARG_KEYS`].
    pub fn visit(&self, mut give: impl FnMut(usize, &'static str, Arg<'_>)) {
        let record = self.record;
        let mut triple_text = [0u8; 34];
        // An index into CALL_ARG_KEYS and its key, checked by the tests.
        macro_rules! unsigned {
            ($index:literal, $field:ident) => {
                if let Some(value) = record.$field {
                    give($index, CALL_ARG_KEYS[$index], Arg::Unsigned(value.into()));
                }
            };
        }
        macro_rules! signed {
            ($index:literal, $field:ident) => {
                if let Some(value) = record.$field {
                    give($index, CALL_ARG_KEYS[$index], signed(value));
                }
            };
        }
        macro_rules! hex {
            ($index:literal, $field:ident) => {
                if let Some(Hex(value)) = record.$field {
                    give($index, CALL_ARG_KEYS[$index], Arg::Hex(value));
                }
            };
        }
        macro_rules! text {
            ($index:literal, $field:ident) => {
                if let Some(value) = &record.$field {
                    give($index, CALL_ARG_KEYS[$index], Arg::Text(value));
                }
            };
        }
        macro_rules! triple {
            ($index:literal, $field:ident) => {
                if let Some(values) = record.$field {
                    let json = triple(&mut triple_text, values);
                    give($index, CALL_ARG_KEYS[$index], Arg::Json(json));
                }
            };
        }
        // Lists are rare: written as serde_json writes them.
        macro_rules! list {
            ($index:literal, $field:ident) => {
                if !record.$field.is_empty() {
                    let json = serde_json::to_string(&record.$field).unwrap_or_default();
                    give($index, CALL_ARG_KEYS[$index], Arg::Json(&json));
                }
            };
        }
        hex!(0, addr);
        unsigned!(1, advice);
        text!(2, advice_name);
        unsigned!(3, alignment);
        list!(4, args);
        triple!(5, block);
        unsigned!(6, bytes);
        if self.with_call {
            give(7, CALL_ARG_KEYS[7], Arg::Text(&record.name));
        }
        signed!(8, color);
        hex!(9, comm);
        list!(10, comms);
        hex!(11, context);
        unsigned!(12, count);
        text!(13, datatype);
        unsigned!(14, datatype_size);
        unsigned!(15, depth);
        signed!(16, device);
        hex!(17, dptr);
        hex!(18, dst);
        hex!(19, dst_context);
        hex!(20, event);
        unsigned!(21, flags);
        hex!(22, function);
        hex!(23, graph);
        unsigned!(24, graph_result);
        triple!(25, grid);
        unsigned!(26, group);
        hex!(27, handle);
        unsigned!(28, height);
        hex!(29, host);
        hex!(30, image);
        text!(31, ipc_handle);
        text!(32, kernel);
        hex!(33, kernel_handle);
        text!(34, kernel_mangled);
        signed!(35, key);
        text!(36, kind);
        unsigned!(37, lib);
        hex!(38, library);
        unsigned!(39, library_option_count);
        unsigned!(40, live_bytes);
        text!(41, location);
        signed!(42, location_id);
        hex!(43, module);
        hex!(44, new_comm);
        signed!(45, nranks);
        unsigned!(46, offset);
        text!(47, op);
        text!(48, path);
        signed!(49, peer);
        unsigned!(50, pitch);
        hex!(51, pool);
        signed!(52, priority);
        signed!(53, rank);
        unsigned!(54, ret);
        text!(55, ret_name);
        signed!(56, root);
        unsigned!(57, shared_mem);
        hex!(58, source_graph);
        hex!(59, src);
        hex!(60, src_context);
        hex!(61, stream);
        text!(62, symbol);
        give(63, CALL_ARG_KEYS[63], Arg::Unsigned(record.ts_ns));
        text!(64, unique_id);
        unsigned!(65, value);
        signed!(66, version);
        list!(67, warnings);
        unsigned!(68, width);
    }
}

#[cfg(test)]
/// What [`CallArgs::visit`] stands for: the call's fields collected through serde and
/// sorted (the tests compare the two).
pub fn collect(call: &CallArgs<'_>, arguments: &mut Arguments) {
    arguments.clear();
    arguments.fill(call.record, |key| NOT_ARGUMENTS.contains(&key));
    if call.with_call {
        arguments.insert_text("call", &call.record.name);
    }
    arguments.sort();
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::schema::testing::{every_field, field_names};

    /// Leaked: a test's few strings.
    fn owned(value: Arg<'_>) -> Arg<'static> {
        match value {
            Arg::Text(text) => Arg::Text(Box::leak(text.into())),
            Arg::Json(json) => Arg::Json(Box::leak(json.into())),
            // Collecting gives pointers as text.
            Arg::Hex(value) => Arg::Text(Box::leak(format!("{value:#x}").into())),
            Arg::Unsigned(n) => Arg::Unsigned(n),
            Arg::Signed(n) => Arg::Signed(n),
            Arg::Float(x) => Arg::Float(x),
            Arg::Bool(b) => Arg::Bool(b),
        }
    }

    fn visited(call: &CallArgs<'_>) -> Vec<(usize, String, Arg<'static>)> {
        let mut given = Vec::new();
        call.visit(|index, key, value| given.push((index, key.to_owned(), owned(value))));
        given
    }

    fn collected(call: &CallArgs<'_>) -> Vec<(String, Arg<'static>)> {
        let mut arguments = Arguments::default();
        collect(call, &mut arguments);
        arguments
            .iter()
            .map(|(key, value)| (key.to_owned(), owned(value)))
            .collect()
    }

    #[test]
    fn the_keys_are_callline_s_fields_in_key_order() {
        let mut expected: Vec<&str> = field_names::<CallLine>()
            .iter()
            .copied()
            .filter(|key| !NOT_ARGUMENTS.contains(key))
            .chain(["call"])
            .collect();
        expected.sort_unstable_by_key(|key| key.as_bytes());
        assert_eq!(CALL_ARG_KEYS.as_slice(), expected.as_slice());
    }

    /// Every field set (positive and negative numbers, launches and not): the same
    /// arguments as collecting through serde gives, in the same order, each key at its
    /// index.
    #[test]
    fn visiting_gives_what_collecting_gives() {
        let positive = every_field(&[
            json!("0x7f00ab"),
            json!([4, 1, 65535]),
            json!(["0x1", "0xffffffffffffffff"]),
            json!(7),
        ]);
        let negative = every_field(&[
            json!("0x0"),
            json!([0, 0, 0]),
            json!(["entry_read_failed", "name_truncated"]),
            json!(-3),
            json!(u64::MAX),
        ]);
        let sparse = CallLine {
            name: "cuInit".into(),
            ts_ns: 5,
            flags: Some(0),
            ..CallLine::default()
        };
        for record in [&positive, &negative, &sparse] {
            for with_call in [true, false] {
                let call = CallArgs {
                    record,
                    with_call,
                    plain: true,
                };
                let given = visited(&call);
                for (index, key, _) in &given {
                    assert_eq!(CALL_ARG_KEYS[*index], key);
                }
                let given: Vec<(String, Arg<'static>)> = given
                    .into_iter()
                    .map(|(_, key, value)| (key, value))
                    .collect();
                assert_eq!(given, collected(&call));
            }
        }
        // Every key was given for the full record.
        let call = CallArgs {
            record: &positive,
            with_call: true,
            plain: true,
        };
        assert_eq!(visited(&call).len(), CALL_ARG_KEYS.len());
        let device = visited(&CallArgs {
            record: &negative,
            with_call: false,
            plain: true,
        })
        .into_iter()
        .find(|(_, key, _)| key == "device")
        .map(|(_, _, value)| value);
        assert_eq!(device, Some(Arg::Signed(-3)));
    }
}
