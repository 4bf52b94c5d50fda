//! A call's slice arguments, read straight from its [`CallLine`]: the fields that
//! [`Arguments::fill`] would collect from it through serde and then sort, given in key
//! order without collecting or sorting anything. Nearly every slice is a call, and
//! collecting through serde cost a third of the export's main thread.
//!
//! The keys and how each value is given follow from the call line's table of fields
//! (`schema::call`): the keys are sorted at compile time, and each field's value is given
//! as its type says ([`CallArg`]). A test checks the values against [`Arguments::fill`]'s.

use std::borrow::Cow;

use serde::Serialize;

use super::arguments::{Arg, Arguments};
use crate::schema::{CallLine, Hex, call_fields};

/// Fields a call's slice does not repeat as arguments (the slice itself says them).
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

/// Where a field's value is written out when the line holds it in another form.
struct Scratch {
    triple: [u8; 34],
    list: String,
}

impl Scratch {
    fn new() -> Self {
        Scratch {
            triple: [0; 34],
            list: String::new(),
        }
    }
}

/// How a call field's value is given as an argument.
trait CallArg {
    /// Its argument, if it has a value; `scratch` holds what is written out for it.
    fn arg<'a>(&'a self, scratch: &'a mut Scratch) -> Option<Arg<'a>>;
}

impl CallArg for Option<u64> {
    fn arg<'a>(&'a self, _: &'a mut Scratch) -> Option<Arg<'a>> {
        self.map(Arg::Unsigned)
    }
}

impl CallArg for Option<u32> {
    fn arg<'a>(&'a self, _: &'a mut Scratch) -> Option<Arg<'a>> {
        self.map(|value| Arg::Unsigned(value.into()))
    }
}

impl CallArg for Option<i32> {
    fn arg<'a>(&'a self, _: &'a mut Scratch) -> Option<Arg<'a>> {
        self.map(signed)
    }
}

impl CallArg for Option<Hex> {
    fn arg<'a>(&'a self, _: &'a mut Scratch) -> Option<Arg<'a>> {
        self.map(|Hex(value)| Arg::Hex(value))
    }
}

impl CallArg for Option<String> {
    fn arg<'a>(&'a self, _: &'a mut Scratch) -> Option<Arg<'a>> {
        self.as_deref().map(Arg::Text)
    }
}

impl CallArg for Option<Cow<'static, str>> {
    fn arg<'a>(&'a self, _: &'a mut Scratch) -> Option<Arg<'a>> {
        self.as_deref().map(Arg::Text)
    }
}

impl CallArg for Option<[u32; 3]> {
    fn arg<'a>(&'a self, scratch: &'a mut Scratch) -> Option<Arg<'a>> {
        self.map(|values| Arg::Json(triple(&mut scratch.triple, values)))
    }
}

/// Lists are rare: written as serde_json writes them.
impl<T: Serialize> CallArg for Vec<T> {
    fn arg<'a>(&'a self, scratch: &'a mut Scratch) -> Option<Arg<'a>> {
        if self.is_empty() {
            return None;
        }
        scratch.list = serde_json::to_string(self).unwrap_or_default();
        Some(Arg::Json(&scratch.list))
    }
}

/// `a < b`, byte-wise, at compile time.
const fn key_less(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut index = 0;
    while index < a.len() && index < b.len() {
        if a[index] != b[index] {
            return a[index] < b[index];
        }
        index += 1;
    }
    a.len() < b.len()
}

