//! The paths and settings every part of the bench uses.

use std::{ffi::OsString, path::PathBuf};

use super::bench_loop::FUNCTION;

/// Paths and settings every part uses.
pub struct Env {
    /// target/bench: traces, logs and results.json.
    pub out: PathBuf,
    /// The release `cudatrace`.
    pub cudatrace: PathBuf,
    /// The stand-in libcuda, canonical (uprobes attach by path).
    pub libcuda: PathBuf,
    /// The stand-in's build folder (target/standin).
    pub standin: PathBuf,
    /// `cudatrace-bench-loop`.
    pub bench_loop: PathBuf,
    /// Loop threads for the rate and resource parts: one per CPU.
    pub threads: u64,
}

impl Env {
    /// `cudatrace-bench-loop CALLS [RATE [THREADS]]` with the defaults filled in (rate 0:
    /// flat out; 1 thread) and [`FUNCTION`] last.
    pub fn loop_command(&self, args: &[u64]) -> Vec<OsString> {
        let mut numbers = [0, 0, 1];
        numbers[..args.len()].copy_from_slice(args);
        std::iter::once(self.bench_loop.clone().into_os_string())
            .chain(numbers.iter().map(|n| OsString::from(n.to_string())))
            .chain(std::iter::once(OsString::from(FUNCTION)))
            .collect()
    }
}
