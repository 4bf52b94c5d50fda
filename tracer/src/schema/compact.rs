//! A fast reader for lines as the writer writes them: compact JSON (no whitespace), strings
//! without escapes, integers. It is a serde `Deserializer`, so a line type's own derived
//! `Deserialize` fills the struct, field list and all; it gives up (`None`) at anything
//! outside that shape, and [`parse`](super::parse) then reads the line with serde_json as
//! before, which also words the error of a malformed line. It never accepts a line that
//! serde_json would read differently or reject: every case it does not handle exactly
//! (escapes, `null`, floats, leading zeros, whitespace, nested objects, trailing bytes) is
//! handed back, and the tests compare the two on generated lines.
//!
//! serde_json spends most of its time on generality this format does not use; reading
//! the trace's call lines this way is about three times faster.

use serde::{
    Deserialize,
    de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor},
};

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

/// The positions of the quotes in `line`, and whether it is all ASCII; `None` if it has an
/// escape or a control character (JSON whitespace, or invalid), or too many quotes. Without
/// escapes every quote opens or closes a string, in order.
fn find_quotes(line: &[u8], quotes: &mut [u32; MAX_QUOTES]) -> Option<(usize, bool)> {
    let mut count = 0;
    let mut ascii = true;
    let mut scan = |block: &[u8; BLOCK], offset: usize| -> Option<()> {
        let (mut quote_bits, unusual, block_ascii) = classify(block);
        if unusual {
            return None;
        }
        ascii &= block_ascii;
        while quote_bits != 0 {
            *quotes.get_mut(count)? = u32::try_from(offset).ok()? + quote_bits.trailing_zeros();
            count += 1;
            quote_bits &= quote_bits - 1;
        }
        Some(())
    };
    let mut blocks = line.chunks_exact(BLOCK);
    let mut offset = 0;
    for block in &mut blocks {
        scan(block.try_into().ok()?, offset)?;
        offset += BLOCK;
    }
    // The rest, padded with spaces (neither quotes nor unusual).
    let mut last = [b' '; BLOCK];
    last[..blocks.remainder().len()].copy_from_slice(blocks.remainder());
    scan(&last, offset)?;
    Some((count, ascii))
}

/// Whether JSON writes `text` as it is between quotes: no quote, backslash or control
/// character (what serde_json escapes). Kernel names are long and written millions of
/// times: four blocks are tested at once.
pub fn plain(text: &[u8]) -> bool {
    let mut runs = text.chunks_exact(4 * BLOCK);
    for run in &mut runs {
        let (first, rest) = run.split_at(BLOCK);
        let (second, rest) = rest.split_at(BLOCK);
        let (third, fourth) = rest.split_at(BLOCK);
        let blocks = [first, second, third, fourth].map(|block| block.try_into().ok());
        let [Some(a), Some(b), Some(c), Some(d)] = blocks else {
            return false;
        };
        if escaped(a) | escaped(b) | escaped(c) | escaped(d) {
            return false;
        }
    }
    let mut blocks = runs.remainder().chunks_exact(BLOCK);
    for block in &mut blocks {
        match block.try_into() {
            Ok(block) if !escaped(block) => {}
            _ => return false,
        }
    }
    // The rest, padded with spaces (plain).
    let mut last = [b' '; BLOCK];
    last[..blocks.remainder().len()].copy_from_slice(blocks.remainder());
    !escaped(&last)
}

/// Whether `block` holds a quote, a backslash or a control character.
fn escaped(block: &[u8; BLOCK]) -> bool {
    let (quotes, unusual, _) = classify(block);
    quotes != 0 || unusual
}

const BLOCK: usize = 16;

