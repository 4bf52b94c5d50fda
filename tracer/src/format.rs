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
