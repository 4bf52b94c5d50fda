//! `--power` lines as counter tracks: each GPU a group of its own (`GPU N: NAME`, shared
//! with `--gpu`'s stream tracks) with power, instant power, energy, clocks, utilisation,
//! temperature and memory used.

use std::collections::HashMap;

use super::timeline::GpuCounter;
use crate::{
    analysis::energy::Integrator,
    schema::{Header, PowerInfo, PowerLine},
};

#[derive(Default)]
struct DeviceTrack {
    announced: bool,
    use_counter: Option<bool>,
    counter_origin: Option<u64>,
    integrator: Integrator,
}

/// The GPUs' tracks: their names and the energy drawn so far.
#[derive(Default)]
pub struct GpuTracks {
    info: Option<PowerInfo>,
    devices: HashMap<u32, DeviceTrack>,
}

impl GpuTracks {
    pub fn header(&mut self, header: &Header) {
        self.info = header.power.clone();
    }

    /// The group's name: `GPU 0: NVIDIA H100 80GB HBM3`.
    pub fn name(&self, device: u32) -> String {
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
