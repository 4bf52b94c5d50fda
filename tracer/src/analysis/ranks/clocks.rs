//! One clock for a job's traces. Each trace maps its `CLOCK_MONOTONIC` to wall time by
//! its header's pair of clocks, which puts hosts within NTP's agreement (milliseconds at
//! worst). Where `--gpu` traces hold the same collectives, the kernels of one collective
//! end together on every rank (the last step of a collective completes on all ranks at
//! once): the median difference of their ends is each trace's offset from another, and
//! their spread its uncertainty.

use serde::Serialize;

/// How one trace's clock is put on the job's.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClockFit {
    /// Added to the trace's wall time (header start + `ts_ns` − header monotonic start).
    pub offset_ns: i64,
    /// The spread of the collectives' end differences (1.4826 × their median absolute
    /// deviation, a standard deviation robust to outliers), summed in quadrature along a
    /// chain of traces; absent when it rests on the wall clock alone or on one collective.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncertainty_ns: Option<u64>,
    /// `reference` (offset 0 by definition), `collectives` (fitted on the kernels' ends),
    /// `wall clock` (no shared `--gpu` collective: its header's wall clock, as NTP set it).
    pub method: &'static str,
    /// The trace it was fitted against (index in the job), and on how many collectives.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aligned_to: Option<usize>,
    pub collectives_used: u64,
}

/// End differences between two traces: `wall_a(end) − wall_b(end)` per shared collective.
pub type Differences = Vec<i128>;

/// Fits every trace's offset from the pairs' differences (`pairs[(a, b)]` with `a < b`).
/// Trace 0 is the reference; each trace is fitted against the already fitted one it
/// shares most collectives with; traces sharing none with any fitted trace start a group
/// of their own on their wall clock.
pub fn fit(
    traces: usize,
    pairs: &std::collections::BTreeMap<(usize, usize), Differences>,
) -> Vec<ClockFit> {
    let mut fits: Vec<Option<ClockFit>> = vec![None; traces];
    let mut variance: Vec<Option<f64>> = vec![None; traces];
    for root in 0..traces {
        if fits[root].is_some() {
            continue;
        }
        fits[root] = Some(ClockFit {
            method: if root == 0 { "reference" } else { "wall clock" },
            ..ClockFit::default()
        });
        variance[root] = Some(0.0);
        // Grow from the fitted traces, the best-supported pair first.
        loop {
            let best = pairs
                .iter()
                .filter(|((a, b), d)| !d.is_empty() && fits[*a].is_some() != fits[*b].is_some())
                .max_by_key(|((a, b), d)| (d.len(), std::cmp::Reverse((*a, *b))));
            let Some((&(a, b), differences)) = best else {
                break;
            };
            let (known, new, sign) = if fits[a].is_some() {
                (a, b, 1)
            } else {
                (b, a, -1)
            };
            let (median, spread) = median_and_spread(differences);
            // wall_a(end) + o_a = wall_b(end) + o_b, so o_b = o_a + (wall_a − wall_b).
            let base = fits[known].as_ref().map_or(0, |fit| fit.offset_ns);
            let offset = base + sign * median;
            let chained = match (variance[known], spread) {
                (Some(v), Some(s)) => Some(v + s * s),
                _ => None,
            };
            variance[new] = chained;
            fits[new] = Some(ClockFit {
                offset_ns: offset,
                uncertainty_ns: chained.map(|v| v.sqrt().round() as u64),
                method: "collectives",
                aligned_to: Some(known),
                collectives_used: differences.len() as u64,
            });
        }
    }
    fits.into_iter().map(Option::unwrap_or_default).collect()
}

/// The median of `values` and their robust spread (none for fewer than two).
fn median_and_spread(values: &[i128]) -> (i64, Option<f64>) {
    let middle = median(values);
    if values.len() < 2 {
        return (middle as i64, None);
    }
    let deviations: Vec<i128> = values.iter().map(|v| (v - middle).abs()).collect();
    (middle as i64, Some(1.4826 * median(&deviations) as f64))
}

fn median(values: &[i128]) -> i128 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]).div_euclid(2)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn offsets_follow_the_best_supported_pairs_and_chain() {
        let mut pairs = BTreeMap::new();
        // Trace 1 ends 250 µs later than trace 0 by its own clock: it must go back.
        pairs.insert(
            (0, 1),
            vec![-250_000, -250_010, -249_990, -250_000, -400_000],
        );
        // Trace 2 only meets trace 1.
        pairs.insert((1, 2), vec![1_000, 1_000, 1_000]);
        let fits = fit(4, &pairs);
        assert_eq!(fits[0].method, "reference");
        assert_eq!((fits[1].offset_ns, fits[1].aligned_to), (-250_000, Some(0)));
        // Deviations 0, 10, 10, 0, 150_000: MAD 10.
        assert_eq!(fits[1].uncertainty_ns, Some(15));
        assert_eq!((fits[2].offset_ns, fits[2].aligned_to), (-249_000, Some(1)));
        assert_eq!(fits[2].uncertainty_ns, Some(15));
        assert_eq!(
            (fits[3].method, fits[3].offset_ns, fits[3].uncertainty_ns),
            ("wall clock", 0, None)
        );
    }
}
