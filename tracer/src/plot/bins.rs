//! Calls binned into the picture's pixel columns: per API family, the calls and the time
//! spent in them per column; per process, the device bytes per column; per GPU (`--gpu`),
//! the time its work ran per column. Memory is fixed by the picture's width, whatever the
//! trace's length.

use crate::analysis::families::FAMILIES;

/// Lane of functions no family knows (a newer trace); drawn only when it has calls.
pub const OTHER_LANE: &str = "other";

/// Maps the trace clock onto `columns` columns from `t0` over `span_ns`.
#[derive(Clone, Copy, Debug)]
pub struct Columns {
    pub t0: u64,
    pub span_ns: u64,
    pub count: usize,
}

impl Columns {
    pub fn new(t0: u64, span_ns: u64, count: usize) -> Self {
        Columns {
            t0,
            span_ns: span_ns.max(1),
            count: count.max(1),
        }
    }

    /// The column holding `ts` (times outside the span go to the first or last).
    pub fn of(&self, ts: u64) -> usize {
        let offset = u128::from(ts.saturating_sub(self.t0));
        let column = offset * self.count as u128 / u128::from(self.span_ns);
        (column as usize).min(self.count - 1)
    }

    /// Where column `column` starts, on the trace clock.
    pub fn start(&self, column: usize) -> u64 {
        let offset = column as u128 * u128::from(self.span_ns) / self.count as u128;
        self.t0.saturating_add(offset as u64)
    }

    /// Nanoseconds in one column.
    pub fn width_ns(&self) -> f64 {
        self.span_ns as f64 / self.count as f64
    }
}

/// One API family's activity.
pub struct Lane {
    pub family: &'static str,
    pub calls: u64,
    /// Calls starting in each column.
    pub starts: Vec<u32>,
    /// Time in calls per column, from partly covered columns.
    busy_ns: Vec<u64>,
    /// Columns wholly inside calls, as a difference array (+1 where a run starts).
    covered: Vec<i64>,
}

impl Lane {
    fn new(family: &'static str, columns: usize) -> Self {
        Lane {
            family,
            calls: 0,
            starts: vec![0; columns],
            busy_ns: vec![0; columns],
            covered: vec![0; columns + 1],
        }
    }

    fn add(&mut self, columns: &Columns, ts: u64, dur: u64) {
        let end = ts.saturating_add(dur);
        let first = columns.of(ts);
        let last = columns.of(end);
        self.calls += 1;
        self.starts[first] = self.starts[first].saturating_add(1);
        if first == last {
            self.busy_ns[first] = self.busy_ns[first].saturating_add(dur);
            return;
        }
        // A long call: its ends partly, the columns between wholly.
        let first_end = columns.start(first + 1);
        self.busy_ns[first] = self.busy_ns[first].saturating_add(first_end.saturating_sub(ts));
        let last_start = columns.start(last);
        self.busy_ns[last] = self.busy_ns[last].saturating_add(end.saturating_sub(last_start));
        if last > first + 1 {
            self.covered[first + 1] += 1;
            self.covered[last] -= 1;
        }
    }

    /// The share of each column's time spent in this family's calls (more than 1 where
    /// threads overlap; callers clamp).
    pub fn busy_fractions(&self, columns: &Columns) -> Vec<f64> {
        let width = columns.width_ns();
        let mut covering: i64 = 0;
        (0..columns.count)
            .map(|column| {
                covering += self.covered[column];
                let busy = self.busy_ns[column] as f64 + covering.max(0) as f64 * width;
                busy / width
            })
            .collect()
    }
}

/// One process's device bytes per column.
pub struct MemoryCurve {
    pub pid: u32,
    /// The most held during each column (None: no change in it).
    pub max: Vec<Option<u64>>,
    /// The value at the end of each column.
    pub last: Vec<Option<u64>>,
}

impl MemoryCurve {
    /// The value drawn for each column: its maximum, else the value carried from before.
    pub fn levels(&self) -> Vec<u64> {
        let mut carried = 0;
        self.max
            .iter()
            .zip(&self.last)
            .map(|(max, last)| {
                let level = max.unwrap_or(carried);
                carried = last.unwrap_or(carried);
                level
            })
            .collect()
    }
}

/// One GPU's power (`--power`) per column: the mean of the samples in it.
pub struct PowerCurve {
    pub device: u32,
    sum_mw: Vec<u64>,
    samples: Vec<u32>,
}

impl PowerCurve {
    /// Watts per column; `None` where no sample fell.
    pub fn watts(&self) -> Vec<Option<f64>> {
        self.sum_mw
            .iter()
            .zip(&self.samples)
            .map(|(sum, n)| (*n > 0).then(|| *sum as f64 / f64::from(*n) / 1e3))
            .collect()
    }
}

/// GPUs whose power is drawn.
pub const POWER_CURVES: usize = 8;

pub struct Bins {
    pub columns: Columns,
    /// The families in lane order, then [`OTHER_LANE`].
    pub lanes: Vec<Lane>,
    pub memory: Vec<MemoryCurve>,
    /// `--power`: one power curve per device (NVML index), by index.
    pub power: Vec<PowerCurve>,
    /// `--gpu`: one lane per device (its kernels, copies and memsets), by device id.
    pub gpus: Vec<(u32, Lane)>,
}

/// The family name of GPU lanes (their colour).
pub const GPU_LANE: &str = "gpu";

