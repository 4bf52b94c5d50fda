//! `--power` traces: energy, mean and peak power per GPU and for the run, energy per
//! stage, energy per kernel name, and the power before the first launch.
//!
//! Fed `power` lines (and the header's `power` object) as they come, and the launches and
//! synchronisations of the call stream. Memory: every sample's time and energy per device,
//! from the counter and from integrated power (32 bytes a sample: about 100 KB per
//! GPU-minute at the default 20 ms), and the launch windows not yet covered by samples (a
//! few hundred milliseconds' worth); never the calls.
//!
//! Without `--gpu`, energy per kernel name is an **estimate by launch windows**: a window
//! opens at a launch and closes at the next launch or at the end of the next
//! synchronisation (any process); its energy, summed over the GPUs, goes to the kernel
//! launched. docs/power.md says what this can and cannot tell. With `--gpu` it is **by GPU
//! time** instead ([`GpuTimeEnergy`]): each sample interval's energy goes to the kernels
//! that ran in it (`energy::GpuTimeSplitter`), from a second reading of the trace's
//! `gpu_kernel` lines, each on the NVML GPU its CUDA device is (`device_map.rs`).

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::Serialize;

use super::{
    device_map::{DeviceMap, DeviceMatch},
    energy::{EnergySeries, GpuTimeSplitter, Integrator, KernelInterval},
    role::Role,
    stages::ProcessStages,
};
use crate::schema::{
    CallLine, ENERGY_FROM_COUNTER, ENERGY_FROM_POWER, GpuHeaderInfo, GpuKernelLine, NvmlInfo,
    PowerInfo, PowerLine,
};

/// The label of the launch-window estimate.
pub const LAUNCH_WINDOWS: &str = "launch windows (estimate: no --gpu)";
/// The label of the split by GPU time (`--gpu`).
pub const GPU_TIME: &str = "GPU time (--gpu)";
/// A sample interval's energy is shared out once a kernel that ended this long after it
/// has been read on its GPU: `run` writes a kernel's line at most about 30 s after it
/// ended (the linker's longest wait), so later kernel time in it is not expected.
pub const KERNEL_HOLD_NS: u64 = 60_000_000_000;

/// One device's samples.
#[derive(Default)]
struct DeviceState {
    /// From the header (or, without one, the first line): the counter is read.
    use_counter: bool,
    /// The counter's readings, less the first (f64 keeps mJ exact to 2^53).
    counter: EnergySeries,
    counter_origin: Option<u64>,
    integrated: EnergySeries,
    integrator: Integrator,
    samples: u64,
    first_ts: Option<u64>,
    last_ts: u64,
    peak: Option<(u32, u64)>,
    read_ns_total: u64,
    read_ns_max: u64,
    errors: BTreeMap<String, u64>,
}

impl DeviceState {
    /// The series the device's energy figures come from.
    fn energy(&self) -> &EnergySeries {
        if self.uses_counter() {
            &self.counter
        } else {
            &self.integrated
        }
    }

    fn uses_counter(&self) -> bool {
        self.use_counter && !self.counter.is_empty()
    }
}

/// Launch windows waiting for samples, and what the resolved ones gave.
#[derive(Default)]
struct LaunchWindows {
    index: HashMap<String, usize>,
    /// (kernel, launches, energy mJ, window time)
    rows: Vec<(String, u64, f64, u64)>,
    open: Option<(u64, usize)>,
    pending: VecDeque<(u64, u64, usize)>,
}

impl LaunchWindows {
    fn launch(&mut self, ts_ns: u64, kernel: &str) {
        self.close(ts_ns);
        let row = match self.index.get(kernel) {
            Some(row) => *row,
            None => {
                self.rows.push((kernel.to_owned(), 0, 0.0, 0));
                self.index.insert(kernel.to_owned(), self.rows.len() - 1);
                self.rows.len() - 1
            }
        };
        self.rows[row].1 += 1;
        self.open = Some((ts_ns, row));
    }

    fn close(&mut self, end_ns: u64) {
        if let Some((start, row)) = self.open.take() {
            self.pending.push_back((start, end_ns.max(start), row));
        }
    }

