//! `cudatrace summary --json`: the report's parts as one object, sections present only
//! where the trace has them.

use serde::Serialize;

use crate::{
    analysis::{
        devices::DevicesSummary, driver::DriverSummary, gpu::GpuSummary, nccl::CollectivesSummary,
        power::PowerReport, ranks::JobReport, stages::ProcessStages, summarise::TraceInfo,
        summary::Summary,
    },
    schema::ProcessMemory,
};

/// `cudatrace summary --json`.
#[derive(Serialize)]
pub struct SummaryJson<'a> {
    pub trace: &'a TraceInfo,
    #[serde(flatten)]
    pub summary: &'a Summary,
    pub memory: &'a [ProcessMemory],
    pub stages: &'a [ProcessStages],
    /// Present for `--kernel` traces.
    #[serde(skip_serializing_if = "is_empty_driver")]
    pub driver: &'a DriverSummary,
    /// Present for `--gpu` traces.
    #[serde(skip_serializing_if = "is_empty_gpu")]
    pub gpu: &'a GpuSummary,
    /// Present for `--power` traces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<&'a PowerReport>,
    /// Present for traces with NCCL collectives.
    #[serde(skip_serializing_if = "is_empty_collectives")]
    pub collectives: &'a CollectivesSummary,
    /// Present when calls went to more than one device.
    #[serde(skip_serializing_if = "single_device")]
    pub devices: &'a DevicesSummary,
    /// Present when a communicator has several ranks in the trace: who waited for whom.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<&'a JobReport>,
}

pub(super) fn single_device(devices: &&DevicesSummary) -> bool {
    devices.rows.len() < 2
}

fn is_empty_collectives(collectives: &&CollectivesSummary) -> bool {
    collectives.rows.is_empty()
}

fn is_empty_gpu(gpu: &&GpuSummary) -> bool {
    gpu.work == 0 && gpu.processes.is_empty() && gpu.errors.is_empty()
}

fn is_empty_driver(driver: &&DriverSummary) -> bool {
    driver.events == 0
}
