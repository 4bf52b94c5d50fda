//! Sets of time intervals: a GPU's busy time, its compute kernels, and how much of a
//! collective they overlap.

/// Half-open `[start, end)` intervals, merged as they come when they come in order (GPU
/// work mostly does), fully by [`Intervals::normalize`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Intervals {
    spans: Vec<(u64, u64)>,
    sorted: bool,
}

impl Intervals {
    pub fn push(&mut self, start: u64, end: u64) {
        if end <= start {
            return;
        }
        if let Some(last) = self.spans.last_mut() {
            if start >= last.0 && start <= last.1 {
                last.1 = last.1.max(end);
                return;
            }
            if start < last.0 {
                self.sorted = false;
            }
        }
        self.spans.push((start, end));
    }

    /// Sorted and disjoint from here on.
    pub fn normalize(&mut self) {
        if !self.sorted {
            self.spans.sort_unstable();
        }
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.spans.len());
        for &(start, end) in &self.spans {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        self.spans = merged;
        self.sorted = true;
    }

    /// Time covered (normalized).
    pub fn total(&self) -> u64 {
        self.spans.iter().map(|(start, end)| end - start).sum()
    }

    /// The first start and the last end (normalized).
    pub fn span(&self) -> Option<(u64, u64)> {
        Some((self.spans.first()?.0, self.spans.last()?.1))
    }

    /// Time of `[start, end)` covered (normalized).
    pub fn covered(&self, start: u64, end: u64) -> u64 {
        let first = self.spans.partition_point(|span| span.1 <= start);
        self.spans[first..]
            .iter()
            .take_while(|span| span.0 < end)
            .map(|span| span.1.min(end).saturating_sub(span.0.max(start)))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_merge_and_measure_what_they_cover() {
        let mut set = Intervals::default();
        for (start, end) in [(10, 20), (15, 30), (40, 50), (5, 8), (50, 55), (60, 60)] {
            set.push(start, end);
        }
        set.normalize();
        assert_eq!(set.spans, [(5, 8), (10, 30), (40, 55)]);
        assert_eq!(set.total(), 3 + 20 + 15);
        assert_eq!(set.span(), Some((5, 55)));
        assert_eq!(set.covered(0, 100), 38);
        assert_eq!(set.covered(25, 45), 5 + 5);
        assert_eq!(set.covered(30, 40), 0);
    }
}