    /// Gives energy to the windows that end before `covered_until`.
    fn resolve(&mut self, devices: &BTreeMap<u32, DeviceState>, covered_until: u64) {
        while let Some(&(start, end, row)) = self.pending.front() {
            if end > covered_until {
                break;
            }
            self.pending.pop_front();
            let energy: f64 = devices
                .values()
                .map(|d| d.energy().between(start, end))
                .sum();
            self.rows[row].2 += energy;
            self.rows[row].3 += end - start;
        }
    }
}

/// Fed every `power` line and every call, in trace order.
#[derive(Default)]
pub struct PowerAccumulator {
    info: Option<PowerInfo>,
    devices: BTreeMap<u32, DeviceState>,
    /// The tick being summed: (seq, ts, mW of its devices).
    tick: Option<(u64, u64, u64)>,
    peak_tick: Option<(u64, u64)>,
    windows: LaunchWindows,
    first_launch_ns: Option<u64>,
    last_call_end_ns: u64,
}

impl PowerAccumulator {
    /// The header's `power` object: which devices have an energy counter.
    pub fn header(&mut self, info: &PowerInfo) {
        self.info = Some(info.clone());
    }

    /// A call: launches open launch windows, synchronisations close them.
    pub fn call(&mut self, role: Role, record: &CallLine) {
        let end = record.ts_ns.saturating_add(record.dur_or_zero());
        self.last_call_end_ns = self.last_call_end_ns.max(end);
        if !record.ok() {
            return;
        }
        // Windows are kept only for traces with power samples (the header says so, or
        // they have begun): they wait for samples, which never come otherwise.
        let sampled = self.info.is_some() || !self.devices.is_empty();
        match role {
            Role::Launch | Role::GraphLaunch => {
                let name = match (role, record.kernel.as_deref()) {
                    (Role::GraphLaunch, _) => "(CUDA graph launches)",
                    (_, Some(kernel)) => kernel,
                    (_, None) => "(launches without a kernel name)",
                };
                self.first_launch_ns = Some(
                    self.first_launch_ns
                        .map_or(record.ts_ns, |first| first.min(record.ts_ns)),
                );
                if sampled {
                    self.windows.launch(record.ts_ns, name);
                }
            }
            Role::Sync if sampled => self.windows.close(end),
            _ => {}
        }
    }

    pub fn sample(&mut self, line: &PowerLine) {
        let counter_supported = self.info.as_ref().map(|info| {
            info.devices
                .iter()
                .any(|d| d.index == line.device && d.energy_counter)
        });
        let device = self
            .devices
            .entry(line.device)
            .or_insert_with(|| DeviceState {
                use_counter: counter_supported.unwrap_or(line.energy_mj.is_some()),
                ..DeviceState::default()
            });
        device.samples += 1;
        device.first_ts = Some(device.first_ts.map_or(line.ts_ns, |t| t.min(line.ts_ns)));
        device.last_ts = device.last_ts.max(line.ts_ns);
        device.read_ns_total = device.read_ns_total.saturating_add(line.read_ns);
        device.read_ns_max = device.read_ns_max.max(line.read_ns);
        for field in line.errors.keys() {
            *device.errors.entry(field.clone()).or_default() += 1;
        }
        if let Some(energy) = line.energy_mj {
            let origin = *device.counter_origin.get_or_insert(energy);
            device
                .counter
                .push(line.ts_ns, energy as f64 - origin as f64);
        }
        if let Some(power) = line.best_power_mw() {
            let total = device.integrator.push(line.ts_ns, power);
            device.integrated.push(line.ts_ns, total);
        }
        if let Some(power) = line.power_mw.or(line.power_instant_mw)
            && device.peak.is_none_or(|(peak, _)| power > peak)
        {
            device.peak = Some((power, line.ts_ns));
        }
        self.tick_power(line);
        let covered_until = self.devices.values().map(|d| d.last_ts).min().unwrap_or(0);
        self.windows.resolve(&self.devices, covered_until);
    }

