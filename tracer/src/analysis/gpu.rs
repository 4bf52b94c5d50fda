//! What the GPU did, from `--gpu` lines (docs/gpu.md, "The figures", says how each is
//! computed):
//!
//! - **GPU time per kernel name**: count, total, mean, p50, p99, max of `dur_ns`, and the
//!   total's share of the GPU's busy time;
//! - **busy time** per device: the union of the intervals `[ts_ns, ts_ns + dur_ns)` of its
//!   kernels, copies and memsets (overlapping work counts once), and its share of the run;
//! - **idle gaps** per device: the largest spaces between busy intervals, from the first
//!   work to the last (what the CPU did then is found by a second pass,
//!   `gpu_context.rs`);
//! - **launch-to-start delay**: `queued_ns`, from the end of the issuing call to the GPU
//!   start;
//! - **copy bandwidth**: bytes / GPU time, per direction.
//!
//! Lines come in the trace's order, which for GPU work is roughly completion order. The
//! union keeps the latest [`MAX_OPEN`] disjoint intervals per device open to merge with; the
//! oldest close as newer ones come. Work that starts before the closed part (more than that
//! many intervals out of order) counts from the closed end only, and the part cut off is
//! reported (`late_ns`). Memory is bounded by that and the number of kernel names.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap, HashMap},
};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::gpu_graphs::{GraphAccumulator, GraphTime};
use crate::schema::{CallLine, GpuErrorLine, GpuGapLine, GpuInfoLine, GpuLine, IssuingCalls};

/// Disjoint busy intervals kept open per device.
pub const MAX_OPEN: usize = 1 << 18;
/// Idle gaps listed per device.
pub const MAX_GAPS: usize = 5;
/// `gpu_info` and `gpu_error` lines kept for the report.
const MAX_STATUS_LINES: usize = 64;
/// Longest duration the histograms resolve (about 13 days); maxima stay exact.
const MAX_TRACKED_NS: u64 = 1 << 50;

/// The union of intervals arriving roughly in order (see the module's doc).
#[derive(Debug, Default)]
pub struct IntervalUnion {
    /// Disjoint, non-touching intervals: start -> end.
    open: BTreeMap<u64, u64>,
    /// The end of the last closed interval: nothing before it changes any more.
    frontier: Option<u64>,
    /// Work time cut off because it started before `frontier`.
    pub late_ns: u64,
}

impl IntervalUnion {
    /// Adds `[start, end)`; intervals that close go to `closed`, in time order.
    pub fn insert(&mut self, start: u64, end: u64, closed: &mut impl FnMut(u64, u64)) {
        let mut start = start;
        let mut end = end;
        if let Some(frontier) = self.frontier
            && start < frontier
        {
            self.late_ns += end.min(frontier) - start;
            start = frontier;
        }
        if end <= start {
            return;
        }
        if let Some((&before, &before_end)) = self.open.range(..=start).next_back()
            && before_end >= start
        {
            self.open.remove(&before);
            start = before;
            end = end.max(before_end);
        }
        while let Some((&next, &next_end)) = self.open.range(start..).next() {
            if next > end {
                break;
            }
            self.open.remove(&next);
            end = end.max(next_end);
        }
        self.open.insert(start, end);
        while self.open.len() > MAX_OPEN {
            self.close_first(closed);
        }
    }

    fn close_first(&mut self, closed: &mut impl FnMut(u64, u64)) {
        if let Some((start, end)) = self.open.pop_first() {
            self.frontier = Some(end);
            closed(start, end);
        }
    }

    /// Closes every interval.
    pub fn finish(&mut self, closed: &mut impl FnMut(u64, u64)) {
        while !self.open.is_empty() {
            self.close_first(closed);
        }
    }
}

/// The largest gaps offered, at most [`MAX_GAPS`].
#[derive(Debug, Default)]
struct TopGaps(BinaryHeap<Reverse<(u64, u64)>>);

impl TopGaps {
    fn offer(&mut self, start: u64, duration: u64) {
        if duration == 0 {
            return;
        }
        self.0.push(Reverse((duration, start)));
        if self.0.len() > MAX_GAPS {
            self.0.pop();
        }
    }

    /// Longest first (the earlier of equal ones first).
    fn sorted(&self) -> Vec<(u64, u64)> {
        let mut gaps: Vec<(u64, u64)> = self.0.iter().map(|Reverse(gap)| *gap).collect();
        gaps.sort_by_key(|&(duration, start)| (Reverse(duration), start));
        gaps
    }
}

