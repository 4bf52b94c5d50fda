//! `cudatrace run --power[=MS]`: NVML's power, energy, clocks, utilisation, temperature
//! and memory of every GPU, sampled every MS milliseconds beside the trace.
//!
//! Every GPU NVML sees is sampled, not only those the traced processes use: which GPUs a
//! process will use is not known when tracing starts (it picks them as it runs, and
//! CUDA's ordinals need not be NVML's), and a busy neighbour on another GPU is worth
//! seeing. docs/power.md has the method and its limits.
//!
//! | file | |
//! |---|---|
//! | `library.rs` | finding `libnvidia-ml.so.1` and starting NVML (`--nvml`, the loader, the usual places) |
//! | `fields.rs` | what a sample reads, and the GPUs as the header describes them |
//! | `sampler.rs` | the sampling thread and its channel to the event loop |
//!
//! The lines are `"type":"power"` (`schema/power.rs`); the figures are computed by
//! `analysis/power/`, the same in `run`, `summary`, `export` and `plot`.

mod fields;
pub mod library;
pub mod sampler;

use std::{path::Path, time::Duration};

use self::{fields::Sampled, library::Loaded, sampler::Sampler};
use crate::schema::{NvmlInfo, PowerInfo};

/// The default sampling period, and the bounds of `--power=MS`.
pub const DEFAULT_PERIOD_MS: u32 = 20;
pub const MIN_PERIOD_MS: u32 = 1;
pub const MAX_PERIOD_MS: u32 = 60_000;

/// NVML started and the GPUs described, before the command starts.
pub struct PowerSetup {
    loaded: Loaded,
    sampled: Vec<Sampled>,
    pub info: PowerInfo,
}

impl PowerSetup {
    /// Loads NVML (`nvml`: `--nvml`) and describes every GPU; the error is one line.
    pub fn prepare(nvml: Option<&Path>, period_ms: u32) -> Result<PowerSetup, String> {
        let loaded = library::load(nvml).map_err(|e| e.to_string())?;
        let (devices, sampled) = fields::describe(&loaded.nvml)
            .map_err(|why| format!("NVML at {}: {why}", loaded.path.display()))?;
        let nvml_error = |e| library::error_name(&e);
        let info = PowerInfo {
            period_ms,
            nvml: NvmlInfo {
                path: loaded.path.display().to_string(),
                version: loaded.nvml.sys_nvml_version().unwrap_or_else(nvml_error),
                driver_version: loaded.nvml.sys_driver_version().unwrap_or_else(nvml_error),
                standin: loaded.standin,
            },
            devices,
        };
        Ok(PowerSetup {
            loaded,
            sampled,
            info,
        })
    }

    /// `N GPU(s) (names) every MS ms through PATH`, for the start line.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self
            .info
            .devices
            .iter()
            .map(|d| {
                let source = if d.energy_counter {
                    String::new()
                } else {
                    ", no energy counter: integrating power".to_owned()
                };
                format!("{} {}{source}", d.index, d.name)
            })
            .collect();
        let standin = if self.info.nvml.standin {
            " (cudatrace STAND-IN, not NVIDIA's NVML)"
        } else {
            ""
        };
        format!(
            "power of {} ({}) every {} ms through {}{standin}",
            crate::format::plural(self.info.devices.len() as u64, "GPU"),
            names.join("; "),
            self.info.period_ms,
            self.info.nvml.path
        )
    }

    /// Starts the sampling thread.
    pub fn start(self) -> std::io::Result<(Sampler, tokio::sync::mpsc::Receiver<sampler::Batch>)> {
        let period = Duration::from_millis(u64::from(self.info.period_ms));
        Sampler::start(self.loaded, self.sampled, period)
    }
}

/// `--power=MS`: a whole number of milliseconds in bounds.
pub fn parse_period(text: &str) -> Result<u32, String> {
    let bounds = format!(
        "give the sampling period in whole milliseconds, {MIN_PERIOD_MS} to {MAX_PERIOD_MS} (default {DEFAULT_PERIOD_MS}: --power alone)"
    );
    let ms: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number: {bounds}"))?;
    if !(MIN_PERIOD_MS..=MAX_PERIOD_MS).contains(&ms) {
        return Err(format!("{ms} ms is out of range: {bounds}"));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_checked() {
        assert_eq!(parse_period("20"), Ok(20));
        assert_eq!(parse_period("1"), Ok(1));
        assert_eq!(parse_period("60000"), Ok(60000));
        assert_eq!(
            parse_period("0"),
            Err("0 ms is out of range: give the sampling period in whole milliseconds, 1 to 60000 (default 20: --power alone)".into())
        );
        assert!(
            parse_period("60001")
                .unwrap_err()
                .starts_with("60001 ms is out of range")
        );
        assert!(
            parse_period("2.5")
                .unwrap_err()
                .starts_with("\"2.5\" is not a number")
        );
        assert!(
            parse_period("-3")
                .unwrap_err()
                .starts_with("\"-3\" is not a number")
        );
    }
}
