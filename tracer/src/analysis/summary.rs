//! Per-function, per-kernel and per-direction statistics.
//!
//! Latency percentiles come from an HDR histogram per function (3 significant digits:
//! within 0.1%), so memory depends on the number of functions, not of calls. A histogram
//! takes 16 KiB from its first value, so a function's first few latencies are kept as they
//! are and go into one only when there are more ([`Latency`]): a trace of many functions
//! called a few times each (`--functions all`, or 200,000 names) costs a few hundred bytes
//! a function, and the percentiles are the same.

use std::collections::{BTreeMap, BTreeSet};

use foldhash::HashMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::role::Role;
use crate::schema::CallLine;

/// Distinct grid/block shapes listed per kernel; launches with further shapes are counted.
pub const MAX_SHAPES: usize = 16;
/// Longest latency the histograms resolve (about 13 days); `max_ns` stays exact.
const MAX_TRACKED_NS: u64 = 1 << 50;

struct FunctionStats {
    count: u64,
    /// Calls without a return seen (`--launch-entry-only`): no duration, no result.
    untimed: u64,
    errors: u64,
    total_ns: u64,
    max_ns: u64,
    bytes: Option<u64>,
    /// Successful synchronous copies: their time, for bandwidth.
    copy_ns: u64,
    synchronous_copy: bool,
    latency: Latency,
}

/// Latencies kept as they are while few, else in an HDR histogram. The percentiles are
/// the histogram's either way: the few are put into one when asked.
enum Latency {
    Few(Vec<u64>),
    Many(Histogram<u64>),
}

/// Latencies kept as they are, at most (512 bytes): a histogram costs 16 KiB.
const FEW_LATENCIES: usize = 64;

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant digits is a valid precision")
}

/// Records `value` (clamped to what the histograms resolve); `record` grows the histogram
/// as needed (`saturating_record` would clamp).
fn record(histogram: &mut Histogram<u64>, value: u64) {
    let value = value.min(MAX_TRACKED_NS);
    if histogram.record(value).is_err() {
        histogram.saturating_record(value);
    }
}

impl Latency {
    fn record(&mut self, value: u64) {
        match self {
            Latency::Few(values) if values.len() < FEW_LATENCIES => values.push(value),
            Latency::Few(values) => {
                let mut many = histogram();
                for value in values.iter().copied().chain([value]) {
                    record(&mut many, value);
                }
                *self = Latency::Many(many);
            }
            Latency::Many(many) => record(many, value),
        }
    }

    /// The histogram's values at `quantiles`.
    fn at<const N: usize>(&self, quantiles: [f64; N]) -> [u64; N] {
        let built;
        let histogram = match self {
            Latency::Many(many) => many,
            Latency::Few(values) => {
                let mut few = histogram();
                for value in values {
                    record(&mut few, *value);
                }
                built = few;
                &built
            }
        };
        quantiles.map(|quantile| histogram.value_at_quantile(quantile))
    }
}

impl FunctionStats {
    fn new(name: &str, role: Role) -> Self {
        FunctionStats {
            count: 0,
            untimed: 0,
            errors: 0,
            total_ns: 0,
            max_ns: 0,
            bytes: None,
            copy_ns: 0,
            synchronous_copy: role == Role::Copy && !name.contains("Async"),
            latency: Latency::Few(Vec::new()),
        }
    }
}

#[derive(Default)]
struct KernelStats {
    launches: u64,
    mangled: Option<String>,
    shapes: BTreeMap<([u32; 3], [u32; 3]), u64>,
    other_shapes: u64,
}

/// Fed every call record, in order.
#[derive(Default)]
pub struct SummaryAccumulator {
    calls: u64,
    errors: u64,
    first_ts: Option<u64>,
    last_end: u64,
    pids: BTreeSet<u32>,
    functions: HashMap<String, FunctionStats>,
    kernels: HashMap<String, KernelStats>,
    graph_launches: u64,
    copies: BTreeMap<String, (u64, u64)>,
}

