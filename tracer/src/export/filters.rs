//! `--pid`, `--name`, `--start-ms` and `--end-ms`: which events an export keeps
//! (`--gpu-sample-us`: how finely GPU time is kept as stack samples).

use super::timeline::GPU_SAMPLE_NS;

/// Which events to keep. Times are nanoseconds since the export's time base.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filters {
    pub pids: Vec<u32>,
    /// Substrings of a call's function or slice name (case-sensitive); any one matches.
    pub names: Vec<String>,
    pub start_ns: Option<u64>,
    pub end_ns: Option<u64>,
    /// `--gpu-sample-us`: how much of a stack's GPU time one GPU-time sample stands for
    /// (how finely it is kept); `None`: [`GPU_SAMPLE_NS`].
    pub gpu_sample_us: Option<u64>,
}

impl Filters {
    pub fn pid(&self, pid: u32) -> bool {
        self.pids.is_empty() || self.pids.contains(&pid)
    }

    pub fn name(&self, function: &str, label: &str) -> bool {
        self.names.is_empty()
            || self
                .names
                .iter()
                .any(|n| function.contains(n.as_str()) || label.contains(n.as_str()))
    }

    /// A slice overlapping the window is kept whole.
    pub fn span(&self, ts: u64, dur: u64) -> bool {
        self.start_ns
            .is_none_or(|start| ts.saturating_add(dur) >= start)
            && self.end_ns.is_none_or(|end| ts <= end)
    }

    /// The GPU time one GPU-time sample stands for.
    pub fn gpu_sample_ns(&self) -> u64 {
        self.gpu_sample_us
            .map_or(GPU_SAMPLE_NS, |us| us.saturating_mul(1_000).max(1))
    }

    pub fn before_window(&self, ts: u64) -> bool {
        self.start_ns.is_some_and(|start| ts < start)
    }
}
