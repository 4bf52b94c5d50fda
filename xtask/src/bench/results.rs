//! target/bench/results.json: one document with every part's results. BENCHMARKS.md and
//! scripts read its keys; a part that did not run has no key.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{
    gpu::GpuResults, overhead::OverheadResults, procfs::Machine, rate::RateResults,
    resources::ResourceResults, stacks::StacksResults, trace_tools::TraceToolResults,
    tracefs::TracefsAfter,
};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Results {
    /// UTC, `date -u +%Y-%m-%dT%H:%M:%SZ`.
    pub date: String,
    pub machine: Machine,
    pub options: RunOptions,
    /// The function every loop calls.
    pub function: String,
    /// The stand-in libcuda traced.
    pub libcuda: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<OverheadResults>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateResults>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceResults>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceToolResults>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacks: Option<StacksResults>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuResults>,
    /// Checked after the parts, whether they worked or not.
    pub tracefs_after: TracefsAfter,
    pub bench_seconds: f64,
}

/// The command line's settings, and the loop threads of the rate and resource parts.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RunOptions {
    pub calls: u64,
    pub rounds: usize,
    pub rate_seconds: f64,
    pub resource_calls: u64,
    pub trace_events: u64,
    pub trace_rounds: usize,
    pub threads: u64,
}
