//! `--power` lines as counter tracks: each GPU a group of its own (`GPU N: NAME`, shared
//! with `--gpu`'s stream tracks) with power, instant power, energy, clocks, utilisation,
//! temperature and memory used.

use std::collections::HashMap;

use super::timeline::GpuCounter;
use crate::{
    analysis::{device_map::DeviceMap, energy::Integrator},
    schema::{Header, PowerInfo, PowerLine},
};

/// Groups of CUDA devices that match no NVML GPU (`--power --gpu`) are numbered from here.
const UNMATCHED_GROUPS: u32 = 1 << 16;

#[derive(Default)]
struct DeviceTrack {
    announced: bool,
    use_counter: Option<bool>,
    counter_origin: Option<u64>,
    integrator: Integrator,
}

/// The GPUs' groups and tracks: their names, the energy drawn so far, and (`--power
/// --gpu`) which group each CUDA device's streams go to.
#[derive(Default)]
pub struct GpuTracks {
    info: Option<PowerInfo>,
    devices: HashMap<u32, DeviceTrack>,
    /// `--power --gpu`: which NVML GPU each CUDA device is.
    map: Option<DeviceMap>,
    groups: HashMap<u32, u32>,
}

impl GpuTracks {
    pub fn header(&mut self, header: &Header) {
        self.info = header.power.clone();
        self.map = match (&header.power, &header.gpu) {
            (Some(power), Some(gpu)) => Some(DeviceMap::new(
                power
                    .devices
                    .iter()
                    .map(|d| (d.index, d.uuid.clone()))
                    .collect(),
                gpu.cuda_visible_devices.as_deref(),
                gpu.cuda_device_order.as_deref(),
            )),
            _ => None,
        };
    }

    /// The group of CUDA device `cuda_device`'s streams: its NVML GPU's in a `--power`
    /// trace (as the summary matches them: `analysis::device_map`), a group of its own
    /// where it matches none; without `--power`, the device's number.
    pub fn group_of(&mut self, cuda_device: u32) -> u32 {
        let Some(map) = &self.map else {
            return cuda_device;
        };
        *self.groups.entry(cuda_device).or_insert_with(|| {
            map.nvml(cuda_device)
                .nvml_index
                .unwrap_or(UNMATCHED_GROUPS + cuda_device)
        })
    }

    /// The group's name: `GPU 0: NVIDIA H100 80GB HBM3`.
    pub fn name(&self, device: u32) -> String {
        if let Some(cuda_device) = device.checked_sub(UNMATCHED_GROUPS) {
            return format!("CUDA device {cuda_device} (matches no NVML GPU)");
        }
        let name = self
            .info
            .as_ref()
            .and_then(|info| info.devices.iter().find(|d| d.index == device))
            .map(|d| d.name.as_str())
            .filter(|name| !name.is_empty());
        match name {
            Some(name) => format!("GPU {device}: {name}"),
            None => format!("GPU {device}"),
        }
    }

    /// True the first time `device` is seen: its group needs naming.
    pub fn first_sight(&mut self, device: u32) -> bool {
        let track = self.devices.entry(device).or_default();
        !std::mem::replace(&mut track.announced, true)
    }

    /// The line's values, track by track. Energy is J since the device's first sample:
    /// the counter's where the device has one (the header says), else integrated power.
    pub fn values(&mut self, line: &PowerLine) -> Vec<(GpuCounter, f64)> {
        let counter_supported = self.info.as_ref().map(|info| {
            info.devices
                .iter()
                .any(|d| d.index == line.device && d.energy_counter)
        });
        let track = self.devices.entry(line.device).or_default();
        let use_counter = *track
            .use_counter
            .get_or_insert(counter_supported.unwrap_or(line.energy_mj.is_some()));
        let energy_j = if use_counter {
            line.energy_mj.map(|mj| {
                let origin = *track.counter_origin.get_or_insert(mj);
                mj.saturating_sub(origin) as f64 / 1e3
            })
        } else {
            line.best_power_mw()
                .map(|mw| track.integrator.push(line.ts_ns, mw) / 1e3)
        };
        let watts = |mw: Option<u32>| mw.map(|mw| f64::from(mw) / 1e3);
        let number = |n: Option<u32>| n.map(f64::from);
        [
            (GpuCounter::Power, watts(line.power_mw)),
            (GpuCounter::InstantPower, watts(line.power_instant_mw)),
            (GpuCounter::Energy, energy_j),
            (GpuCounter::SmClock, number(line.sm_clock_mhz)),
            (GpuCounter::MemClock, number(line.mem_clock_mhz)),
            (GpuCounter::GpuUtilization, number(line.gpu_util_pct)),
            (GpuCounter::MemUtilization, number(line.mem_util_pct)),
            (GpuCounter::Temperature, number(line.temperature_c)),
            (
                GpuCounter::MemoryUsed,
                line.memory_used_bytes.map(|bytes| bytes as f64),
            ),
        ]
        .into_iter()
        .filter_map(|(counter, value)| value.map(|value| (counter, value)))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{GpuHeaderInfo, PowerDevice};

    fn header(gpus: u32, visible: Option<&str>, power: bool) -> Header {
        Header {
            power: power.then(|| PowerInfo {
                devices: (0..gpus)
                    .map(|index| PowerDevice {
                        index,
                        name: format!("gpu{index}"),
                        ..PowerDevice::default()
                    })
                    .collect(),
                ..PowerInfo::default()
            }),
            gpu: Some(GpuHeaderInfo {
                cuda_visible_devices: visible.map(str::to_owned),
                ..GpuHeaderInfo::default()
            }),
            ..Header::default()
        }
    }

    #[test]
    fn cuda_devices_join_the_group_of_their_nvml_gpu() {
        let mut tracks = GpuTracks::default();
        tracks.header(&header(2, Some("1,MIG-x"), true));
        assert_eq!(tracks.group_of(0), 1);
        assert_eq!(tracks.name(1), "GPU 1: gpu1");
        let unmatched = tracks.group_of(1);
        assert_eq!(unmatched, UNMATCHED_GROUPS + 1);
        assert_eq!(
            tracks.name(unmatched),
            "CUDA device 1 (matches no NVML GPU)"
        );
        // Without --power, a CUDA device is its own group, by its number.
        let mut tracks = GpuTracks::default();
        tracks.header(&header(2, Some("1"), false));
        assert_eq!(
            (tracks.group_of(0), tracks.name(0)),
            (0, "GPU 0".to_owned())
        );
    }
}