    /// Sums the power of the devices in one tick (its lines come together) for the
    /// run's peak.
    fn tick_power(&mut self, line: &PowerLine) {
        let power = u64::from(line.power_mw.or(line.power_instant_mw).unwrap_or(0));
        match &mut self.tick {
            Some((seq, _, sum)) if *seq == line.seq => *sum += power,
            tick => {
                if let Some((_, ts, sum)) = tick.take() {
                    Self::keep_peak(&mut self.peak_tick, sum, ts);
                }
                *tick = Some((line.seq, line.ts_ns, power));
            }
        }
    }

    fn keep_peak(peak: &mut Option<(u64, u64)>, sum: u64, ts: u64) {
        if peak.is_none_or(|(best, _)| sum > best) {
            *peak = Some((sum, ts));
        }
    }

    /// The figures, with the stages the analysis found.
    #[cfg(test)]
    pub fn finish(self, stages: &[ProcessStages]) -> Option<PowerReport> {
        self.finish_with_series(stages).0
    }

    /// The figures, with the stages the analysis found, and each device's energy series
    /// (for [`GpuTimeEnergy`]).
    pub fn finish_with_series(
        mut self,
        stages: &[ProcessStages],
    ) -> (Option<PowerReport>, BTreeMap<u32, EnergySeries>) {
        if self.devices.is_empty() && self.info.is_none() {
            return (None, BTreeMap::new());
        }
        if let Some((_, ts, sum)) = self.tick.take() {
            Self::keep_peak(&mut self.peak_tick, sum, ts);
        }
        self.windows.close(self.last_call_end_ns);
        self.windows.resolve(&self.devices, u64::MAX);

        let info = self.info.take().unwrap_or_default();
        let devices: Vec<DeviceEnergy> = self
            .devices
            .iter()
            .map(|(index, state)| device_energy(*index, state, &info))
            .collect();
        let first = devices.iter().filter_map(|d| d.first_ts_ns).min();
        let last = devices.iter().filter_map(|d| d.last_ts_ns).max();
        let duration_ns = match (first, last) {
            (Some(first), Some(last)) => last - first,
            _ => 0,
        };
        let energy_j: f64 = devices.iter().map(|d| d.energy_j).sum();

        let energy_in = |start: u64, end: u64| -> (f64, u64) {
            let energy = self
                .devices
                .values()
                .map(|d| d.energy().between(start, end))
                .sum();
            let covered = self
                .devices
                .values()
                .map(|d| d.energy().covered_ns(start, end))
                .max()
                .unwrap_or(0);
            (energy, covered)
        };
        let stages = stages
            .iter()
            .map(|process| ProcessStageEnergy {
                pid: process.pid,
                stages: process
                    .stages
                    .iter()
                    .map(|stage| {
                        let end = stage.start_ns.saturating_add(stage.duration_ns);
                        let (energy_mj, covered_ns) = energy_in(stage.start_ns, end);
                        StageEnergy {
                            name: stage.name,
                            start_ns: stage.start_ns,
                            duration_ns: stage.duration_ns,
                            covered_ns,
                            energy_j: energy_mj / 1e3,
                            mean_w: watts(energy_mj, covered_ns),
                        }
                    })
                    .collect(),
            })
            .collect();

        let before_first_launch = match (first, self.first_launch_ns) {
            (Some(first), Some(launch)) if launch > first => {
                let (energy_mj, covered_ns) = energy_in(first, launch);
                Some(Window {
                    start_ns: first,
                    duration_ns: launch - first,
                    energy_j: energy_mj / 1e3,
                    mean_w: watts(energy_mj, covered_ns),
                })
            }
            _ => None,
        };

        let mut kernels: Vec<KernelEnergy> = self
            .windows
            .rows
            .into_iter()
            .map(|(kernel, launches, energy_mj, window_ns)| KernelEnergy {
                share: if energy_j > 0.0 {
                    energy_mj / 1e3 / energy_j
                } else {
                    0.0
                },
                energy_j: energy_mj / 1e3,
                launches,
                window_ns,
                kernel,
            })
            .collect();
        kernels.sort_by(|a, b| {
            b.energy_j
                .total_cmp(&a.energy_j)
                .then_with(|| a.kernel.cmp(&b.kernel))
        });
        let in_windows: f64 = kernels.iter().map(|k| k.energy_j).sum();
        let read_errors = devices.iter().flat_map(|d| d.errors.values()).sum();
        let report = PowerReport {
            period_ms: (info.period_ms > 0).then_some(info.period_ms),
            nvml: (!info.nvml.path.is_empty()).then_some(info.nvml),
            energy_j,
            duration_ns,
            mean_w: if duration_ns > 0 {
                energy_j / (duration_ns as f64 / 1e9)
            } else {
                0.0
            },
            peak_w: self.peak_tick.map_or(0.0, |(mw, _)| mw as f64 / 1e3),
            peak_ts_ns: self.peak_tick.map_or(0, |(_, ts)| ts),
            read_errors,
            devices,
            before_first_launch,
            stages,
            kernels: KernelEnergyReport {
                method: LAUNCH_WINDOWS,
                estimate: true,
                outside_windows_j: (energy_j - in_windows).max(0.0),
                kernels,
                devices: Vec::new(),
                unsampled_ns: 0,
                late_ns: 0,
            },
        };
        let series = std::mem::take(&mut self.devices)
            .into_iter()
            .map(|(index, state)| {
                let series = if state.uses_counter() {
                    state.counter
                } else {
                    state.integrated
                };
                (index, series)
            })
            .collect();
        (Some(report), series)
    }
}

