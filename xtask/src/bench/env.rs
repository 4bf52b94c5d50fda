//! The paths and settings every part of the bench uses.

use std::{ffi::OsString, path::PathBuf};

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
    /// `cudatrace-bench-loop` with these arguments: `N [RATE THREADS]`.
    pub fn loop_command(&self, args: &[u64]) -> Vec<OsString> {
        let args = args.iter().map(|n| OsString::from(n.to_string()));
        std::iter::once(self.bench_loop.clone().into_os_string())
            .chain(args)
            .collect()
    }
}
