//! bpftrace doing the pairing cudatrace does, as a third condition beside the floor.

/// Sums the counts of a bpftrace histogram (`[8K, 16K)   297165 |@@@@|`).
pub fn histogram_total(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with('['))
        .filter_map(|l| {
            let close = l.find([')', ']'])?;
            l[close + 1..]
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpftrace_histogram_counts_are_summed() {
        let text = "Attaching 4 probes...\nready\n\n\n@d: \n\
                    [0]                    2 |@        |\n\
                    [8K, 16K)         297165 |@@@@@@@@@@|\n\
                    [16K, 32K)          2478 |         |\n\n";
        assert_eq!(histogram_total(text), 2 + 297165 + 2478);
    }
}
