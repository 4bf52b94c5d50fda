//! A fast reader for lines as the writer writes them: compact JSON (no whitespace), strings
//! without escapes, integers. It is a serde `Deserializer`, so a line type's own derived
//! `Deserialize` fills the struct, field list and all; it gives up (`None`) at anything
//! outside that shape, and [`schema::parse`](crate::schema::parse) then reads the line with
//! serde_json, which also words the error of a malformed line. It never accepts a line that
//! serde_json would read differently or reject: every case it does not handle exactly
//! (escapes, `null`, floats, leading zeros, whitespace, nested objects, trailing bytes) is
//! handed back, and the tests compare the two on generated lines.
//!
//! serde_json spends most of its time on generality this format does not use; reading
//! the trace's call lines this way is about three times faster.

mod scan;

use serde::{
    Deserialize,
    de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor},
};

pub use scan::plain;
use scan::{MAX_QUOTES, find_quotes};

/// Reads `line` as a `T`, or `None` when it is not in the compact shape (or not a `T`,
/// or not UTF-8).
pub fn from_bytes<'de, T: Deserialize<'de>>(line: &'de [u8]) -> Option<T> {
    let mut quotes = [0u32; MAX_QUOTES];
    let mut reader = Compact::new(line, &mut quotes)?;
    let value = T::deserialize(&mut reader).ok()?;
    reader.at_end().then_some(value)
}

/// Reads `line` into `place`, reusing what it owns (a call's strings), and says whether
/// it could. On `false`, `place` may be half written: the caller reads the line afresh.
pub fn from_bytes_in_place<'de, T: Deserialize<'de>>(line: &'de [u8], place: &mut T) -> bool {
    let mut quotes = [0u32; MAX_QUOTES];
    let Some(mut reader) = Compact::new(line, &mut quotes) else {
        return false;
    };
    T::deserialize_in_place(&mut reader, place).is_ok() && reader.at_end()
}

/// Why the compact reader gave up; never shown (serde_json reads the line again).
#[derive(Debug)]
pub struct GiveUp;

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not a compact line")
    }
}

impl std::error::Error for GiveUp {}

impl de::Error for GiveUp {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        GiveUp
    }
}

type Result<T> = std::result::Result<T, GiveUp>;

struct Compact<'de, 'q> {
    text: &'de str,
    bytes: &'de [u8],
    at: usize,
    /// The positions of the quotes not yet read.
    quotes: &'q [u32],
}

impl<'de, 'q> Compact<'de, 'q> {
    /// A reader of `line`, or `None` when it has escapes or too many quotes, or is not
    /// UTF-8 (checked only where a byte is not ASCII: an ASCII line is UTF-8).
    fn new(line: &'de [u8], quotes: &'q mut [u32; MAX_QUOTES]) -> Option<Self> {
        let (count, ascii) = find_quotes(line, quotes)?;
        let text = match ascii {
            // SAFETY: every byte is ASCII, and ASCII is UTF-8.
            true => unsafe { std::str::from_utf8_unchecked(line) },
            false => std::str::from_utf8(line).ok()?,
        };
        Some(Compact {
            text,
            bytes: line,
            at: 0,
            quotes: &quotes[..count],
        })
    }

    /// Whether the whole line was read (nothing after the value).
    fn at_end(&self) -> bool {
        self.at == self.bytes.len()
    }
}

impl<'de> Compact<'de, '_> {
    fn peek(&self) -> Result<u8> {
        self.bytes.get(self.at).copied().ok_or(GiveUp)
    }

    fn expect(&mut self, byte: u8) -> Result<()> {
        if self.peek()? != byte {
            return Err(GiveUp);
        }
        self.at += 1;
        Ok(())
    }

    /// A string (the line has no escapes), borrowed from the line.
    fn string(&mut self) -> Result<&'de str> {
        let [open, close, rest @ ..] = self.quotes else {
            return Err(GiveUp);
        };
        let (start, end) = (*open as usize, *close as usize);
        if start != self.at {
            return Err(GiveUp);
        }
        self.quotes = rest;
        self.at = end + 1;
        // Quotes are ASCII, so both ends are character boundaries.
        Ok(&self.text[start + 1..end])
    }

    /// An integer as JSON writes it: digits without a leading zero, and no fraction or
    /// exponent after them.
    fn unsigned(&mut self) -> Result<u64> {
        let start = self.at;
        let mut value: u64 = 0;
        let mut at = start;
        while let Some(digit) = self.bytes.get(at).and_then(|b| b.checked_sub(b'0')) {
            if digit > 9 {
                break;
            }
            // u64::MAX has 20 digits: the 20th may overflow.
            value = match at - start {
                0..19 => value * 10 + u64::from(digit),
                _ => value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(u64::from(digit)))
                    .ok_or(GiveUp)?,
            };
            at += 1;
        }
        let count = at - start;
        let leading_zero = count > 1 && self.bytes[start] == b'0';
        let fraction = matches!(self.bytes.get(at), Some(b'.' | b'e' | b'E'));
        if count == 0 || leading_zero || fraction {
            return Err(GiveUp);
        }
        self.at = at;
        Ok(value)
    }

    fn signed(&mut self) -> Result<i64> {
        if self.peek()? != b'-' {
            return i64::try_from(self.unsigned()?).map_err(|_| GiveUp);
        }
        self.at += 1;
        let magnitude = self.unsigned()?;
        // serde_json reads "-0" as a float: leave it to serde_json.
        if magnitude == 0 || magnitude > i64::MAX as u64 {
            return Err(GiveUp);
        }
        Ok(-(magnitude as i64))
    }
}