/// One device's busy time as intervals close.
#[derive(Debug, Default)]
struct Busy {
    busy_ns: u64,
    first_ns: Option<u64>,
    last_end_ns: Option<u64>,
    gaps: TopGaps,
}

impl Busy {
    fn closed(&mut self, start: u64, end: u64) {
        self.busy_ns += end - start;
        self.first_ns.get_or_insert(start);
        if let Some(last) = self.last_end_ns {
            self.gaps.offer(last, start.saturating_sub(last));
        }
        self.last_end_ns = Some(end);
    }
}

#[derive(Default)]
struct Device {
    union: IntervalUnion,
    busy: Busy,
    work: u64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is a valid precision")
}

fn record(histogram: &mut Histogram<u64>, value: u64) {
    let value = value.min(MAX_TRACKED_NS);
    if histogram.record(value).is_err() {
        histogram.saturating_record(value);
    }
}

struct KernelStats {
    mangled: Option<String>,
    count: u64,
    total_ns: u64,
    max_ns: u64,
    durations: Histogram<u64>,
}

#[derive(Default)]
struct TransferStats {
    count: u64,
    bytes: u64,
    gpu_ns: u64,
}

/// Fed every `--gpu` line, in trace order.
#[derive(Default)]
pub struct GpuAccumulator {
    kernels: HashMap<String, KernelStats>,
    copies: BTreeMap<String, TransferStats>,
    memsets: TransferStats,
    devices: BTreeMap<u32, Device>,
    queued: Option<Histogram<u64>>,
    queued_count: u64,
    queued_max: u64,
    started_before_return: u64,
    kernel_lines: u64,
    copy_lines: u64,
    memset_lines: u64,
    linked: u64,
    unlinked: u64,
    untimed: u64,
    first_ns: Option<u64>,
    last_end_ns: u64,
    infos: Vec<GpuInfoLine>,
    errors: Vec<GpuErrorLine>,
    error_lines: u64,
    fatal_errors: u64,
    gaps: Vec<GpuGapLine>,
    gap_lines: u64,
    gap_calls: u64,
    graphs: GraphAccumulator,
    name_mismatches: u64,
    captured_calls: u64,
}

impl GpuAccumulator {
    /// A call line: launches, copies and memsets made during a stream capture.
    pub fn call(&mut self, record: &CallLine) {
        self.captured_calls += u64::from(record.captured.is_some());
    }

    pub fn observe(&mut self, line: &GpuLine) {
        match line {
            GpuLine::Gap(gap) => {
                self.gap_lines += 1;
                self.gap_calls += gap.calls + gap.handed_over;
                if self.gaps.len() < MAX_STATUS_LINES {
                    self.gaps.push(gap.clone());
                }
                return;
            }
            GpuLine::Info(info) => {
                if self.infos.len() < MAX_STATUS_LINES {
                    self.infos.push(info.clone());
                }
                return;
            }
            GpuLine::Error(error) => {
                self.error_lines += 1;
                self.fatal_errors += u64::from(error.fatal);
                if self.errors.len() < MAX_STATUS_LINES {
                    self.errors.push(error.clone());
                }
                return;
            }
            GpuLine::Kernel(_) | GpuLine::Copy(_) | GpuLine::Memset(_) => {}
        }
        let Some(work) = line.work() else { return };
        match work.link.call() {
            Some(_) => self.linked += 1,
            None => self.unlinked += 1,
        }
        self.graphs.observe(line);
        if let GpuLine::Kernel(kernel) = line {
            self.name_mismatches += u64::from(kernel.cupti_kernel.is_some());
        }
        match line {
            GpuLine::Kernel(_) => self.kernel_lines += 1,
            GpuLine::Copy(_) => self.copy_lines += 1,
            _ => self.memset_lines += 1,
        }
        if !work.link.timed() {
            self.untimed += 1;
            return;
        }
        let end = work.ts_ns.saturating_add(work.dur_ns);
        self.first_ns = Some(self.first_ns.map_or(work.ts_ns, |f| f.min(work.ts_ns)));
        self.last_end_ns = self.last_end_ns.max(end);
        if let Some(queued) = work.link.queued_ns {
            let histogram = self.queued.get_or_insert_with(histogram);
            record(histogram, queued.max(0) as u64);
            self.queued_count += 1;
            self.queued_max = self.queued_max.max(queued.max(0) as u64);
            self.started_before_return += u64::from(queued < 0);
        }
        let device = self.devices.entry(work.device).or_default();
        device.work += 1;
        let Device { union, busy, .. } = device;
        union.insert(work.ts_ns, end, &mut |s, e| busy.closed(s, e));
        match line {
            GpuLine::Kernel(kernel) => {
                let stats = match self.kernels.get_mut(&kernel.kernel) {
                    Some(stats) => stats,
                    None => self
                        .kernels
                        .entry(kernel.kernel.clone())
                        .or_insert_with(|| KernelStats {
                            mangled: kernel.kernel_mangled.clone(),
                            count: 0,
                            total_ns: 0,
                            max_ns: 0,
                            durations: histogram(),
                        }),
                };
                stats.count += 1;
                stats.total_ns = stats.total_ns.saturating_add(kernel.dur_ns);
                stats.max_ns = stats.max_ns.max(kernel.dur_ns);
                record(&mut stats.durations, kernel.dur_ns);
            }
            GpuLine::Copy(copy) => {
                let stats = match self.copies.get_mut(copy.kind.as_ref()) {
                    Some(stats) => stats,
                    None => self.copies.entry(copy.kind.to_string()).or_default(),
                };
                stats.count += 1;
                stats.bytes = stats.bytes.saturating_add(copy.bytes);
                stats.gpu_ns = stats.gpu_ns.saturating_add(copy.dur_ns);
            }
            GpuLine::Memset(memset) => {
                self.memsets.count += 1;
                self.memsets.bytes = self.memsets.bytes.saturating_add(memset.bytes);
                self.memsets.gpu_ns = self.memsets.gpu_ns.saturating_add(memset.dur_ns);
            }
            GpuLine::Info(_) | GpuLine::Error(_) | GpuLine::Gap(_) => {}
        }
    }