/// The bytes a call moves or allocates (pitch allocations: pitch * height).
pub(crate) fn call_bytes(record: &CallLine) -> Option<u64> {
    match (record.pitch, record.height, record.bytes) {
        (_, _, Some(bytes)) => Some(bytes),
        (Some(pitch), Some(height), None) => Some(pitch.saturating_mul(height)),
        _ => None,
    }
}

impl SummaryAccumulator {
    pub fn observe(&mut self, role: Role, record: &CallLine) {
        let ok = record.ok();
        let end = record.end_ns().unwrap_or(record.ts_ns);
        self.calls += 1;
        self.errors += u64::from(!ok);
        self.first_ts = Some(self.first_ts.map_or(record.ts_ns, |t| t.min(record.ts_ns)));
        self.last_end = self.last_end.max(end);
        self.pids.insert(record.pid);

        if !self.functions.contains_key(&record.name) {
            let stats = FunctionStats::new(&record.name, role);
            self.functions.insert(record.name.clone(), stats);
        }
        let Some(stats) = self.functions.get_mut(&record.name) else {
            return;
        };
        stats.count += 1;
        stats.errors += u64::from(!ok);
        if let Some(dur_ns) = record.dur_ns {
            stats.total_ns = stats.total_ns.saturating_add(dur_ns);
            stats.max_ns = stats.max_ns.max(dur_ns);
            stats.latency.record(dur_ns);
        } else {
            stats.untimed += 1;
        }
        let bytes = call_bytes(record);
        if let Some(bytes) = bytes {
            let sum = stats.bytes.get_or_insert(0);
            if ok {
                *sum = sum.saturating_add(bytes);
                if stats.synchronous_copy {
                    stats.copy_ns = stats.copy_ns.saturating_add(record.dur_or_zero());
                }
            }
        }
        if !ok {
            return;
        }
        match role {
            Role::Copy => {
                let kind = record.kind.as_deref().unwrap_or("Default");
                let entry = match self.copies.get_mut(kind) {
                    Some(entry) => entry,
                    None => self.copies.entry(kind.to_owned()).or_default(),
                };
                entry.0 += 1;
                entry.1 = entry.1.saturating_add(bytes.unwrap_or(0));
            }
            Role::GraphLaunch => self.graph_launches += 1,
            Role::Launch => {
                let Some(kernel) = record.kernel.as_deref() else {
                    return;
                };
                let stats = match self.kernels.get_mut(kernel) {
                    Some(stats) => stats,
                    None => self.kernels.entry(kernel.to_owned()).or_default(),
                };
                stats.launches += 1;
                if stats.mangled.is_none() {
                    stats.mangled = record.kernel_mangled.clone();
                }
                let shape = (
                    record.grid.unwrap_or_default(),
                    record.block.unwrap_or_default(),
                );
                if let Some(count) = stats.shapes.get_mut(&shape) {
                    *count += 1;
                } else if stats.shapes.len() < MAX_SHAPES {
                    stats.shapes.insert(shape, 1);
                } else {
                    stats.other_shapes += 1;
                }
            }
            _ => {}
        }
    }