/// `--power --gpu`: energy per kernel name by GPU time, fed the `gpu_kernel` lines of a
/// second reading of the trace (the energy series are whole by then). Memory: the series,
/// and the kernel time per name of the sample intervals not yet shared out (about a
/// minute's, [`KERNEL_HOLD_NS`]); never the kernels.
pub struct GpuTimeEnergy {
    map: DeviceMap,
    matches: BTreeMap<u32, DeviceMatch>,
    splitter: GpuTimeSplitter,
}

impl GpuTimeEnergy {
    /// For the GPUs of `power` and their energy `series`; `gpu`: the trace's `gpu` header
    /// (how the command numbered its CUDA devices).
    pub fn new(
        power: &PowerReport,
        series: BTreeMap<u32, EnergySeries>,
        gpu: Option<&GpuHeaderInfo>,
    ) -> Self {
        let nvml = power
            .devices
            .iter()
            .map(|d| (d.index, d.uuid.clone()))
            .collect();
        GpuTimeEnergy {
            map: DeviceMap::new(
                nvml,
                gpu.and_then(|g| g.cuda_visible_devices.as_deref()),
                gpu.and_then(|g| g.cuda_device_order.as_deref()),
            ),
            matches: BTreeMap::new(),
            splitter: GpuTimeSplitter::new(series, KERNEL_HOLD_NS),
        }
    }

    pub fn kernel(&mut self, line: &GpuKernelLine) {
        let found = self
            .matches
            .entry(line.device)
            .or_insert_with(|| self.map.nvml(line.device));
        match found.nvml_index {
            // Untimed kernels (no_timestamps, no_clock) count, with no GPU time.
            Some(device) if line.link.timed() => self.splitter.kernel(&KernelInterval {
                start_ns: line.ts_ns,
                end_ns: line.ts_ns.saturating_add(line.dur_ns),
                name: &line.kernel,
                device,
            }),
            Some(_) => self.splitter.unplaced(&line.kernel, 0),
            None => self.splitter.unplaced(&line.kernel, line.dur_ns),
        }
    }

    /// Puts the split in `power.kernels`, in place of the launch-window estimate.
    pub fn finish(self, power: &mut PowerReport) {
        let split = self.splitter.finish();
        let mut kernels: Vec<KernelEnergy> = split
            .by_name
            .into_iter()
            .map(|(kernel, share)| KernelEnergy {
                share: if power.energy_j > 0.0 {
                    share.energy_mj / 1e3 / power.energy_j
                } else {
                    0.0
                },
                energy_j: share.energy_mj / 1e3,
                launches: share.kernels,
                window_ns: share.gpu_ns,
                kernel,
            })
            .collect();
        kernels.sort_by(|a, b| {
            b.energy_j
                .total_cmp(&a.energy_j)
                .then_with(|| a.kernel.cmp(&b.kernel))
        });
        power.kernels = KernelEnergyReport {
            method: GPU_TIME,
            estimate: false,
            outside_windows_j: split.idle_mj / 1e3,
            kernels,
            devices: self.matches.into_values().collect(),
            unsampled_ns: split.unsampled_ns,
            late_ns: split.late_ns,
        };
    }
}

