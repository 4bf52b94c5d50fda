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

mod gpu_time;
mod report;

pub use gpu_time::GpuTimeEnergy;
pub use report::*;

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::{
    energy::{EnergySeries, Integrator},
    role::Role,
    stages::ProcessStages,
};
use crate::schema::{
    CallLine, ENERGY_FROM_COUNTER, ENERGY_FROM_POWER, PowerInfo, PowerLine, ProcessEvent,
};

/// The label of the launch-window estimate.
pub const LAUNCH_WINDOWS: &str = "launch windows (estimate: no --gpu)";
/// The label of the split by GPU time (`--gpu`).
pub const GPU_TIME: &str = "GPU time (--gpu)";
/// A sample interval's energy is shared out once a kernel that ended this long after it
/// has been read on its GPU: `run` writes a kernel's line at most about 30 s after it
/// ended (the linker's longest wait), so later kernel time in it is not expected.
pub const KERNEL_HOLD_NS: u64 = 60_000_000_000;

/// How often a reading changes: the times between its changes, from the samples. NVML
/// updates its readings on its own schedule (every 100 ms on an H100, whatever the
/// sample period), so energy is known only to within one such step.
#[derive(Default)]
struct ReadingSteps {
    /// The last value and when it last changed.
    last: Option<(u64, Option<u64>)>,
    /// The first [`MAX_STEPS`] times between changes.
    steps: Vec<u64>,
}

/// Steps kept for the median: a few minutes of 100 ms steps.
const MAX_STEPS: usize = 4096;

impl ReadingSteps {
    fn observe(&mut self, ts_ns: u64, value: u64) {
        let Some((last, changed)) = &mut self.last else {
            // The first value: when it came to be is not known.
            self.last = Some((value, None));
            return;
        };
        if *last == value {
            return;
        }
        if let Some(previous) = *changed
            && self.steps.len() < MAX_STEPS
        {
            self.steps.push(ts_ns.saturating_sub(previous));
        }
        *last = value;
        *changed = Some(ts_ns);
    }

    /// The median time between changes; `None` before two changes.
    fn median_ns(&self) -> Option<u64> {
        let mut steps = self.steps.clone();
        steps.sort_unstable();
        steps.get(steps.len().checked_sub(1)? / 2).copied()
    }
}

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
    /// How often the counter's and the integrated power's readings change.
    counter_steps: ReadingSteps,
    power_steps: ReadingSteps,
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

    /// The median time between changes of the readings [`energy`](Self::energy) comes
    /// from.
    fn step_ns(&self) -> Option<u64> {
        if self.uses_counter() {
            self.counter_steps.median_ns()
        } else {
            self.power_steps.median_ns()
        }
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
    /// The traced command's life: its first exec and its processes' last exit.
    first_exec_ns: Option<u64>,
    last_exit_ns: Option<u64>,
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
            Role::Sync(_) if sampled => self.windows.close(end),
            _ => {}
        }
    }

    /// A process line: the command's life runs from its first exec to its last exit.
    pub fn process(&mut self, ts_ns: u64, event: &ProcessEvent) {
        match event {
            ProcessEvent::Exec => {
                self.first_exec_ns = Some(self.first_exec_ns.map_or(ts_ns, |t| t.min(ts_ns)));
            }
            ProcessEvent::Exit => {
                self.last_exit_ns = Some(self.last_exit_ns.map_or(ts_ns, |t| t.max(ts_ns)));
            }
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
            device.counter_steps.observe(line.ts_ns, energy);
            let origin = *device.counter_origin.get_or_insert(energy);
            device
                .counter
                .push(line.ts_ns, energy as f64 - origin as f64);
        }
        if let Some(power) = line.best_power_mw() {
            device.power_steps.observe(line.ts_ns, power.into());
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
        // The coarsest device's: a stage's energy sums every device's.
        let step_ns = self.devices.values().filter_map(DeviceState::step_ns).max();

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
                            within_one_step: step_ns.is_some_and(|step| stage.duration_ns < step),
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

        // The command's life, within the samples: the headline; the sampler's own start-up
        // and teardown around it are shown apart.
        let window = |start: u64, end: u64| {
            let (energy_mj, covered_ns) = energy_in(start, end);
            Window {
                start_ns: start,
                duration_ns: end - start,
                energy_j: energy_mj / 1e3,
                mean_w: watts(energy_mj, covered_ns),
            }
        };
        let life = match (first, last, self.first_exec_ns, self.last_exit_ns) {
            (Some(first), Some(last), Some(exec), Some(exit)) => {
                let (start, end) = (exec.max(first), exit.min(last));
                (end > start).then_some((first, start, end, last))
            }
            _ => None,
        };
        let command = life.map(|(_, start, end, _)| window(start, end));
        let before_command = life.map(|(first, start, _, _)| window(first, start));
        let after_command = life.map(|(_, _, end, last)| window(end, last));
        let devices: Vec<DeviceEnergy> = devices
            .into_iter()
            .map(|mut device| {
                device.command_j = life.and_then(|(_, start, end, _)| {
                    let state = self.devices.get(&device.index)?;
                    Some(state.energy().between(start, end) / 1e3)
                });
                device
            })
            .collect();

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
            step_ns,
            read_errors,
            devices,
            before_first_launch,
            command,
            before_command,
            after_command,
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
        command_j: None,
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

#[cfg(test)]
mod tests;
