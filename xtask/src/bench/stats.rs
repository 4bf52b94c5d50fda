//! Median, minimum and maximum of a part's repeated runs.

use serde::{Deserialize, Serialize};

/// The median [min-max] of some runs' figures, and the figures themselves.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Stats {
    /// `None` (JSON null) where no figure was finite.
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// How many figures were finite.
    pub n: usize,
    /// Every figure, in run order (a non-finite one as null); left out where none is finite.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Option<f64>>>,
}

impl Stats {
    pub fn of(values: &[f64]) -> Self {
        let mut finite: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if finite.is_empty() {
            return Stats {
                median: None,
                min: None,
                max: None,
                n: 0,
                values: None,
            };
        }
        finite.sort_by(f64::total_cmp);
        let n = finite.len();
        let median = if n % 2 == 1 {
            finite[n / 2]
        } else {
            (finite[n / 2 - 1] + finite[n / 2]) / 2.0
        };
        Stats {
            median: Some(median),
            min: Some(finite[0]),
            max: Some(finite[n - 1]),
            n,
            values: Some(values.iter().map(|&v| v.is_finite().then_some(v)).collect()),
        }
    }

    /// `median [min-max]` with `digits` decimals.
    pub fn spread(&self, digits: usize) -> String {
        let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
        format!(
            "{:.*} [{:.*}-{:.*}]",
            digits,
            nan(self.median),
            digits,
            nan(self.min),
            digits,
            nan(self.max)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_give_median_and_spread() {
        let s = Stats::of(&[3.0, 1.0, 2.0, 10.0]);
        assert_eq!(s.median, Some(2.5));
        assert_eq!(s.min, Some(1.0));
        assert_eq!(s.max, Some(10.0));
        assert_eq!(s.n, 4);
        assert_eq!(s.spread(1), "2.5 [1.0-10.0]");
    }

    #[test]
    fn non_finite_figures_are_left_out_of_the_median_but_kept_in_order() {
        let s = Stats::of(&[f64::NAN, 4.0, 2.0]);
        assert_eq!((s.median, s.n), (Some(3.0), 2));
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"median":3.0,"min":2.0,"max":4.0,"n":2,"values":[null,4.0,2.0]}"#
        );
        let none = Stats::of(&[f64::INFINITY]);
        assert_eq!(
            serde_json::to_string(&none).unwrap(),
            r#"{"median":null,"min":null,"max":null,"n":0}"#
        );
        assert_eq!(none.spread(2), "NaN [NaN-NaN]");
    }
}
