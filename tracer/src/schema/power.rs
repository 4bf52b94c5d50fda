//! `"type":"power"` (`cudatrace run --power`): one NVML sample of one GPU. Also the
//! header's `power` object (the library, the devices); the footer's (the sampler's
//! figures) is in `footer.rs`, with the footer's other objects.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    fields::{LineType, Tag},
    footer::{EventLine, Footer},
};

/// One sample of one device. A field NVML could not give this time is left out and named
/// in `errors`; a field the device does not support at all is left out of every line
/// (the header lists it in the device's `unsupported`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PowerLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    /// NVML's device index (the header's `power.devices[].index`).
    pub device: u32,
    /// The sampler's tick: samples of all devices taken in one tick share it; a tick the
    /// sampler was too late for is skipped (a gap in `seq`).
    pub seq: u64,
    /// CLOCK_MONOTONIC, read right after this device's NVML reads.
    pub ts_ns: u64,
    /// How long this device's NVML reads took.
    pub read_ns: u64,
    /// `nvmlDeviceGetPowerUsage`: on Ampere (but GA100) and newer, Hopper included, an
    /// average over the last second; instantaneous on older GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_mw: Option<u32>,
    /// The field `NVML_FI_DEV_POWER_INSTANT`: the power now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_instant_mw: Option<u32>,
    /// `nvmlDeviceGetTotalEnergyConsumption`: mJ since the driver was loaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy_mj: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_clock_mhz: Option<u32>,
    /// `nvmlDeviceGetUtilizationRates`: the share of NVML's last sample period (1/6 s to
    /// 1 s, by product) in which a kernel ran / device memory was read or written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_util_pct: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_util_pct: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_used_bytes: Option<u64>,
    /// Field name → the NVML error of this read (`UNKNOWN`, `GPU_IS_LOST`, ...).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, String>,
}

impl LineType for PowerLine {
    const TYPE: &'static str = "power";
}

impl EventLine for PowerLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.power += 1;
    }
}

impl PowerLine {
    /// The power the curves and the fallback integration use: the instantaneous reading
    /// where the device has it, else `power_mw`.
    pub fn best_power_mw(&self) -> Option<u32> {
        self.power_instant_mw.or(self.power_mw)
    }

    pub(super) fn read(value: &Value, bytes: &[u8]) -> Result<Self, String> {
        let number = |key: &str| value.get(key).and_then(Value::as_u64);
        let device = number("device").ok_or("power line: no \"device\" number")?;
        u32::try_from(device).map_err(|_| "power line: device out of range")?;
        number("ts_ns").ok_or("power line: no \"ts_ns\" number")?;
        serde_json::from_slice(bytes).map_err(|e| format!("power line: {e}"))
    }
}

/// The header's `power` object: what `--power` samples, and with which library.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PowerInfo {
    /// The sampling period.
    pub period_ms: u32,
    pub nvml: NvmlInfo,
    pub devices: Vec<PowerDevice>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NvmlInfo {
    /// The library loaded (symbolic links resolved).
    pub path: String,
    /// `nvmlSystemGetNVMLVersion`.
    pub version: String,
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: String,
    /// True for cudatrace's stand-in library (tests), not NVIDIA's NVML.
    pub standin: bool,
}

/// A sampled GPU, as NVML describes it when tracing starts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PowerDevice {
    /// NVML's index (PCI bus order; CUDA's ordinals may differ: match by `uuid`).
    pub index: u32,
    pub name: String,
    pub uuid: String,
    /// `nvmlDeviceGetPowerManagementLimit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_limit_mw: Option<u32>,
    /// Whether `nvmlDeviceGetTotalEnergyConsumption` works on this device.
    pub energy_counter: bool,
    /// Where its energy figures come from: `counter`, or `integrated power` when the
    /// counter is not supported (the trapezoid rule over the samples' power).
    pub energy_source: String,
    /// Fields this device does not give (`field: NVML error`), left out of its lines.
    pub unsupported: Vec<String>,
}

/// `energy_source` values.
pub const ENERGY_FROM_COUNTER: &str = "counter";
pub const ENERGY_FROM_POWER: &str = "integrated power";