/// `keys` sorted by key, at compile time (an insertion sort of a few dozen).
const fn sorted<const N: usize>(keys: &[(&'static str, Key)]) -> [(&'static str, Key); N] {
    let mut sorted = [("", Key::call); N];
    let mut index = 0;
    while index < N {
        sorted[index] = keys[index];
        let mut at = index;
        while at > 0 && key_less(sorted[at].0, sorted[at - 1].0) {
            let before = sorted[at - 1];
            sorted[at - 1] = sorted[at];
            sorted[at] = before;
            at -= 1;
        }
        index += 1;
    }
    sorted
}

/// The keys of `keyed`, at compile time.
const fn keys_of<const N: usize>(keyed: &[(&'static str, Key); N]) -> [&'static str; N] {
    let mut keys = [""; N];
    let mut index = 0;
    while index < N {
        keys[index] = keyed[index].0;
        index += 1;
    }
    keys
}

/// The call's arguments from the rows of the call line's fields.
macro_rules! call_args {
    ($($(#[$doc:meta])* $field:ident: $wrapper:ident<$inner:ty> $(= $variant:ident)?,)*) => {
        /// A call argument, named as its key: each field of the line but
        /// [`NOT_ARGUMENTS`] (the slice says them), and `call`.
        #[derive(Clone, Copy)]
        #[expect(non_camel_case_types, reason = "named as the keys")]
        enum Key {
            ts_ns,
            ret,
            lib,
            call,
            $($field,)*
        }

        const UNSORTED: &[(&str, Key)] = &[
            ("ts_ns", Key::ts_ns),
            ("ret", Key::ret),
            ("lib", Key::lib),
            ("call", Key::call),
            $((stringify!($field), Key::$field),)*
        ];

        /// The arguments in key order.
        const KEYED: [(&str, Key); UNSORTED.len()] = sorted(UNSORTED);

        /// The value of argument `which`, if the call has it. Inlined where `which` is
        /// a constant, the match folds to its one arm.
        #[inline(always)]
        fn arg<'a>(
            call: &CallArgs<'a>,
            which: Key,
            scratch: &'a mut Scratch,
        ) -> Option<Arg<'a>> {
            let record = call.record;
            match which {
                Key::ts_ns => Some(Arg::Unsigned(record.ts_ns)),
                Key::ret => record.ret.arg(scratch),
                Key::lib => record.lib.arg(scratch),
                Key::call => call.with_call.then_some(Arg::Text(&record.name)),
                $(Key::$field => record.$field.arg(scratch),)*
            }
        }
    };
}
call_fields!(call_args);

/// The keys [`CallArgs::visit`] can give, in key order (byte-wise, as a JSON map sorts
/// them); `visit` gives each with its index here.
pub const CALL_ARG_KEYS: [&str; KEYED.len()] = keys_of(&KEYED);

/// Gives the argument at each index of [`KEYED`] that the call has, the indexes written
/// out as constants so that each folds to its one field: straight code in key order, as
/// if written by hand (a loop would dispatch on every index).
macro_rules! give_at_each_index {
    ($call:expr, $give:expr, $scratch:expr, $($index:literal)*) => {
        $(
            if let Some(&(name, which)) = KEYED.get($index)
                && let Some(value) = arg($call, which, &mut $scratch)
            {
                $give($index, name, value);
            }
        )*
    };
}

const _: () = assert!(KEYED.len() <= 80, "give_at_each_index! needs more indexes");

impl CallArgs<'_> {
    /// Gives each argument present, in key order, with its index in [`CALL_ARG_KEYS`].
    pub fn visit(&self, mut give: impl FnMut(usize, &'static str, Arg<'_>)) {
        let mut scratch = Scratch::new();
        give_at_each_index!(
            self, give, scratch,
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19
            20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39
            40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59
            60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79
        );
    }
}

/// What [`CallArgs::visit`] stands for: the call's fields collected through serde and
/// sorted (the tests compare the two). `--stacks` traces take this way for calls with a
/// stack, whose `stack` argument is its frames as text (`stack`), not its id: the fast way
/// stays as it is for every other call.
pub fn collect(call: &CallArgs<'_>, stack: Option<&str>, arguments: &mut Arguments) {
    arguments.clear();
    arguments.fill(call.record, |key| NOT_ARGUMENTS.contains(&key));
    if call.with_call {
        arguments.insert_text("call", &call.record.name);
    }
    if let Some(stack) = stack {
        arguments.insert_text("stack", stack);
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
        collect(call, None, &mut arguments);
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