    pub fn finish(self) -> Summary {
        let mut functions: Vec<FunctionSummary> = self
            .functions
            .into_iter()
            .map(|(name, stats)| {
                let timed = stats.count - stats.untimed;
                let when_timed = |value: u64| (timed > 0).then_some(value);
                let [p50, p99] = stats.latency.at([0.5, 0.99]);
                FunctionSummary {
                    count: stats.count,
                    untimed: stats.untimed,
                    errors: stats.errors,
                    total_ns: stats.total_ns,
                    mean_ns: when_timed(stats.total_ns / timed.max(1)),
                    p50_ns: when_timed(p50.min(stats.max_ns)),
                    p99_ns: when_timed(p99.min(stats.max_ns)),
                    max_ns: when_timed(stats.max_ns),
                    bytes: stats.bytes,
                    bandwidth_gb_s: match (stats.synchronous_copy, stats.bytes) {
                        (true, Some(bytes)) if stats.copy_ns > 0 => {
                            Some(bytes as f64 / stats.copy_ns as f64)
                        }
                        _ => None,
                    },
                    name,
                }
            })
            .collect();
        functions.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));
        let kernel_launches: u64 = self.kernels.values().map(|k| k.launches).sum();
        let mut kernels: Vec<KernelSummary> = self
            .kernels
            .into_iter()
            .map(|(kernel, stats)| KernelSummary {
                launches: stats.launches,
                share: stats.launches as f64 / kernel_launches.max(1) as f64,
                kernel_mangled: stats.mangled,
                shapes: stats
                    .shapes
                    .into_iter()
                    .map(|((grid, block), launches)| Shape {
                        grid,
                        block,
                        launches,
                    })
                    .collect(),
                other_shapes: stats.other_shapes,
                kernel,
            })
            .collect();
        kernels.sort_by(|a, b| b.launches.cmp(&a.launches).then(a.kernel.cmp(&b.kernel)));
        for kernel in &mut kernels {
            kernel
                .shapes
                .sort_by(|a, b| b.launches.cmp(&a.launches).then(a.grid.cmp(&b.grid)));
        }
        let first_ts = self.first_ts.unwrap_or(0);
        Summary {
            calls: self.calls,
            errors: self.errors,
            first_ts_ns: first_ts,
            span_ns: self.last_end.saturating_sub(first_ts),
            pids: self.pids.into_iter().collect(),
            functions,
            kernel_launches,
            graph_launches: self.graph_launches,
            kernels,
            copies: self
                .copies
                .into_iter()
                .map(|(kind, (count, bytes))| CopySummary { kind, count, bytes })
                .collect(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FunctionSummary {
    pub name: String,
    pub count: u64,
    /// Calls probed at entry alone (`--launch-entry-only`): no duration and no result
    /// (they count as successes, and in no duration figure).
    #[serde(skip_serializing_if = "is_zero")]
    pub untimed: u64,
    /// Calls that returned something other than CUDA_SUCCESS.
    pub errors: u64,
    /// The time of the calls with a duration.
    pub total_ns: u64,
    /// Of the calls with a duration; absent when none has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ns: Option<u64>,
    /// Bytes of successful calls (copies, memsets, allocations); absent for functions
    /// without a size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Synchronous copies: bytes / time in the call (GB/s = bytes per ns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandwidth_gb_s: Option<f64>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Shape {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub launches: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelSummary {
    pub kernel: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_mangled: Option<String>,
    /// Successful launches.
    pub launches: u64,
    /// Of all successful kernel launches (0..1).
    pub share: f64,
    /// The most frequent shapes first, at most [`MAX_SHAPES`].
    pub shapes: Vec<Shape>,
    /// Launches with shapes beyond those listed.
    pub other_shapes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CopySummary {
    /// HtoD, DtoH, DtoD, HtoH, Peer or Default (direction chosen by the driver).
    pub kind: String,
    pub count: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub calls: u64,
    pub errors: u64,
    /// The earliest call's `ts_ns`.
    pub first_ts_ns: u64,
    /// From the earliest call's start to the latest call's end.
    pub span_ns: u64,
    pub pids: Vec<u32>,
    /// By total time, longest first.
    pub functions: Vec<FunctionSummary>,
    pub kernel_launches: u64,
    pub graph_launches: u64,
    /// By launches, most first.
    pub kernels: Vec<KernelSummary>,
    /// Successful copies by direction.
    pub copies: Vec<CopySummary>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{analysis::testing::Script, schema::Hex};

    #[test]
    fn function_statistics_are_exact() {
        let mut script = Script::new(5);
        for dur in [100, 200, 300, 400] {
            script.call("cuMemcpyHtoD_v2", |r| {
                r.kind = Some("HtoD".into());
                r.bytes = Some(1000);
                r.dur_ns = Some(dur);
            });
        }
        script.call("cuMemcpyHtoD_v2", |r| {
            r.kind = Some("HtoD".into());
            r.bytes = Some(5000);
            r.dur_ns = Some(1000);
            r.ret = Some(1);
        });
        script.copy("cuMemcpyDtoHAsync_v2", "DtoH", 64);
        // Long calls: percentiles within the histogram's 0.1%.
        for dur in [10_000, 20_000, 30_000, 40_000_000_000] {
            script.call("cuStreamSynchronize", |r| r.dur_ns = Some(dur));
        }
        let summary = script.report().summary;
        assert_eq!(summary.calls, 10);
        assert_eq!(summary.errors, 1);
        assert_eq!(summary.span_ns, 9000 + 40_000_000_000);
        let sync = &summary.functions[0];
        assert_eq!(sync.name, "cuStreamSynchronize");
        assert_eq!(sync.max_ns, Some(40_000_000_000));
        assert_eq!(
            sync.p99_ns,
            Some(40_000_000_000),
            "capped at the exact maximum"
        );
        let p50 = sync.p50_ns.unwrap();
        assert!(p50.abs_diff(20_000) <= 20, "{p50}");
        let htod = &summary.functions[1];
        assert_eq!(
            *htod,
            FunctionSummary {
                name: "cuMemcpyHtoD_v2".into(),
                count: 5,
                untimed: 0,
                errors: 1,
                total_ns: 2000,
                mean_ns: Some(400),
                p50_ns: Some(300),
                p99_ns: Some(1000),
                max_ns: Some(1000),
                bytes: Some(4000),
                // 4000 bytes in the 1000 ns of the successful calls.
                bandwidth_gb_s: Some(4.0),
            }
        );
        let dtoh = &summary.functions[2];
        assert_eq!(dtoh.name, "cuMemcpyDtoHAsync_v2");
        assert_eq!(dtoh.bandwidth_gb_s, None, "asynchronous copies have none");
        assert_eq!(
            summary.copies,
            [
                CopySummary {
                    kind: "DtoH".into(),
                    count: 1,
                    bytes: 64
                },
                CopySummary {
                    kind: "HtoD".into(),
                    count: 4,
                    bytes: 4000
                },
            ]
        );
    }

    #[test]
    fn calls_without_their_return_count_as_successes_without_durations() {
        let mut script = Script::new(5);
        for _ in 0..3 {
            script.call("cuLaunchKernel", |r| {
                r.function = Some(Hex(0x10));
                r.grid = Some([2, 1, 1]);
                r.block = Some([64, 1, 1]);
                r.dur_ns = None;
                r.ret = None;
            });
        }
        script.call("cuStreamSynchronize", |r| r.dur_ns = Some(700));
        let summary = script.report().summary;
        assert_eq!((summary.calls, summary.errors), (4, 0));
        assert_eq!(summary.kernel_launches, 3);
        // From the first launch's entry to the synchronisation's return.
        assert_eq!(summary.span_ns, 3000 + 700);
        let launch = summary
            .functions
            .iter()
            .find(|f| f.name == "cuLaunchKernel")
            .unwrap();
        assert_eq!(
            *launch,
            FunctionSummary {
                name: "cuLaunchKernel".into(),
                count: 3,
                untimed: 3,
                errors: 0,
                total_ns: 0,
                mean_ns: None,
                p50_ns: None,
                p99_ns: None,
                max_ns: None,
                bytes: None,
                bandwidth_gb_s: None,
            }
        );
        let json = serde_json::to_string(launch).unwrap();
        assert_eq!(
            json,
            r#"{"name":"cuLaunchKernel","count":3,"untimed":3,"errors":0,"total_ns":0}"#
        );
    }

    #[test]
    fn kernels_get_launches_shapes_and_shares() {
        let mut script = Script::new(5);
        script.call("cuModuleGetFunction", |r| {
            r.function = Some(Hex(0x10));
            r.symbol = Some("_Z4gemmv".into());
        });
        for i in 0..(MAX_SHAPES as u32 + 2) {
            script.call("cuLaunchKernel", |r| {
                r.function = Some(Hex(0x10));
                r.grid = Some([i + 1, 1, 1]);
                r.block = Some([128, 1, 1]);
            });
        }
        for _ in 0..2 {
            script.call("cuLaunchKernel_ptsz", |r| {
                r.function = Some(Hex(0x10));
                r.grid = Some([1, 1, 1]);
                r.block = Some([128, 1, 1]);
            });
        }
        script
            .launch(0x99)
            .launch(0x99)
            .call("cuLaunchKernel", |r| {
                r.function = Some(Hex(0x99));
                r.ret = Some(400);
            })
            .call("cuGraphLaunch", |r| r.graph = Some(Hex(0x5)));
        let summary = script.report().summary;
        assert_eq!(summary.kernel_launches, 22);
        assert_eq!(summary.graph_launches, 1);
        let gemm = &summary.kernels[0];
        assert_eq!(gemm.kernel, "gemm()");
        assert_eq!(gemm.kernel_mangled.as_deref(), Some("_Z4gemmv"));
        assert_eq!(gemm.launches, 20);
        assert!((gemm.share - 20.0 / 22.0).abs() < 1e-12);
        assert_eq!(gemm.shapes.len(), MAX_SHAPES);
        assert_eq!(
            gemm.shapes[0],
            Shape {
                grid: [1, 1, 1],
                block: [128, 1, 1],
                launches: 3
            }
        );
        assert_eq!(gemm.other_shapes, 2);
        let unknown = &summary.kernels[1];
        assert_eq!(
            (unknown.kernel.as_str(), unknown.launches),
            ("unknown@0x99", 2)
        );
        let launch = summary
            .functions
            .iter()
            .find(|f| f.name == "cuLaunchKernel")
            .unwrap();
        assert_eq!((launch.count, launch.errors), (21, 1));
    }

    #[test]
    fn percentiles_are_the_histograms_however_few_the_latencies() {
        // A fixed pseudo-random sequence spanning ns to seconds.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % 3_000_000_000
        };
        for count in [1, 2, 63, FEW_LATENCIES, FEW_LATENCIES + 1, 1000] {
            let mut latency = Latency::Few(Vec::new());
            let mut reference = histogram();
            for _ in 0..count {
                let value = next();
                latency.record(value);
                record(&mut reference, value);
            }
            assert_eq!(
                matches!(latency, Latency::Few(_)),
                count <= FEW_LATENCIES,
                "{count}"
            );
            let quantiles = [0.0, 0.5, 0.9, 0.99, 1.0];
            assert_eq!(
                latency.at(quantiles),
                quantiles.map(|q| reference.value_at_quantile(q)),
                "{count} latencies"
            );
        }
    }

    #[test]
    fn functions_called_a_few_times_keep_no_histogram() {
        let mut summary = SummaryAccumulator::default();
        for index in 0..1000 {
            let call = CallLine {
                name: format!("cuFake{index}"),
                dur_ns: Some(index),
                ret: Some(0),
                ..CallLine::default()
            };
            summary.observe(Role::Other, &call);
            summary.observe(Role::Other, &call);
        }
        assert_eq!(summary.functions.len(), 1000);
        for stats in summary.functions.values() {
            // Two latencies: 16 bytes of heap where a histogram takes 16 KiB.
            assert!(matches!(&stats.latency, Latency::Few(values) if values.len() == 2));
        }
        let finished = summary.finish();
        let fake7 = finished
            .functions
            .iter()
            .find(|f| f.name == "cuFake7")
            .unwrap();
        assert_eq!(
            (fake7.count, fake7.p50_ns, fake7.max_ns),
            (2, Some(7), Some(7))
        );
    }
}
