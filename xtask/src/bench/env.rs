//! The paths and settings every part of the bench uses.

use std::path::PathBuf;

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
