//! What `--power` gives: `cudatrace summary --json`'s `power` object and its parts.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::analysis::device_map::DeviceMatch;
use crate::schema::NvmlInfo;

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
    /// The median time between changes of the readings the energy comes from (the
    /// counter, or the power integrated), the coarsest GPU's: energy is known to within
    /// one such step. Absent before two changes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_ns: Option<u64>,
    /// NVML reads that failed during sampling.
    pub read_errors: u64,
    pub devices: Vec<DeviceEnergy>,
    /// From the first sample to the first launch (all GPUs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_first_launch: Option<Window>,
    /// The traced command's life, its first exec to its last exit (within the samples),
    /// all GPUs: what the command cost. Absent where the trace has no exec and exit
    /// (`-p`, `--all`, a run stopped by a signal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<Window>,
    /// The sampler's margins around the command's life: from its first sample to the
    /// exec, and from the last exit to its last sample (cudatrace's own start-up and
    /// teardown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_command: Option<Window>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_command: Option<Window>,
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
    /// Its energy over the command's life ([`PowerReport::command`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command_j: Option<f64>,
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
    /// Shorter than one step of the readings ([`PowerReport::step_ns`]): its energy is a
    /// share of the step it falls in, by time, not a measurement of the stage.
    pub within_one_step: bool,
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