    /// The figures; `run` is the run's extent on the trace clock (first call or work, end
    /// of the last), the denominator of busy shares.
    pub fn finish(mut self, calls_first_ns: Option<u64>, calls_end_ns: u64) -> GpuSummary {
        let work = self.kernel_lines + self.copy_lines + self.memset_lines;
        let run_start = match (calls_first_ns, self.first_ns) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(0),
        };
        let run_end = calls_end_ns.max(self.last_end_ns);
        let run_ns = run_end.saturating_sub(run_start);
        let mut busy_total = 0;
        let devices: Vec<DeviceBusy> = std::mem::take(&mut self.devices)
            .into_iter()
            .map(|(device, mut state)| {
                let Device { union, busy, .. } = &mut state;
                union.finish(&mut |s, e| busy.closed(s, e));
                busy_total += busy.busy_ns;
                DeviceBusy {
                    device,
                    work: state.work,
                    busy_ns: state.busy.busy_ns,
                    first_ns: state.busy.first_ns.unwrap_or(0),
                    last_end_ns: state.busy.last_end_ns.unwrap_or(0),
                    share_of_run: ratio(state.busy.busy_ns, run_ns),
                    late_ns: state.union.late_ns,
                    gaps: state
                        .busy
                        .gaps
                        .sorted()
                        .into_iter()
                        .map(|(duration_ns, start_ns)| IdleGap {
                            device,
                            start_ns,
                            duration_ns,
                            cpu: None,
                        })
                        .collect(),
                }
            })
            .collect();
        let mut kernels: Vec<KernelTime> = self
            .kernels
            .into_iter()
            .map(|(kernel, stats)| KernelTime {
                count: stats.count,
                total_ns: stats.total_ns,
                mean_ns: stats.total_ns / stats.count.max(1),
                p50_ns: stats.durations.value_at_quantile(0.5).min(stats.max_ns),
                p99_ns: stats.durations.value_at_quantile(0.99).min(stats.max_ns),
                max_ns: stats.max_ns,
                share_of_busy: ratio(stats.total_ns, busy_total),
                kernel_mangled: stats.mangled,
                kernel,
            })
            .collect();
        kernels.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.kernel.cmp(&b.kernel)));
        let transfer = |kind: String, stats: &TransferStats| TransferTime {
            kind,
            count: stats.count,
            bytes: stats.bytes,
            gpu_ns: stats.gpu_ns,
            bandwidth_gb_s: (stats.gpu_ns > 0).then(|| stats.bytes as f64 / stats.gpu_ns as f64),
        };
        GpuSummary {
            work,
            kernels: self.kernel_lines,
            copies: self.copy_lines,
            memsets: self.memset_lines,
            linked: self.linked,
            unlinked: self.unlinked,
            untimed: self.untimed,
            run_start_ns: run_start,
            run_ns,
            busy_ns: busy_total,
            devices,
            kernel_time: kernels,
            copy_time: self
                .copies
                .iter()
                .map(|(kind, stats)| transfer(kind.clone(), stats))
                .collect(),
            memset_time: (self.memsets.count > 0).then(|| transfer("memset".into(), &self.memsets)),
            queued: self.queued.map(|histogram| QueueDelay {
                count: self.queued_count,
                p50_ns: histogram.value_at_quantile(0.5).min(self.queued_max),
                p99_ns: histogram.value_at_quantile(0.99).min(self.queued_max),
                max_ns: self.queued_max,
                started_before_return: self.started_before_return,
            }),
            processes: self.infos,
            errors: self.errors,
            error_lines: self.error_lines,
            fatal_errors: self.fatal_errors,
            gaps: self.gaps,
            gap_lines: self.gap_lines,
            gap_calls: self.gap_calls,
            graphs: self.graphs.finish(),
            name_mismatches: self.name_mismatches,
            captured_calls: self.captured_calls,
            issuing: None,
        }
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// `cudatrace summary`'s `gpu` section.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuSummary {
    /// Kernel, copy and memset lines.
    pub work: u64,
    pub kernels: u64,
    pub copies: u64,
    pub memsets: u64,
    /// Work lines linked to their call, and not.
    pub linked: u64,
    pub unlinked: u64,
    /// Work lines without GPU times (left out of every time figure).
    pub untimed: u64,
    /// The run: from the first call or work to the end of the last (busy shares' base).
    pub run_start_ns: u64,
    pub run_ns: u64,
    /// Busy time, summed over devices.
    pub busy_ns: u64,
    pub devices: Vec<DeviceBusy>,
    /// By total GPU time, longest first.
    pub kernel_time: Vec<KernelTime>,
    /// Copies by direction.
    pub copy_time: Vec<TransferTime>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memset_time: Option<TransferTime>,
    /// Launch-to-start delay (`queued_ns`), negatives counted as 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued: Option<QueueDelay>,
    /// Recording starts (`gpu_info`) and failures (`gpu_error`), the first 64 of each.
    pub processes: Vec<GpuInfoLine>,
    pub errors: Vec<GpuErrorLine>,
    pub error_lines: u64,
    pub fatal_errors: u64,
    /// Times another CUPTI client held the activity API (`gpu_gap`), the first 64, and
    /// the calls whose work it kept from being recorded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<GpuGapLine>,
    #[serde(skip_serializing_if = "is_zero")]
    pub gap_lines: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub gap_calls: u64,
    /// CUDA graphs: replays, kernels and GPU time per replay.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub graphs: Vec<GraphTime>,
    /// Kernel lines whose CUPTI name differs from their launch's (`cupti_kernel`).
    #[serde(skip_serializing_if = "is_zero")]
    pub name_mismatches: u64,
    /// Launches, copies and memsets made during a stream capture (`captured`).
    #[serde(skip_serializing_if = "is_zero")]
    pub captured_calls: u64,
    /// What became of every launch, copy and memset (the footer's `gpu.issuing`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub issuing: Option<IssuingCalls>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceBusy {
    /// CUPTI's device id in the processes that used it.
    pub device: u32,
    /// Kernels, copies and memsets with times.
    pub work: u64,
    /// The union of their intervals.
    pub busy_ns: u64,
    /// Start of its first work, end of its last.
    pub first_ns: u64,
    pub last_end_ns: u64,
    /// `busy_ns` / the run's length.
    pub share_of_run: f64,
    /// Work time left out of the union because it came too far out of order.
    pub late_ns: u64,
    /// The largest idle gaps between its first and last work, longest first.
    pub gaps: Vec<IdleGap>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IdleGap {
    pub device: u32,
    /// The end of the work before it.
    pub start_ns: u64,
    pub duration_ns: u64,
    /// What the CPU was doing (the summary's second pass).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<GapCpu>,
}

