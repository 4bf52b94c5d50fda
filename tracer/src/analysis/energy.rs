//! Energy as a function of time, and how it is shared out: the pure arithmetic under
//! `--power`'s figures (docs/power.md says why each rule is what it is).
//!
//! - [`EnergySeries`]: a device's cumulative energy at its sample times, from NVML's
//!   counter or from integrating power ([`Integrator`], the trapezoid rule). Between two
//!   samples energy is interpolated linearly (power taken as constant over the interval);
//!   outside the samples nothing is known and nothing is counted.
//! - [`GpuTimeSplitter`] (`split_by_gpu_time` all at once, in the tests): each sample
//!   interval's energy shared over the GPU kernels that ran in it, by their share of the
//!   kernel time in it (`--gpu`).

use std::collections::{BTreeMap, HashMap};

/// mW × ns in mJ.
const MW_NS_PER_MJ: f64 = 1e9;

/// A device's cumulative energy (mJ, from an arbitrary origin) at increasing times.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnergySeries {
    points: Vec<(u64, f64)>,
}

impl EnergySeries {
    /// Adds the energy reading `mj` taken at `ts_ns`. Readings normally come in time
    /// order; one that does not is put in its place.
    pub fn push(&mut self, ts_ns: u64, mj: f64) {
        match self.points.last() {
            Some(&(last, _)) if ts_ns < last => {
                let at = self.points.partition_point(|&(t, _)| t <= ts_ns);
                self.points.insert(at, (ts_ns, mj));
            }
            _ => self.points.push((ts_ns, mj)),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    pub fn first_ts(&self) -> Option<u64> {
        self.points.first().map(|p| p.0)
    }

    pub fn last_ts(&self) -> Option<u64> {
        self.points.last().map(|p| p.0)
    }

    /// The sample times and readings, in time order.
    pub fn points(&self) -> &[(u64, f64)] {
        &self.points
    }

    /// Energy at `ts_ns`, interpolated linearly between the samples around it; clamped to
    /// the first and last readings outside them.
    pub fn at(&self, ts_ns: u64) -> Option<f64> {
        let (first, last) = (self.points.first()?, self.points.last()?);
        if ts_ns <= first.0 {
            return Some(first.1);
        }
        if ts_ns >= last.0 {
            return Some(last.1);
        }
        let after = self.points.partition_point(|&(t, _)| t <= ts_ns);
        let (t0, e0) = self.points[after - 1];
        let (t1, e1) = self.points[after];
        if t1 == t0 {
            return Some(e1);
        }
        let fraction = (ts_ns - t0) as f64 / (t1 - t0) as f64;
        Some(e0 + (e1 - e0) * fraction)
    }

    /// Energy (mJ) from `start_ns` to `end_ns`: only the part the samples cover counts.
    pub fn between(&self, start_ns: u64, end_ns: u64) -> f64 {
        if end_ns <= start_ns {
            return 0.0;
        }
        match (self.at(start_ns), self.at(end_ns)) {
            (Some(start), Some(end)) => end - start,
            _ => 0.0,
        }
    }

    /// How much of `start_ns..end_ns` lies between the first and last samples.
    pub fn covered_ns(&self, start_ns: u64, end_ns: u64) -> u64 {
        match (self.first_ts(), self.last_ts()) {
            (Some(first), Some(last)) => end_ns.min(last).saturating_sub(start_ns.max(first)),
            _ => 0,
        }
    }

    /// Energy from the first sample to the last.
    pub fn total(&self) -> f64 {
        match (self.points.first(), self.points.last()) {
            (Some(first), Some(last)) => last.1 - first.1,
            _ => 0.0,
        }
    }
}

/// Integrates power samples into energy by the trapezoid rule: between two samples the
/// power is taken to move linearly from one reading to the next.
#[derive(Clone, Copy, Debug, Default)]
pub struct Integrator {
    last: Option<(u64, u32)>,
    total_mj: f64,
}

impl Integrator {
    /// Adds a power reading; returns the energy (mJ) integrated since the first one.
    pub fn push(&mut self, ts_ns: u64, power_mw: u32) -> f64 {
        if let Some((t0, p0)) = self.last {
            let dt = ts_ns.saturating_sub(t0) as f64;
            self.total_mj += (f64::from(p0) + f64::from(power_mw)) / 2.0 * dt / MW_NS_PER_MJ;
        }
        if self.last.is_none_or(|(t0, _)| ts_ns >= t0) {
            self.last = Some((ts_ns, power_mw));
        }
        self.total_mj
    }
}

/// A GPU kernel's execution: from `--gpu`'s records (`gpu_kernel` lines).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInterval<'a> {
    pub start_ns: u64,
    pub end_ns: u64,
    pub name: &'a str,
    /// NVML's device index.
    pub device: u32,
}

/// What [`GpuTimeSplitter`] found for one kernel name.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KernelShare {
    pub energy_mj: f64,
    /// Kernel time inside the sampled span.
    pub gpu_ns: u64,
    pub kernels: u64,
}