impl Bins {
    /// Bins for the calls of `t0..t0 + span_ns`, with memory curves for `memory_pids`.
    pub fn new(columns: Columns, memory_pids: &[u32], gpus: &[u32]) -> Self {
        let mut lanes: Vec<Lane> = FAMILIES
            .iter()
            .map(|family| Lane::new(family, columns.count))
            .collect();
        lanes.push(Lane::new(OTHER_LANE, columns.count));
        Bins {
            columns,
            lanes,
            memory: memory_pids
                .iter()
                .map(|&pid| MemoryCurve {
                    pid,
                    max: vec![None; columns.count],
                    last: vec![None; columns.count],
                })
                .collect(),
            power: Vec::new(),
            gpus: gpus
                .iter()
                .map(|&device| (device, Lane::new(GPU_LANE, columns.count)))
                .collect(),
        }
    }

    /// Work that ran on GPU `device` from `ts` for `dur` ns.
    pub fn gpu(&mut self, device: u32, ts: u64, dur: u64) {
        if let Some((_, lane)) = self.gpus.iter_mut().find(|(d, _)| *d == device) {
            lane.add(&self.columns, ts, dur);
        }
    }

    /// GPU `device` drew `power_mw` at `ts` (samples outside the picture's span are left
    /// out, not piled into its first or last column).
    pub fn power(&mut self, device: u32, ts: u64, power_mw: u32) {
        let span_end = self.columns.t0.saturating_add(self.columns.span_ns);
        if ts < self.columns.t0 || ts > span_end {
            return;
        }
        let column = self.columns.of(ts);
        let at = match self
            .power
            .binary_search_by_key(&device, |curve| curve.device)
        {
            Ok(at) => at,
            Err(_) if self.power.len() >= POWER_CURVES => return,
            Err(at) => {
                let count = self.columns.count;
                self.power.insert(
                    at,
                    PowerCurve {
                        device,
                        sum_mw: vec![0; count],
                        samples: vec![0; count],
                    },
                );
                at
            }
        };
        let curve = &mut self.power[at];
        curve.sum_mw[column] += u64::from(power_mw);
        curve.samples[column] += 1;
    }

    pub fn call(&mut self, family: Option<&str>, ts: u64, dur: u64) {
        let lane = family
            .and_then(|family| FAMILIES.iter().position(|f| *f == family))
            .unwrap_or(FAMILIES.len());
        self.lanes[lane].add(&self.columns, ts, dur);
    }

    /// The process holds `bytes` of device memory from `ts` on.
    pub fn memory(&mut self, pid: u32, ts: u64, bytes: u64) {
        let column = self.columns.of(ts);
        if let Some(curve) = self.memory.iter_mut().find(|curve| curve.pid == pid) {
            let max = &mut curve.max[column];
            *max = Some(max.map_or(bytes, |m| m.max(bytes)));
            curve.last[column] = Some(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_split_the_span_evenly() {
        let columns = Columns::new(1000, 100, 10);
        assert_eq!(columns.of(999), 0);
        assert_eq!(columns.of(1000), 0);
        assert_eq!(columns.of(1019), 1);
        assert_eq!(columns.of(1100), 9, "the end belongs to the last column");
        assert_eq!(columns.of(u64::MAX), 9);
        assert_eq!(columns.start(3), 1030);
        assert_eq!(
            Columns::new(5, 0, 0).of(5),
            0,
            "empty spans do not divide by 0"
        );
    }

    #[test]
    fn busy_time_covers_long_calls_without_visiting_each_column() {
        let columns = Columns::new(0, 1000, 10);
        let mut bins = Bins::new(columns, &[], &[0]);
        bins.call(Some("sync"), 150, 700); // 150..850: half of 1, 2..7 whole, half of 8.
        bins.call(Some("sync"), 10, 20);
        bins.call(Some("cuNew"), 10, 20);
        let sync = &bins.lanes[7];
        assert_eq!((sync.family, sync.calls), ("sync", 2));
        let busy = sync.busy_fractions(&columns);
        let expected = [0.2, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0];
        for (got, want) in busy.iter().zip(expected) {
            assert!((got - want).abs() < 1e-9, "{busy:?}");
        }
        assert_eq!(sync.starts[0..3], [1, 1, 0]);
        assert_eq!(bins.lanes[9].family, OTHER_LANE);
        assert_eq!(bins.lanes[9].calls, 1);
        bins.gpu(0, 100, 300);
        bins.gpu(1, 100, 300);
        let gpu = bins.gpus[0].1.busy_fractions(&columns);
        assert_eq!((gpu[0], gpu[1], gpu[2], gpu[3]), (0.0, 1.0, 1.0, 1.0));
        assert_eq!(bins.gpus.len(), 1);
    }

    #[test]
    fn power_is_averaged_per_column_and_kept_inside_the_span() {
        let mut bins = Bins::new(Columns::new(1000, 100, 4), &[], &[]);
        bins.power(1, 1000, 100_000);
        bins.power(1, 1010, 200_000);
        bins.power(1, 1080, 50_000);
        bins.power(0, 1030, 70_000);
        bins.power(0, 999, 1);
        bins.power(0, 1101, 1);
        assert_eq!(
            bins.power.iter().map(|c| c.device).collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(bins.power[1].watts(), [Some(150.0), None, None, Some(50.0)]);
        assert_eq!(bins.power[0].watts(), [None, Some(70.0), None, None]);
    }

    #[test]
    fn memory_levels_keep_peaks_and_carry_values() {
        let mut bins = Bins::new(Columns::new(0, 100, 5), &[7], &[]);
        bins.memory(7, 5, 100);
        bins.memory(7, 6, 300);
        bins.memory(7, 7, 50);
        bins.memory(7, 65, 0);
        bins.memory(8, 65, 999);
        assert_eq!(bins.memory[0].levels(), [300, 50, 50, 0, 0]);
    }
}