/// What the traced processes' threads did in an idle gap.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GapCpu {
    /// Calls that overlap the gap.
    pub calls: u64,
    /// Their time inside the gap, summed over threads.
    pub in_calls_ns: u64,
    /// By time inside the gap, the most first (at most 5).
    pub functions: Vec<GapFunction>,
    /// The stage each process with calls was in at the gap's middle: `pid: stage`.
    pub stages: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GapFunction {
    pub name: String,
    pub calls: u64,
    pub in_gap_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelTime {
    pub kernel: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_mangled: Option<String>,
    pub count: u64,
    pub total_ns: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// `total_ns` / the busy time of all devices (overlapping kernels can add up to more
    /// than 1).
    pub share_of_busy: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TransferTime {
    /// The copy direction, or `memset`.
    pub kind: String,
    pub count: u64,
    pub bytes: u64,
    pub gpu_ns: u64,
    /// bytes / GPU time (GB/s = bytes per ns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth_gb_s: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueDelay {
    pub count: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// Work that started before its call returned (`queued_ns` < 0).
    pub started_before_return: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{GpuCopyLine, GpuKernelLine, GpuLink};

    fn union_of(intervals: &[(u64, u64)]) -> (Vec<(u64, u64)>, u64) {
        let mut union = IntervalUnion::default();
        let mut closed = Vec::new();
        for &(s, e) in intervals {
            union.insert(s, e, &mut |a, b| closed.push((a, b)));
        }
        union.finish(&mut |a, b| closed.push((a, b)));
        (closed, union.late_ns)
    }

    #[test]
    fn the_union_merges_overlaps_in_any_order() {
        assert_eq!(
            union_of(&[
                (10, 20),
                (30, 40),
                (15, 35),
                (50, 60),
                (60, 70),
                (0, 5),
                (45, 45)
            ]),
            (vec![(0, 5), (10, 40), (50, 70)], 0)
        );
        assert_eq!(
            union_of(&[(10, 100), (20, 30), (5, 12)]),
            (vec![(5, 100)], 0)
        );
    }

    #[test]
    fn work_older_than_the_open_intervals_is_cut_and_reported() {
        let mut intervals: Vec<(u64, u64)> = (0..=MAX_OPEN as u64)
            .map(|i| (i * 10 + 100, i * 10 + 105))
            .collect();
        // Closed: the first interval (100, 105). Then work from 90 to 103.
        intervals.push((90, 103));
        let (closed, late) = union_of(&intervals);
        assert_eq!(late, 13);
        assert_eq!(closed[0], (100, 105));
        assert_eq!(closed.len(), MAX_OPEN + 1);
    }

    fn kernel(name: &str, ts_ns: u64, dur_ns: u64, queued: i64) -> GpuLine {
        GpuLine::Kernel(GpuKernelLine {
            pid: 1,
            ts_ns,
            dur_ns,
            kernel: name.into(),
            link: GpuLink {
                call_tid: Some(1),
                call_ts_ns: Some(ts_ns - 5),
                queued_ns: Some(queued),
                ..GpuLink::default()
            },
            ..GpuKernelLine::default()
        })
    }

    #[test]
    fn figures_are_exact() {
        let mut acc = GpuAccumulator::default();
        // Busy 1000..1400 (two overlapping kernels), 2000..2100, 5000..7000.
        acc.observe(&kernel("a", 1000, 300, 100));
        acc.observe(&kernel("b", 1100, 300, -20));
        acc.observe(&kernel("a", 2000, 100, 300));
        acc.observe(&GpuLine::Copy(GpuCopyLine {
            pid: 1,
            ts_ns: 5000,
            dur_ns: 2000,
            kind: "HtoD".into(),
            bytes: 8000,
            ..GpuCopyLine::default()
        }));
        let summary = acc.finish(Some(0), 10_000);
        assert_eq!((summary.work, summary.kernels, summary.copies), (4, 3, 1));
        assert_eq!((summary.linked, summary.unlinked), (3, 1));
        assert_eq!((summary.busy_ns, summary.run_ns), (2500, 10_000));
        let device = &summary.devices[0];
        assert_eq!((device.first_ns, device.last_end_ns), (1000, 7000));
        assert_eq!(device.share_of_run, 0.25);
        let gaps: Vec<(u64, u64)> = device
            .gaps
            .iter()
            .map(|g| (g.start_ns, g.duration_ns))
            .collect();
        assert_eq!(gaps, [(2100, 2900), (1400, 600)]);
        let a = &summary.kernel_time[0];
        assert_eq!(
            (a.kernel.as_str(), a.count, a.total_ns, a.mean_ns, a.max_ns),
            ("a", 2, 400, 200, 300)
        );
        assert_eq!((a.p50_ns, a.p99_ns), (100, 300));
        assert_eq!(a.share_of_busy, 400.0 / 2500.0);
        assert_eq!(
            summary.copy_time,
            [TransferTime {
                kind: "HtoD".into(),
                count: 1,
                bytes: 8000,
                gpu_ns: 2000,
                bandwidth_gb_s: Some(4.0)
            }]
        );
        assert_eq!(
            summary.queued,
            Some(QueueDelay {
                count: 3,
                p50_ns: 100,
                p99_ns: 300,
                max_ns: 300,
                started_before_return: 1
            })
        );
    }
}