/// A bit per quote in `block`, whether it holds a backslash or a control character, and
/// whether all of it is ASCII.
#[cfg(target_arch = "x86_64")]
fn classify(block: &[u8; BLOCK]) -> (u64, bool, bool) {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    // SAFETY: SSE2 is part of the x86_64 baseline, so these instructions exist on every
    // x86_64 CPU; the load reads the 16 bytes of `block` (no alignment needed).
    unsafe {
        let bytes = _mm_loadu_si128(block.as_ptr().cast());
        let quote = _mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'\\' as i8));
        // max(byte, 0x1f) == 0x1f: byte <= 0x1f, unsigned.
        let limit = _mm_set1_epi8(0x1f);
        let control = _mm_cmpeq_epi8(_mm_max_epu8(bytes, limit), limit);
        let unusual = _mm_movemask_epi8(_mm_or_si128(backslash, control));
        // The high bit of each byte: set on bytes that are not ASCII.
        let high = _mm_movemask_epi8(bytes);
        (
            _mm_movemask_epi8(quote) as u16 as u64,
            unusual != 0,
            high == 0,
        )
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn classify(block: &[u8; BLOCK]) -> (u64, bool, bool) {
    let mut quote_bits = 0;
    let mut unusual = false;
    for (index, byte) in block.iter().enumerate() {
        quote_bits |= u64::from(*byte == b'"') << index;
        unusual |= (*byte < 0x20) | (*byte == b'\\');
    }
    (quote_bits, unusual, block.is_ascii())
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

/// Quotes in a line (keys and string values, two each) this reader takes; more is left to
/// serde_json.
const MAX_QUOTES: usize = 256;

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
mod tests {
    use super::*;
    use crate::schema::{CallLine, Hex};
    use proptest::prelude::*;

    /// What serde_json makes of `line`, for comparison.
    fn serde_json_reads(line: &[u8]) -> Option<CallLine> {
        serde_json::from_slice(line).ok()
    }

    fn from_str<'de, T: Deserialize<'de>>(line: &'de str) -> Option<T> {
        from_bytes(line.as_bytes())
    }

    #[test]
    fn lines_the_writer_writes_are_read_whole() {
        let call = CallLine {
            name: "cuLaunchKernel".into(),
            pid: 7,
            tid: 8,
            ts_ns: u64::MAX,
            dur_ns: Some(0),
            ret: Some(719),
            ret_name: Some("CUDA_ERROR_LAUNCH_FAILED".into()),
            grid: Some([1, 2, 3]),
            block: Some([4294967295, 0, 1]),
            stream: Some(Hex(0x10)),
            function: Some(Hex(u64::MAX)),
            kernel: Some("void k<(char)1>(int, float*) ü ∑".into()),
            device: Some(-1),
            version: Some(i32::MIN + 1),
            warnings: vec!["entry_read_failed".into(), "name_truncated".into()],
            ..CallLine::default()
        };
        let line = serde_json::to_string(&call).unwrap();
        assert_eq!(from_str::<CallLine>(&line), Some(call));
    }

    #[test]
    fn anything_else_is_left_to_serde_json() {
        for line in [
            // An escape, whitespace, null, a float, a leading zero, -0, a nested object,
            // trailing bytes, a duplicate key, an overflow, a bad pointer, a missing field.
            r#"{"type":"call","name":"cu\"Init","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0}"#,
            r#"{"type":"call", "name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0}"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"kind":null}"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"bytes":1.0}"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"bytes":1e3}"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":01,"dur_ns":1,"ret":0}"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"device":-0}"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"x":{"a":1}}"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0}x"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"ret":1}"#,
            r#"{"type":"call","name":"cuInit","pid":4294967296,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0}"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"dptr":"0xzz"}"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"dur_ns":1,"ret":0}"#,
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"grid":[1,2]}"#,
            "{\"type\":\"call\",\"name\":\"cu\tInit\",\"pid\":1,\"tid\":1,\"ts_ns\":1,\"dur_ns\":1,\"ret\":0}",
        ] {
            assert_eq!(from_str::<CallLine>(line), None, "{line}");
        }
        // Bytes that are not UTF-8, inside strings: "cuInit" and, far into the line, the
        // kernel name.
        for at in [23, 100] {
            let mut line = format!(
                r#"{{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"kernel":"{}"}}"#,
                "k".repeat(64)
            )
            .into_bytes();
            line[at] = 0xff;
            assert_eq!(from_bytes::<CallLine>(&line), None, "{at}");
            assert_eq!(serde_json_reads(&line), None, "{at}");
        }
        // A key this version does not know, with a plain value, is skipped as serde does.
        let line = r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"new":"x","newer":-5}"#;
        assert_eq!(
            from_str::<CallLine>(line),
            serde_json_reads(line.as_bytes())
        );
        assert!(from_str::<CallLine>(line).is_some());
    }

    /// GPU activity lines (a flattened part, booleans, negative numbers), as the writer
    /// writes them and as the test traces have them: read whole, as serde_json reads them.
    #[test]
    fn gpu_lines_are_read_as_serde_json_reads_them() {
        use crate::schema::{GpuCopyLine, GpuKernelLine, GpuLink, GpuMemsetLine};
        let link = GpuLink {
            correlation_id: 9,
            graph_id: Some(2),
            call_tid: Some(301),
            call_ts_ns: Some(u64::MAX),
            queued_ns: Some(-200),
            unlinked: None,
            warnings: vec!["name_truncated".into()],
        };
        let kernel = GpuKernelLine {
            pid: 300,
            stream: 7,
            ts_ns: 5,
            dur_ns: 6,
            kernel: "gemm()".into(),
            kernel_mangled: Some("_Z4gemmv".into()),
            grid: [4, 1, 1],
            link: link.clone(),
            ..GpuKernelLine::default()
        };
        let copy = GpuCopyLine {
            pid: 300,
            kind: "HtoD".into(),
            bytes: 4096,
            is_async: true,
            link: GpuLink {
                unlinked: Some("no_call_record".into()),
                ..GpuLink::default()
            },
            ..GpuCopyLine::default()
        };
        let line = serde_json::to_string(&kernel).unwrap();
        assert_eq!(from_str::<GpuKernelLine>(&line), Some(kernel));
        let line = serde_json::to_string(&copy).unwrap();
        assert_eq!(from_str::<GpuCopyLine>(&line), Some(copy));
        let mut read = 0;
        for line in crate::test_traces::gpu().lines() {
            let kernel = from_str::<GpuKernelLine>(line);
            let copy = from_str::<GpuCopyLine>(line);
            let memset = from_str::<GpuMemsetLine>(line);
            if line.starts_with(r#"{"type":"gpu_kernel""#) {
                assert!(kernel.is_some(), "{line}");
            }
            read += usize::from(kernel.is_some() || copy.is_some() || memset.is_some());
            assert_eq!(kernel, serde_json::from_str(line).ok(), "{line}");
            assert_eq!(copy, serde_json::from_str(line).ok(), "{line}");
            assert_eq!(memset, serde_json::from_str(line).ok(), "{line}");
        }
        assert!(read >= 3, "{read} GPU lines read");
    }

    /// Over a call with every field set, a line with a few fields leaves none of the
    /// others behind.
    #[test]
    fn reading_in_place_over_every_field_leaves_none_behind() {
        use crate::schema::testing::{every_field, field_names};
        let mut place = every_field(&[
            serde_json::json!("0x7f00ab"),
            serde_json::json!([4, 1, 65535]),
            serde_json::json!(["0x1"]),
            serde_json::json!(7),
        ]);
        let set = serde_json::to_value(&place).unwrap();
        assert_eq!(
            set.as_object().unwrap().len(),
            field_names::<CallLine>().len()
        );
        let line =
            r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0}"#;
        assert!(from_bytes_in_place(line.as_bytes(), &mut place));
        assert_eq!(Some(place), from_str::<CallLine>(line));
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z0-9_:<>(), *&]{0,40}",
            // Escapes, quotes, controls and non-ASCII: serde_json's to write and read.
            ".{0,12}",
            Just("\"\\\n\u{1}é".to_owned()),
        ]
    }

    prop_compose! {
        fn call_line()(
            name in text(),
            (pid, tid, ts_ns, dur_ns, ret) in (any::<u32>(), any::<u32>(), any::<u64>(), proptest::option::of(any::<u64>()), proptest::option::of(any::<u32>())),
            kind in proptest::option::of(text()),
            bytes in proptest::option::of(any::<u64>()),
            dptr in proptest::option::of(any::<u64>()),
            grid in proptest::option::of(any::<[u32; 3]>()),
            kernel in proptest::option::of(text()),
            device in proptest::option::of(any::<i32>()),
            warnings in proptest::collection::vec(text(), 0..3),
        ) -> CallLine {
            CallLine {
                name,
                pid,
                tid,
                ts_ns,
                dur_ns,
                ret,
                kind: kind.map(Into::into),
                bytes,
                dptr: dptr.map(Hex),
                grid,
                kernel,
                device,
                warnings: warnings.into_iter().map(Into::into).collect(),
                ..CallLine::default()
            }
        }
    }

    proptest! {
        /// Written lines, and the same lines cut or with a byte changed: where the compact
        /// reader reads a line it reads what serde_json reads; where serde_json rejects one
        /// it gives up.
        #[test]
        fn it_agrees_with_serde_json(call in call_line(), cut in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let line = serde_json::to_string(&call).unwrap();
            match from_str::<CallLine>(&line) {
                Some(read) => prop_assert_eq!(&read, &call),
                // Only escapes (quotes, backslashes, control characters) are left over.
                None => prop_assert!(line.contains('\\'), "{}", line),
            }
            let mut changed = line.clone().into_bytes();
            let at = cut.index(changed.len());
            changed[at] = byte;
            // Bytes that are not UTF-8 too: serde_json rejects them, and so must this.
            for variant in [&line.as_bytes()[..at], &changed[..]] {
                let compact = from_bytes::<CallLine>(variant);
                if compact.is_some() {
                    prop_assert_eq!(compact, serde_json_reads(variant), "{}", String::from_utf8_lossy(variant));
                }
            }
        }

        /// Read into the place of another call, a line leaves nothing of that call behind:
        /// the place ends equal to the line read afresh, field for field.
        #[test]
        fn reading_in_place_leaves_nothing_of_the_call_before(call in call_line(), before in call_line()) {
            let line = serde_json::to_string(&call).unwrap();
            let mut place = before;
            match from_str::<CallLine>(&line) {
                Some(fresh) => {
                    prop_assert!(from_bytes_in_place(line.as_bytes(), &mut place), "{}", line);
                    prop_assert_eq!(&place, &fresh);
                }
                None => prop_assert!(!from_bytes_in_place(line.as_bytes(), &mut place), "{}", line),
            }
        }
    }
}