/// Serde calls that this reader does not take: gives up.
macro_rules! give_up {
    ($($method:ident)*) => {
        $(
            fn $method<V: Visitor<'de>>(self, _: V) -> Result<V::Value> {
                Err(GiveUp)
            }
        )*
    };
}

impl<'de> de::Deserializer<'de> for &mut Compact<'de, '_> {
    type Error = GiveUp;

    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_u8(u8::try_from(self.unsigned()?).map_err(|_| GiveUp)?)
    }

    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_u16(u16::try_from(self.unsigned()?).map_err(|_| GiveUp)?)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_u32(u32::try_from(self.unsigned()?).map_err(|_| GiveUp)?)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_u64(self.unsigned()?)
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_i8(i8::try_from(self.signed()?).map_err(|_| GiveUp)?)
    }

    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_i16(i16::try_from(self.signed()?).map_err(|_| GiveUp)?)
    }

    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_i32(i32::try_from(self.signed()?).map_err(|_| GiveUp)?)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_i64(self.signed()?)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_borrowed_str(self.string()?)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_borrowed_str(self.string()?)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_borrowed_str(self.string()?)
    }

    /// The writer leaves absent fields out rather than writing `null`.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.peek()? == b'n' {
            return Err(GiveUp);
        }
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.expect(b'[')?;
        let value = visitor.visit_seq(Elements {
            reader: &mut *self,
            first: true,
        })?;
        self.expect(b']')?;
        Ok(value)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.expect(b'{')?;
        let value = visitor.visit_map(Entries {
            reader: &mut *self,
            first: true,
        })?;
        self.expect(b'}')?;
        Ok(value)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_map(visitor)
    }

    /// `"type"` and keys a line type does not know: a string or an integer is skipped,
    /// anything else left to serde_json.
    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek()? {
            b'"' => {
                self.string()?;
            }
            b'-' => {
                self.signed()?;
            }
            _ => {
                self.unsigned()?;
            }
        }
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, _: V) -> Result<V::Value> {
        Err(GiveUp)
    }

    /// A value of a type the reader does not name: `#[serde(flatten)]` fields (GPU lines)
    /// are read this way. Numbers as serde_json gives them: unsigned unless negative.
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.peek()? {
            b'"' => visitor.visit_borrowed_str(self.string()?),
            b'-' => visitor.visit_i64(self.signed()?),
            b'0'..=b'9' => visitor.visit_u64(self.unsigned()?),
            b'[' => self.deserialize_seq(visitor),
            b'{' => self.deserialize_map(visitor),
            b't' | b'f' => self.deserialize_bool(visitor),
            // null: left to serde_json.
            _ => Err(GiveUp),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let rest = &self.bytes[self.at..];
        let (value, length) = if rest.starts_with(b"true") {
            (true, 4)
        } else if rest.starts_with(b"false") {
            (false, 5)
        } else {
            return Err(GiveUp);
        };
        self.at += length;
        visitor.visit_bool(value)
    }

    give_up! {
        deserialize_f32 deserialize_f64 deserialize_char
        deserialize_bytes deserialize_byte_buf deserialize_unit
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value> {
        Err(GiveUp)
    }
}

/// The elements of `[...]`.
struct Elements<'a, 'de, 'q> {
    reader: &'a mut Compact<'de, 'q>,
    first: bool,
}

impl<'de> SeqAccess<'de> for Elements<'_, 'de, '_> {
    type Error = GiveUp;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if self.reader.peek()? == b']' {
            return Ok(None);
        }
        if !std::mem::take(&mut self.first) {
            self.reader.expect(b',')?;
        }
        seed.deserialize(&mut *self.reader).map(Some)
    }
}

/// The `"key":value` entries of `{...}`.
struct Entries<'a, 'de, 'q> {
    reader: &'a mut Compact<'de, 'q>,
    first: bool,
}

impl<'de> MapAccess<'de> for Entries<'_, 'de, '_> {
    type Error = GiveUp;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if self.reader.peek()? == b'}' {
            return Ok(None);
        }
        if !std::mem::take(&mut self.first) {
            self.reader.expect(b',')?;
        }
        let key = seed.deserialize(&mut *self.reader)?;
        self.reader.expect(b':')?;
        Ok(Some(key))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        seed.deserialize(&mut *self.reader)
    }
}

#[cfg(test)]
mod tests;