/// mJ over ns in W.
fn watts(energy_mj: f64, duration_ns: u64) -> f64 {
    if duration_ns == 0 {
        0.0
    } else {
        energy_mj * 1e6 / duration_ns as f64
    }
}

fn device_energy(index: u32, state: &DeviceState, info: &PowerInfo) -> DeviceEnergy {
    let described = info.devices.iter().find(|d| d.index == index);
    let energy_mj = state.energy().total();
    let span = match (state.energy().first_ts(), state.energy().last_ts()) {
        (Some(first), Some(last)) => last - first,
        _ => 0,
    };
    let counter_supported = described.is_none_or(|d| d.energy_counter);
    let note = match (state.uses_counter(), counter_supported) {
        (true, _) => None,
        (false, false) => Some(
            "energy counter NOT SUPPORTED on this GPU: energy integrated from power samples"
                .to_owned(),
        ),
        (false, true) => Some(
            "no energy counter reading succeeded: energy integrated from power samples".to_owned(),
        ),
    };
    DeviceEnergy {
        index,
        name: described.map(|d| d.name.clone()).unwrap_or_default(),
        uuid: described.map(|d| d.uuid.clone()).unwrap_or_default(),
        energy_source: if state.uses_counter() {
            ENERGY_FROM_COUNTER
        } else {
            ENERGY_FROM_POWER
        },
        note,
        samples: state.samples,
        first_ts_ns: state.first_ts,
        last_ts_ns: state.first_ts.map(|_| state.last_ts),
        energy_j: energy_mj / 1e3,
        counter_j: state.uses_counter().then(|| state.counter.total() / 1e3),
        integrated_j: state.integrated.total() / 1e3,
        mean_w: watts(energy_mj, span),
        peak_w: state.peak.map_or(0.0, |(mw, _)| f64::from(mw) / 1e3),
        peak_ts_ns: state.peak.map_or(0, |(_, ts)| ts),
        power_limit_w: described
            .and_then(|d| d.power_limit_mw)
            .map(|mw| f64::from(mw) / 1e3),
        read_ns_mean: state.read_ns_total / state.samples.max(1),
        read_ns_max: state.read_ns_max,
        errors: state.errors.clone(),
    }
}

