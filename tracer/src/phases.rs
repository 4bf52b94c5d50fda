//! `CUDATRACE_PHASES=1` (hidden, for the benchmarks): when each phase of a run was reached,
//! in ms since the run began, on stderr as `cudatrace-phase NAME ms=N.N mono_ns=N`, so that
//! attach and detach latency split into their steps (`workloads/attach_gpu.sh` reads them).
//! `mono_ns` is `CLOCK_MONOTONIC`, the trace's clock.

use std::{sync::OnceLock, time::Instant};

/// The environment variable that asks for the phase lines.
pub const ENV: &str = "CUDATRACE_PHASES";

/// When the run began, when the lines were asked for.
static BEGAN: OnceLock<Option<Instant>> = OnceLock::new();

/// Starts the clock (the run's first step); the lines print only when asked for.
pub fn begin() {
    BEGAN.get_or_init(|| {
        std::env::var_os(ENV)
            .is_some_and(|v| !v.is_empty() && v != "0")
            .then(Instant::now)
    });
}

/// Says that phase `name` was reached.
pub fn reached(name: &str) {
    if let Some(Some(began)) = BEGAN.get() {
        eprintln!(
            "cudatrace-phase {name} ms={:.1} mono_ns={}",
            began.elapsed().as_secs_f64() * 1e3,
            crate::clock::monotonic_ns()
        );
    }
}
