//! The SSE2 scan under the compact reader: where a line's quotes are, and whether a string
//! is written as it is in JSON; 16 bytes at a time.

/// Quotes in a line (keys and string values, two each) this reader takes; more is left to
/// serde_json.
pub(super) const MAX_QUOTES: usize = 256;

/// The positions of the quotes in `line`, and whether it is all ASCII; `None` if it has an
/// escape or a control character (JSON whitespace, or invalid), or too many quotes. Without
/// escapes every quote opens or closes a string, in order.
pub(super) fn find_quotes(line: &[u8], quotes: &mut [u32; MAX_QUOTES]) -> Option<(usize, bool)> {
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
