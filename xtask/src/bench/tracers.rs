//! What runs around the bench loop in an overhead condition: attached before the run, stopped
//! after it, and asked whether it saw every call.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Result, ensure};

use super::{
    bench_loop::{LOOP_PROGRAM, LoopReport},
    bpftrace::{self, Bpftrace},
    cudatrace::{Footer, cudatrace_run},
    env::Env,
    tracefs::TracefsProbes,
};

/// A way of tracing the loop. Adding a kind of tracer is a variant here and an arm in each
/// method below; adding a condition that uses one is a row of `overhead::CONDITIONS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracer {
    /// Nothing: the baseline.
    None,
    /// The kernel's bare tracefs `p:` + `r:` uprobe events: the floor.
    TracefsFloor,
    /// `cudatrace run` of the loop, with these arguments before `--`, writing `trace` (a
    /// file in target/bench).
    CudatraceRun {
        args: &'static [&'static str],
        trace: &'static str,
    },
    /// bpftrace pairing entries and returns as cudatrace does.
    Bpftrace,
}

/// Where a tracer attaches: the function's library and its file offset.
pub struct AttachPoint<'a> {
    pub env: &'a Env,
    /// The tracefs mount.
    pub tracefs: &'a Path,
    /// The file offset of the loop's function in the stand-in (tracefs takes offsets).
    pub offset: u64,
}

/// A tracer attached for one run of the loop.
pub enum Attached {
    None,
    TracefsFloor(TracefsProbes),
    CudatraceRun {
        args: &'static [&'static str],
        trace: PathBuf,
    },
    Bpftrace(Bpftrace),
}

/// What a stopped tracer holds, to be checked against the loop's report.
pub enum Stopped {
    None,
    /// Records the tracefs instance took (entries and returns).
    TracefsFloor {
        records: u64,
    },
    CudatraceRun {
        trace: PathBuf,
    },
    /// bpftrace's output, with its histogram.
    Bpftrace {
        log: String,
    },
}

/// Events a tracer recorded for a run, and those it says it lost.
pub struct Tally {
    /// tracefs: entry + return records; cudatrace: call lines; bpftrace: histogram entries.
    pub recorded: Option<u64>,
    pub lost: Option<u64>,
}

impl Tracer {
    pub fn attach(self, target: &AttachPoint) -> Result<Attached> {
        let env = target.env;
        Ok(match self {
            Tracer::None => Attached::None,
            Tracer::TracefsFloor => Attached::TracefsFloor(TracefsProbes::attach(
                target.tracefs,
                &env.libcuda,
                target.offset,
            )?),
            Tracer::CudatraceRun { args, trace } => Attached::CudatraceRun {
                args,
                trace: env.out.join(trace),
            },
            Tracer::Bpftrace => Attached::Bpftrace(Bpftrace::attach(
                &env.libcuda,
                env.out.join("bpftrace.txt"),
            )?),
        })
    }

    /// Runs of this tracer that fail are run again, up to this many tries in all:
    /// bpftrace 0.17 once ignored SIGINT here.
    pub fn tries(self) -> u32 {
        match self {
            Tracer::Bpftrace => 3,
            _ => 1,
        }
    }
}

impl Attached {
    /// The command that runs the loop (`loop_command`, program first) under this tracer.
    pub fn command(&self, env: &Env, loop_command: &[OsString]) -> Command {
        match self {
            Attached::CudatraceRun { args, trace } => cudatrace_run(env, trace, args, loop_command),
            _ => {
                let mut command = Command::new(&loop_command[0]);
                command.args(&loop_command[1..]);
                command
            }
        }
    }

    /// The program whose exit status says whether the run worked.
    pub fn runs_as(&self) -> &'static str {
        match self {
            Attached::CudatraceRun { .. } => "cudatrace run",
            _ => LOOP_PROGRAM,
        }
    }

    /// Stops tracing (detaches, or stops the background tracer) and keeps what it counted.
    pub fn stop(self) -> Result<Stopped> {
        Ok(match self {
            Attached::None => Stopped::None,
            Attached::TracefsFloor(probes) => {
                let records = probes.recorded()?;
                probes.detach()?;
                Stopped::TracefsFloor { records }
            }
            Attached::CudatraceRun { trace, .. } => Stopped::CudatraceRun { trace },
            Attached::Bpftrace(bpftrace) => Stopped::Bpftrace {
                log: bpftrace.stop()?,
            },
        })
    }
}

impl Stopped {
    /// Checks that the tracer saw every call the loop made.
    pub fn tally(self, report: &LoopReport) -> Result<Tally> {
        let calls = report.traced_calls();
        Ok(match self {
            Stopped::None => Tally {
                recorded: None,
                lost: None,
            },
            Stopped::TracefsFloor { records } => {
                ensure!(
                    records >= 2 * calls,
                    "the tracefs probes recorded {records} events for {calls} calls (expected 2 per call)",
                );
                Tally {
                    recorded: Some(records),
                    lost: None,
                }
            }
            Stopped::CudatraceRun { trace } => {
                let footer = Footer::read(&trace)?;
                ensure!(
                    footer.events.call + footer.lost.calls == calls,
                    "cudatrace saw {} calls + {} lost for {calls} made",
                    footer.events.call,
                    footer.lost.calls,
                );
                Tally {
                    recorded: Some(footer.events.call),
                    lost: Some(footer.lost.calls),
                }
            }
            Stopped::Bpftrace { log } => Tally {
                recorded: Some(bpftrace::check_histogram(&log, calls)?),
                lost: None,
            },
        })
    }
}
