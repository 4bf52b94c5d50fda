//! Energy per kernel name by GPU time (`--power --gpu`).

use std::collections::BTreeMap;

use super::{GPU_TIME, KERNEL_HOLD_NS, KernelEnergy, KernelEnergyReport, PowerReport};
use crate::analysis::{
    device_map::{DeviceMap, DeviceMatch},
    energy::{EnergySeries, GpuTimeSplitter, KernelInterval},
};
use crate::schema::{GpuHeaderInfo, GpuKernelLine};

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