/// The energy of the sampled spans, shared out over kernels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuTimeSplit {
    pub by_name: BTreeMap<String, KernelShare>,
    /// Energy of sample intervals in which no kernel ran.
    pub idle_mj: f64,
    /// Kernel time outside its device's samples (or on a device without samples, or whose
    /// device is not known): no energy is given for it.
    pub unsampled_ns: u64,
    /// Kernel time in intervals already shared out when the kernel came
    /// ([`GpuTimeSplitter`]): no energy is given for it.
    pub late_ns: u64,
}

/// Shares each sample interval's energy over the kernels that ran in it, by their share
/// of the kernel time in it: a kernel that ran `o` ns of an interval whose kernels ran
/// `B` ns in all (concurrent kernels each count their own time) gets `o / B` of the
/// interval's energy. An interval without kernels is idle. Every sampled millijoule goes
/// to a kernel or to idle: `sum(by_name) + idle == sum(series totals)`. All at once; the
/// summary streams the kernels through [`GpuTimeSplitter`], which this wraps.
#[cfg(test)]
pub fn split_by_gpu_time(
    series: &BTreeMap<u32, EnergySeries>,
    kernels: &[KernelInterval<'_>],
) -> GpuTimeSplit {
    let mut splitter = GpuTimeSplitter::new(series.clone(), u64::MAX);
    for kernel in kernels {
        splitter.kernel(kernel);
    }
    splitter.finish()
}

/// `split_by_gpu_time` fed one kernel at a time, in bounded memory: an interval's
/// energy is shared out once kernels that ended `hold_ns` after it have been seen on its
/// device (kernels come roughly in time order), and only the intervals still open hold
/// kernel time (per kernel name). A kernel's time in an interval already shared out gets
/// no energy and is counted in `late_ns`. With `hold_ns` at `u64::MAX` nothing is shared
/// out before [`Self::finish`]: the kernels may come in any order.
pub struct GpuTimeSplitter {
    devices: BTreeMap<u32, DeviceSplit>,
    hold_ns: u64,
    index: HashMap<String, usize>,
    names: Vec<String>,
    shares: Vec<KernelShare>,
    idle_mj: f64,
    unsampled_ns: u64,
    late_ns: u64,
}

struct DeviceSplit {
    series: EnergySeries,
    /// Kernel time per open interval (by its index): in all, and per kernel name.
    open: BTreeMap<usize, OpenInterval>,
    /// Intervals before this one are shared out.
    closed_before: usize,
    latest_end_ns: u64,
}

#[derive(Default)]
struct OpenInterval {
    busy_ns: u64,
    by_name: HashMap<usize, u64>,
}

impl GpuTimeSplitter {
    pub fn new(series: BTreeMap<u32, EnergySeries>, hold_ns: u64) -> Self {
        GpuTimeSplitter {
            devices: series
                .into_iter()
                .map(|(device, series)| {
                    let split = DeviceSplit {
                        series,
                        open: BTreeMap::new(),
                        closed_before: 0,
                        latest_end_ns: 0,
                    };
                    (device, split)
                })
                .collect(),
            hold_ns,
            index: HashMap::new(),
            names: Vec::new(),
            shares: Vec::new(),
            idle_mj: 0.0,
            unsampled_ns: 0,
            late_ns: 0,
        }
    }

    fn name(&mut self, name: &str) -> usize {
        if let Some(&at) = self.index.get(name) {
            return at;
        }
        self.names.push(name.to_owned());
        self.shares.push(KernelShare::default());
        self.index.insert(name.to_owned(), self.names.len() - 1);
        self.names.len() - 1
    }

    /// A kernel that ran on `kernel.device` (NVML's index).
    pub fn kernel(&mut self, kernel: &KernelInterval<'_>) {
        let name = self.name(kernel.name);
        let duration = kernel.end_ns.saturating_sub(kernel.start_ns);
        self.shares[name].kernels += 1;
        let Some(device) = self.devices.get_mut(&kernel.device) else {
            self.unsampled_ns += duration;
            return;
        };
        let (mut inside, mut late) = (0, 0);
        for_each_overlap(device.series.points(), kernel, |interval, overlap| {
            inside += overlap;
            if interval < device.closed_before {
                late += overlap;
                return;
            }
            let open = device.open.entry(interval).or_default();
            open.busy_ns += overlap;
            *open.by_name.entry(name).or_default() += overlap;
        });
        self.shares[name].gpu_ns += inside - late;
        self.late_ns += late;
        self.unsampled_ns += duration - inside;
        device.latest_end_ns = device.latest_end_ns.max(kernel.end_ns);
        let until = device.latest_end_ns.saturating_sub(self.hold_ns);
        let points = device.series.points();
        // Intervals that ended `hold_ns` before the latest kernel's end.
        let closing = points
            .partition_point(|&(t, _)| t <= until)
            .saturating_sub(1);
        Self::close(device, closing, &mut self.shares, &mut self.idle_mj);
    }

    /// A kernel that cannot be placed on a sampled GPU (its GPU is not known): counted,
    /// without energy.
    pub fn unplaced(&mut self, name: &str, duration_ns: u64) {
        let name = self.name(name);
        self.shares[name].kernels += 1;
        self.unsampled_ns += duration_ns;
    }

    /// Shares out the device's intervals before `until` (an interval index).
    fn close(
        device: &mut DeviceSplit,
        until: usize,
        shares: &mut [KernelShare],
        idle_mj: &mut f64,
    ) {
        let points = device.series.points();
        for interval in device.closed_before..until {
            let interval_mj = points[interval + 1].1 - points[interval].1;
            match device.open.remove(&interval) {
                Some(open) if open.busy_ns > 0 => {
                    for (name, overlap) in open.by_name {
                        shares[name].energy_mj +=
                            interval_mj * overlap as f64 / open.busy_ns as f64;
                    }
                }
                _ => *idle_mj += interval_mj,
            }
        }
        device.closed_before = device.closed_before.max(until);
    }

    pub fn finish(mut self) -> GpuTimeSplit {
        for device in self.devices.values_mut() {
            let intervals = device.series.points().len().saturating_sub(1);
            Self::close(device, intervals, &mut self.shares, &mut self.idle_mj);
        }
        GpuTimeSplit {
            by_name: self.names.into_iter().zip(self.shares).collect(),
            idle_mj: self.idle_mj,
            unsampled_ns: self.unsampled_ns,
            late_ns: self.late_ns,
        }
    }
}

/// Calls `f(interval, overlap_ns)` for each sample interval the kernel overlaps.
fn for_each_overlap(
    points: &[(u64, f64)],
    kernel: &KernelInterval<'_>,
    mut f: impl FnMut(usize, u64),
) {
    if points.len() < 2 || kernel.end_ns <= kernel.start_ns {
        return;
    }
    // The interval holding the kernel's start (or the first one).
    let mut interval = points
        .partition_point(|&(t, _)| t <= kernel.start_ns)
        .saturating_sub(1);
    while interval + 1 < points.len() && points[interval].0 < kernel.end_ns {
        let (t0, t1) = (points[interval].0, points[interval + 1].0);
        let overlap = kernel
            .end_ns
            .min(t1)
            .saturating_sub(kernel.start_ns.max(t0));
        if overlap > 0 {
            f(interval, overlap);
        }
        interval += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(points: &[(u64, f64)]) -> EnergySeries {
        let mut series = EnergySeries::default();
        for &(ts, mj) in points {
            series.push(ts, mj);
        }
        series
    }

    #[test]
    fn energy_is_interpolated_between_samples_and_clamped_outside() {
        // 100 W from 1 s to 2 s, then 300 W to 3 s (mJ since an arbitrary origin).
        let s = series(&[
            (1_000_000_000, 5000.0),
            (2_000_000_000, 105_000.0),
            (3_000_000_000, 405_000.0),
        ]);
        assert_eq!(s.at(500_000_000), Some(5000.0));
        assert_eq!(s.at(1_500_000_000), Some(55_000.0));
        assert_eq!(s.at(2_250_000_000), Some(180_000.0));
        assert_eq!(s.at(9_000_000_000), Some(405_000.0));
        assert_eq!(s.between(1_500_000_000, 2_250_000_000), 125_000.0);
        // Half outside: only the covered half counts.
        assert_eq!(s.between(500_000_000, 1_500_000_000), 50_000.0);
        assert_eq!(s.covered_ns(500_000_000, 1_500_000_000), 500_000_000);
        assert_eq!(s.covered_ns(3_500_000_000, 4_000_000_000), 0);
        assert_eq!(s.between(2_000_000_000, 1_000_000_000), 0.0);
        assert_eq!(s.total(), 400_000.0);
        assert_eq!(EnergySeries::default().at(5), None);
    }

    #[test]
    fn a_reading_out_of_order_is_put_in_its_place() {
        let s = series(&[(10, 1.0), (30, 3.0), (20, 2.0), (40, 4.0)]);
        assert_eq!(s.points(), [(10, 1.0), (20, 2.0), (30, 3.0), (40, 4.0)]);
        assert_eq!(s.at(25), Some(2.5));
    }

    #[test]
    fn the_trapezoid_rule_is_exact_for_constant_and_linear_power() {
        let mut integrator = Integrator::default();
        assert_eq!(integrator.push(1_000_000_000, 100_000), 0.0);
        // 100 W for 20 ms: 2 J.
        assert_eq!(integrator.push(1_020_000_000, 100_000), 2000.0);
        // 100 W rising to 300 W over 10 ms: 2 J more.
        assert_eq!(integrator.push(1_030_000_000, 300_000), 4000.0);
    }

    fn kernel(start_ns: u64, end_ns: u64, name: &str, device: u32) -> KernelInterval<'_> {
        KernelInterval {
            start_ns,
            end_ns,
            name,
            device,
        }
    }

    #[test]
    fn each_interval_is_shared_by_kernel_time() {
        // Device 0: three 10 ms intervals of 1000, 2000 and 600 mJ.
        let mut devices = BTreeMap::new();
        devices.insert(
            0,
            series(&[
                (0, 0.0),
                (10_000_000, 1000.0),
                (20_000_000, 3000.0),
                (30_000_000, 3600.0),
            ]),
        );
        let kernels = [
            // 2 ms in the first interval.
            kernel(1_000_000, 3_000_000, "a", 0),
            // 6 ms in the first interval and 4 ms in the second.
            kernel(4_000_000, 14_000_000, "b", 0),
            // Concurrent with b in the second: 4 ms of it.
            kernel(10_000_000, 14_000_000, "a", 0),
            // Another device, without samples: no energy.
            kernel(0, 5_000_000, "c", 1),
            // Half outside the samples.
            kernel(25_000_000, 35_000_000, "d", 0),
        ];
        let split = split_by_gpu_time(&devices, &kernels);
        // Interval 1: a 2 ms, b 6 ms of 8 ms -> 250 and 750 mJ. Interval 2: b 4, a 4 ->
        // 1000 each. Interval 3: only d -> 600 mJ.
        assert_eq!(
            split.by_name["a"],
            KernelShare {
                energy_mj: 1250.0,
                gpu_ns: 6_000_000,
                kernels: 2
            }
        );
        assert_eq!(
            split.by_name["b"],
            KernelShare {
                energy_mj: 1750.0,
                gpu_ns: 10_000_000,
                kernels: 1
            }
        );
        assert_eq!(
            split.by_name["d"],
            KernelShare {
                energy_mj: 600.0,
                gpu_ns: 5_000_000,
                kernels: 1
            }
        );
        assert_eq!(
            split.by_name["c"],
            KernelShare {
                energy_mj: 0.0,
                gpu_ns: 0,
                kernels: 1
            }
        );
        assert_eq!(split.idle_mj, 0.0);
        assert_eq!(split.unsampled_ns, 5_000_000 + 5_000_000);
    }

    #[test]
    fn streamed_intervals_are_shared_out_behind_the_hold_and_late_time_is_counted() {
        // Three intervals of 100, 200 and 300 mJ; shared out 5 ns behind the latest
        // kernel's end.
        let mut devices = BTreeMap::new();
        devices.insert(
            0,
            series(&[(0, 0.0), (10, 100.0), (20, 300.0), (30, 600.0)]),
        );
        let mut splitter = GpuTimeSplitter::new(devices, 5);
        // Ends at 18: interval 0 (to 10) is shared out, idle.
        splitter.kernel(&kernel(12, 18, "a", 0));
        // Ends at 28: interval 1 (to 20) goes to a, alone in it.
        splitter.kernel(&kernel(25, 28, "b", 0));
        // In intervals 0 and 1, both shared out: 10 ns late, no energy.
        splitter.kernel(&kernel(5, 15, "c", 0));
        // No samples for device 3; nothing known about the other.
        splitter.kernel(&kernel(0, 4, "c", 3));
        splitter.unplaced("d", 7);
        let split = splitter.finish();
        let energy = |name: &str| split.by_name[name].energy_mj;
        assert_eq!((energy("a"), energy("b"), energy("c")), (200.0, 300.0, 0.0));
        assert_eq!(split.by_name["c"].kernels, 2);
        assert_eq!(split.by_name["c"].gpu_ns, 0);
        assert_eq!(split.by_name["d"].kernels, 1);
        assert_eq!(split.idle_mj, 100.0);
        assert_eq!((split.late_ns, split.unsampled_ns), (10, 4 + 7));
    }

    #[test]
    fn kernels_in_order_stream_to_the_same_split_as_all_at_once() {
        let mut devices = BTreeMap::new();
        devices.insert(0, series(&[(0, 0.0), (10, 70.0), (20, 100.0), (30, 130.0)]));
        let kernels = [
            kernel(1, 4, "k", 0),
            kernel(3, 12, "m", 0),
            kernel(12, 14, "k", 0),
            kernel(29, 40, "m", 0),
        ];
        let mut splitter = GpuTimeSplitter::new(devices.clone(), 1);
        for kernel in &kernels {
            splitter.kernel(kernel);
        }
        let streamed = splitter.finish();
        assert_eq!(streamed, split_by_gpu_time(&devices, &kernels));
        assert_eq!(streamed.late_ns, 0);
        // 70 mJ: k 3 of 10 ns, m 7; 30: m 2 of 4, k 2; 30: m alone.
        assert_eq!(streamed.by_name["k"].energy_mj, 21.0 + 15.0);
        assert_eq!(streamed.by_name["m"].energy_mj, 49.0 + 15.0 + 30.0);
        assert_eq!(streamed.unsampled_ns, 10);
    }

    #[test]
    fn intervals_without_kernels_are_idle_and_nothing_is_lost() {
        let mut devices = BTreeMap::new();
        devices.insert(0, series(&[(0, 0.0), (10, 70.0), (20, 100.0), (30, 130.0)]));
        devices.insert(2, series(&[(0, 0.0), (10, 5.0)]));
        let kernels = [
            kernel(12, 14, "k", 0),
            kernel(3, 4, "k", 2),
            kernel(4, 5, "m", 2),
        ];
        let split = split_by_gpu_time(&devices, &kernels);
        assert_eq!(split.by_name["k"].energy_mj, 30.0 + 2.5);
        assert_eq!(split.by_name["m"].energy_mj, 2.5);
        assert_eq!(split.idle_mj, 70.0 + 30.0);
        let attributed: f64 = split.by_name.values().map(|k| k.energy_mj).sum();
        assert_eq!(attributed + split.idle_mj, 130.0 + 5.0);
    }
}
