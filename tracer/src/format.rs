//! Figures for people: durations, byte sizes, counted words and names cut to fit. Shared by
//! the summary's text, `cudatrace run`'s closing lines, the export's slice names and the
//! plot, so each figure reads the same everywhere.

/// `999 ns`, `1.5 µs`, `2.50 ms`, `3.000 s`.
pub fn format_ns(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} ms", ns as f64 / 1e6),
        _ => format!("{:.3} s", ns as f64 / 1e9),
    }
}

/// `1023 B`, `10.02 MiB`: binary units with two decimals.
pub fn format_bytes(bytes: u64) -> String {
    let mut text = String::with_capacity(16);
    push_bytes(&mut text, bytes);
    text
}

/// [`format_bytes`] onto `text`. A copy's slice is named with its size, so this runs for
/// millions of slices: the two decimals come from integer arithmetic, rounded as `{:.2}`
/// rounds the exact quotient (half to even), which `bytes / unit` is below 2^53.
pub fn push_bytes(text: &mut String, bytes: u64) {
    use std::fmt::Write;
    const UNITS: [(&str, u32); 4] = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
    for (unit, shift) in UNITS {
        if bytes >> shift == 0 {
            continue;
        }
        if bytes >= 1 << f64::MANTISSA_DIGITS {
            // Writing into a String does not fail.
            let _ = write!(text, "{:.2} {unit}", bytes as f64 / (1u64 << shift) as f64);
            return;
        }
        let hundredths = u128::from(bytes) * 100;
        let (mut whole, rest) = (hundredths >> shift, hundredths & ((1 << shift) - 1));
        let half = 1 << (shift - 1);
        if rest > half || (rest == half && whole % 2 == 1) {
            whole += 1;
        }
        let mut digits = itoa::Buffer::new();
        text.push_str(digits.format(whole / 100));
        let fraction = (whole % 100) as u8;
        text.push('.');
        text.push(char::from(b'0' + fraction / 10));
        text.push(char::from(b'0' + fraction % 10));
        text.push(' ');
        text.push_str(unit);
        return;
    }
    text.push_str(itoa::Buffer::new().format(bytes));
    text.push_str(" B");
}

/// At most `max_chars` characters, with an ellipsis when cut.
pub fn shorten(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `1 call`, `2 calls`, `3 processes`, `4 launches`.
pub fn plural(n: u64, word: &str) -> String {
    match (n, word.ends_with(['s', 'h'])) {
        (1, _) => format!("{n} {word}"),
        (_, true) => format!("{n} {word}es"),
        _ => format!("{n} {word}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What `format_bytes` wrote with float formatting, for every size.
    fn bytes_as_floats(bytes: u64) -> String {
        const UNITS: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        for (unit, size) in UNITS {
            if bytes >= size {
                return format!("{:.2} {unit}", bytes as f64 / size as f64);
            }
        }
        format!("{bytes} B")
    }

    proptest! {
        #[test]
        fn byte_sizes_read_as_float_formatting_writes_them(bytes in any::<u64>(), shift in 0u32..64) {
            // Every magnitude, and sizes at and around a tie of the third decimal.
            let bytes = bytes >> shift;
            for bytes in [bytes, bytes.saturating_add(1), bytes.saturating_sub(1)] {
                prop_assert_eq!(format_bytes(bytes), bytes_as_floats(bytes));
            }
        }
    }

    #[test]
    fn byte_sizes_round_ties_to_even_as_float_formatting_does() {
        // 1.125 KiB and 1.375 KiB: exact ties.
        for bytes in [
            0,
            1,
            1023,
            1024,
            1152,
            1408,
            1535,
            1536,
            (1 << 53) + 3,
            u64::MAX,
        ] {
            assert_eq!(format_bytes(bytes), bytes_as_floats(bytes), "{bytes}");
        }
        assert_eq!(format_bytes(1152), "1.12 KiB");
        assert_eq!(format_bytes(1408), "1.38 KiB");
        assert_eq!(format_bytes(u64::MAX), "16777216.00 TiB");
    }

    #[test]
    fn units_are_readable() {
        assert_eq!(format_ns(999), "999 ns");
        assert_eq!(format_ns(1500), "1.5 µs");
        assert_eq!(format_ns(2_500_000), "2.50 ms");
        assert_eq!(format_ns(3_000_000_000), "3.000 s");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(10_506_240), "10.02 MiB");
        assert_eq!(shorten("abcdef", 4), "abc…");
    }
}
