//! `cudatrace-bench-loop` (standin/bench_loop.c): the program every part traces, and the
//! JSON line it ends with.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The function every loop calls: the launch, the hot path of a real workload (eleven
/// arguments, five on the stack).
pub const FUNCTION: &str = "cuLaunchKernel";
/// Untimed calls each loop thread makes first (`WARMUP` in standin/bench_loop.c).
pub const WARMUP: u64 = 1000;
pub const LOOP_PROGRAM: &str = "cudatrace-bench-loop";

/// The JSON line `cudatrace-bench-loop` prints, as it prints it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct LoopReport {
    /// Timed calls, all threads together.
    pub calls: u64,
    pub threads: u64,
    /// Wall time of the timed calls.
    pub ns: u64,
    pub ns_per_call: f64,
    pub calls_per_s: f64,
    pub user_ns: u64,
    pub sys_ns: u64,
    /// The loop process's own CPU time (`getrusage`), warm-up included.
    pub process_cpu_ns: u64,
}

impl LoopReport {
    /// The report in the loop's stdout: its last line that starts like one.
    pub fn parse(stdout: &str) -> Result<Self> {
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.starts_with("{\"calls\""))
            .with_context(|| format!("no report from {LOOP_PROGRAM} in {stdout:?}"))?;
        serde_json::from_str(line).with_context(|| format!("reading {LOOP_PROGRAM}'s {line}"))
    }

    /// All calls including the warm-up ones, as the tracers see them.
    pub fn traced_calls(&self) -> u64 {
        self.calls + WARMUP * self.threads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_report_line_is_read_and_warm_up_calls_are_counted() {
        let stdout = "starting\n\
            {\"calls\":20000,\"threads\":2,\"ns\":60000,\"ns_per_call\":3.0,\"calls_per_s\":333333333.3,\
            \"user_ns\":50000,\"sys_ns\":7,\"process_cpu_ns\":900000}\n";
        let report = LoopReport::parse(stdout).unwrap();
        assert_eq!(report.calls, 20000);
        assert_eq!(report.sys_ns, 7);
        assert_eq!(report.ns_per_call, 3.0);
        assert_eq!(report.traced_calls(), 20000 + 2 * WARMUP);
    }

    #[test]
    fn a_report_missing_a_field_is_an_error_naming_the_line() {
        let error = LoopReport::parse("{\"calls\":1,\"threads\":1}").unwrap_err();
        assert!(
            format!("{error:#}").contains("missing field `ns`"),
            "{error:#}"
        );
    }
}