/// Everything `--power` gives (`cudatrace summary --json`'s `power`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PowerReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_ms: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvml: Option<NvmlInfo>,
    /// All GPUs, from their first sample to their last.
    pub energy_j: f64,
    /// From the first sample to the last, any GPU.
    pub duration_ns: u64,
    pub mean_w: f64,
    /// The highest sum of the GPUs' `power_mw` in one tick.
    pub peak_w: f64,
    pub peak_ts_ns: u64,
    /// NVML reads that failed during sampling.
    pub read_errors: u64,
    pub devices: Vec<DeviceEnergy>,
    /// From the first sample to the first launch (all GPUs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_first_launch: Option<Window>,
    pub stages: Vec<ProcessStageEnergy>,
    pub kernels: KernelEnergyReport,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceEnergy {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    /// `counter` or `integrated power`.
    pub energy_source: &'static str,
    /// Why the energy is not the counter's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub samples: u64,
    pub first_ts_ns: Option<u64>,
    pub last_ts_ns: Option<u64>,
    pub energy_j: f64,
    /// The counter's own figure (when it is the source).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counter_j: Option<f64>,
    /// Power integrated by the trapezoid rule (instantaneous power where the GPU gives
    /// it), to compare with the counter.
    pub integrated_j: f64,
    pub mean_w: f64,
    /// The highest `power_mw` sample.
    pub peak_w: f64,
    pub peak_ts_ns: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_limit_w: Option<f64>,
    pub read_ns_mean: u64,
    pub read_ns_max: u64,
    /// Failed reads by field.
    pub errors: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Window {
    pub start_ns: u64,
    pub duration_ns: u64,
    pub energy_j: f64,
    pub mean_w: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessStageEnergy {
    pub pid: u32,
    pub stages: Vec<StageEnergy>,
}

/// A stage's energy, all GPUs: the energy at its end less that at its start, each
/// interpolated between the samples around it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageEnergy {
    pub name: &'static str,
    pub start_ns: u64,
    pub duration_ns: u64,
    /// The part of the stage inside the samples (only it is counted).
    pub covered_ns: u64,
    pub energy_j: f64,
    pub mean_w: f64,
}

/// Energy per kernel name. A kernel's window is, with [`LAUNCH_WINDOWS`], from its launch
/// to the next launch or synchronisation; with [`GPU_TIME`], its run on the GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelEnergyReport {
    /// How energy was given to kernels ([`LAUNCH_WINDOWS`] or [`GPU_TIME`]).
    pub method: &'static str,
    pub estimate: bool,
    /// Energy in no window: before the first launch and after synchronisations (launch
    /// windows); sample intervals in which no kernel ran (GPU time).
    pub outside_windows_j: f64,
    /// By energy, most first.
    pub kernels: Vec<KernelEnergy>,
    /// GPU time: the NVML GPU of each CUDA device the kernels ran on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceMatch>,
    /// GPU time: kernel time that got no energy: outside its GPU's samples, or on a CUDA
    /// device not matched to an NVML GPU.
    #[serde(skip_serializing_if = "is_zero")]
    pub unsampled_ns: u64,
    /// GPU time: kernel time read after its sample interval was shared out
    /// ([`KERNEL_HOLD_NS`]); it got no energy.
    #[serde(skip_serializing_if = "is_zero")]
    pub late_ns: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelEnergy {
    pub kernel: String,
    pub energy_j: f64,
    /// Of the run's energy (0..1).
    pub share: f64,
    /// Its launches; with GPU time, the times it ran (`gpu_kernel` lines).
    pub launches: u64,
    /// The time of its windows; with GPU time, its GPU time inside the samples.
    pub window_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        analysis::{classify, testing::Script},
        schema::{GpuKernelLine, PowerDevice},
    };

    fn line(device: u32, seq: u64, ts_ns: u64, power_mw: u32, energy_mj: Option<u64>) -> PowerLine {
        PowerLine {
            device,
            seq,
            ts_ns,
            read_ns: 1000 + seq,
            power_mw: Some(power_mw),
            energy_mj,
            ..PowerLine::default()
        }
    }

    fn info(counter: &[bool]) -> PowerInfo {
        PowerInfo {
            period_ms: 10,
            devices: counter
                .iter()
                .enumerate()
                .map(|(index, &energy_counter)| PowerDevice {
                    index: index as u32,
                    name: format!("gpu{index}"),
                    energy_counter,
                    ..PowerDevice::default()
                })
                .collect(),
            ..PowerInfo::default()
        }
    }

    /// Samples every 10 ms from 0 to 100 ms: device 0 at 100 W with a counter (starting
    /// at 7 J), device 1 at 200 W integrated.
    fn sampled(accumulator: &mut PowerAccumulator) {
        accumulator.header(&info(&[true, false]));
        for seq in 0..=10 {
            let ts = seq * 10_000_000;
            accumulator.sample(&line(0, seq, ts, 100_000, Some(7000 + seq * 1000)));
            accumulator.sample(&line(1, seq, ts, 200_000, None));
        }
    }

    #[test]
    fn run_device_and_stage_figures_are_exact() {
        let mut accumulator = PowerAccumulator::default();
        sampled(&mut accumulator);
        let stages = [ProcessStages {
            pid: 5,
            calls: 2,
            stages: vec![
                crate::analysis::stages::Stage {
                    name: "initialisation",
                    start_ns: 5_000_000,
                    duration_ns: 20_000_000,
                    calls: 1,
                    launches: 0,
                    htod_bytes: 0,
                    dtoh_bytes: 0,
                    gpu_busy_ns: None,
                },
                crate::analysis::stages::Stage {
                    name: "cleanup",
                    start_ns: 95_000_000,
                    duration_ns: 10_000_000,
                    calls: 1,
                    launches: 0,
                    htod_bytes: 0,
                    dtoh_bytes: 0,
                    gpu_busy_ns: None,
                },
            ],
        }];
        let report = accumulator.finish(&stages).unwrap();
        assert_eq!(report.devices.len(), 2);
        let (gpu0, gpu1) = (&report.devices[0], &report.devices[1]);
        assert_eq!((gpu0.energy_source, gpu0.energy_j), ("counter", 10.0));
        assert_eq!(gpu0.counter_j, Some(10.0));
        assert_eq!(
            (gpu0.integrated_j, gpu0.mean_w, gpu0.peak_w),
            (10.0, 100.0, 100.0)
        );
        assert_eq!(
            (gpu0.samples, gpu0.read_ns_max, gpu0.read_ns_mean),
            (11, 1010, 1005)
        );
        assert_eq!(
            (gpu1.energy_source, gpu1.energy_j, gpu1.mean_w),
            ("integrated power", 20.0, 200.0)
        );
        assert_eq!(gpu1.counter_j, None);
        assert!(gpu1.note.as_deref().unwrap().contains("NOT SUPPORTED"));
        assert_eq!(
            (report.energy_j, report.duration_ns, report.mean_w),
            (30.0, 100_000_000, 300.0)
        );
        assert_eq!((report.peak_w, report.peak_ts_ns), (300.0, 0));
        let stages = &report.stages[0].stages;
        // 20 ms at 300 W; the cleanup's last 5 ms are past the samples.
        assert_eq!(
            (stages[0].energy_j, stages[0].covered_ns, stages[0].mean_w),
            (6.0, 20_000_000, 300.0)
        );
        assert_eq!(
            (stages[1].energy_j, stages[1].covered_ns, stages[1].mean_w),
            (1.5, 5_000_000, 300.0)
        );
    }

    #[test]
    fn launch_windows_give_energy_to_kernels_and_power_before_the_first_launch() {
        let mut script = Script::new(3);
        script.ts = 20_000_000;
        script.call("cuModuleGetFunction", |r| {
            r.function = Some(crate::schema::Hex(0x10));
            r.symbol = Some("_Z4gemmv".into());
        });
        // Launch at 30 ms, another at 50 ms (window 20 ms), a sync from 60 to 70 ms
        // (window 50..70), a graph launch at 80 ms closed by the trace's end (90 ms).
        let mut analysis = crate::analysis::Analysis::default();
        let mut accumulator = PowerAccumulator::default();
        sampled(&mut accumulator);
        for (ts, name, dur) in [
            (30_000_000, "cuLaunchKernel", 100),
            (50_000_000, "cuLaunchKernel", 100),
            (60_000_000, "cuStreamSynchronize", 10_000_000),
            (80_000_000, "cuGraphLaunch", 10_000_000),
        ] {
            script.ts = ts;
            script.call(name, |r| {
                r.function = Some(crate::schema::Hex(0x10));
                r.dur_ns = Some(dur);
            });
        }
        for record in &script.records {
            let mut record = record.clone();
            analysis.observe(&mut record);
            accumulator.call(classify(&record.name).0, &record);
        }
        let report = accumulator.finish(&[]).unwrap();
        let kernels = &report.kernels;
        assert!(kernels.estimate);
        // gemm: 30..50 and 50..70 ms at 300 W = 12 J; graphs: 80..90 ms = 3 J.
        assert_eq!(kernels.kernels[0].kernel, "gemm()");
        assert_eq!(
            (kernels.kernels[0].energy_j, kernels.kernels[0].launches),
            (12.0, 2)
        );
        assert_eq!(kernels.kernels[0].window_ns, 40_000_000);
        assert_eq!(kernels.kernels[1].kernel, "(CUDA graph launches)");
        assert_eq!(kernels.kernels[1].energy_j, 3.0);
        assert_eq!(kernels.kernels[0].share, 0.4);
        assert_eq!(kernels.outside_windows_j, 15.0);
        let before = report.before_first_launch.unwrap();
        assert_eq!(
            (before.duration_ns, before.energy_j, before.mean_w),
            (30_000_000, 9.0, 300.0)
        );
    }

    fn kernel_line(device: u32, ts_ns: u64, dur_ns: u64, kernel: &str) -> GpuKernelLine {
        GpuKernelLine {
            device,
            ts_ns,
            dur_ns,
            kernel: kernel.into(),
            ..GpuKernelLine::default()
        }
    }

    #[test]
    fn with_gpu_kernels_get_the_energy_of_their_gpu_by_gpu_time() {
        let mut accumulator = PowerAccumulator::default();
        sampled(&mut accumulator);
        let (report, series) = accumulator.finish_with_series(&[]);
        let mut report = report.unwrap();
        // The command saw NVML GPU 1 (200 W, 2 J per 10 ms interval) as CUDA device 0.
        let header = GpuHeaderInfo {
            cuda_visible_devices: Some("1".into()),
            ..GpuHeaderInfo::default()
        };
        let mut energy = GpuTimeEnergy::new(&report, series, Some(&header));
        // 15..24 ms: alone in 10..20 ms (2 J), half the kernel time of 20..30 ms (1 J).
        energy.kernel(&kernel_line(0, 15_000_000, 9_000_000, "gemm"));
        // 26..30 ms: the other half.
        energy.kernel(&kernel_line(0, 26_000_000, 4_000_000, "relu"));
        // CUDA device 1 is not visible to the command: no GPU, no energy.
        energy.kernel(&kernel_line(1, 50_000_000, 1_000_000, "stray"));
        energy.finish(&mut report);
        let kernels = &report.kernels;
        assert_eq!((kernels.method, kernels.estimate), (GPU_TIME, false));
        let rows: Vec<(&str, f64, u64, u64)> = kernels
            .kernels
            .iter()
            .map(|k| (k.kernel.as_str(), k.energy_j, k.launches, k.window_ns))
            .collect();
        assert_eq!(
            rows,
            [
                ("gemm", 3.0, 1, 9_000_000),
                ("relu", 1.0, 1, 4_000_000),
                ("stray", 0.0, 1, 0),
            ]
        );
        // Everything else of the 30 J is idle: GPU 0 all of it, GPU 1 but 10..30 ms.
        assert_eq!(kernels.outside_windows_j, 26.0);
        assert_eq!(kernels.kernels[0].share, 0.1);
        assert_eq!((kernels.unsampled_ns, kernels.late_ns), (1_000_000, 0));
        let matched: Vec<(u32, Option<u32>, bool)> = kernels
            .devices
            .iter()
            .map(|d| (d.cuda_device, d.nvml_index, d.assumed))
            .collect();
        assert_eq!(matched, [(0, Some(1), true), (1, None, false)]);
    }

    #[test]
    fn a_tick_sums_its_devices_for_the_peak() {
        let mut accumulator = PowerAccumulator::default();
        accumulator.sample(&line(0, 0, 0, 100_000, Some(0)));
        accumulator.sample(&line(1, 0, 1, 50_000, Some(0)));
        accumulator.sample(&line(0, 1, 10, 120_000, Some(1)));
        accumulator.sample(&line(1, 1, 11, 90_000, Some(1)));
        accumulator.sample(&line(0, 3, 30, 150_000, Some(2)));
        let report = accumulator.finish(&[]).unwrap();
        assert_eq!((report.peak_w, report.peak_ts_ns), (210.0, 10));
        assert_eq!(report.devices[0].peak_w, 150.0);
        assert_eq!(
            report.devices[0].energy_source, "counter",
            "read without a header"
        );
    }

    #[test]
    fn errors_are_counted_by_field() {
        let mut accumulator = PowerAccumulator::default();
        let mut failed = line(0, 0, 0, 1, None);
        failed.power_mw = None;
        failed.errors.insert("power_mw".into(), "UNKNOWN".into());
        accumulator.sample(&failed);
        accumulator.sample(&line(0, 1, 10, 1, None));
        let report = accumulator.finish(&[]).unwrap();
        assert_eq!(report.read_errors, 1);
        assert_eq!(report.devices[0].errors["power_mw"], 1);
        assert_eq!(report.devices[0].samples, 2);
    }

    #[test]
    fn a_trace_without_power_has_no_report() {
        assert_eq!(PowerAccumulator::default().finish(&[]), None);
    }
}
