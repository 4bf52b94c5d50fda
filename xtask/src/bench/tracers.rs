//! What runs around the bench loop in an overhead condition: attached before the run, stopped
//! after it, and asked whether it saw every call.

use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use super::{
    bench_loop::{LOOP_PROGRAM, LoopReport},
    bpftrace::{self, Bpftrace},
    cudatrace::{Footer, cudatrace_run},
    env::Env,
    process::{Background, check_interrupted},
    tracefs::TracefsProbes,
};

/// A way of tracing the loop. Adding a kind of tracer is a variant here and an arm in each
/// method below; adding a condition that uses one is a row of `overhead::CONDITIONS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracer {
    /// Nothing: the baseline.
    None,
    /// The kernel's bare tracefs `p:` uprobe event, and with `returns` its `r:` one: the
    /// floors.
    TracefsFloor { returns: bool },
    /// `cudatrace run` of the loop, with these arguments before `--`, writing `trace` (a
    /// file in target/bench); with `bpf_stats`, `CUDATRACE_BPF_STATS=1`: cudatrace prints
    /// its programs' run time and count (the kernel's statistics, on for the run).
    CudatraceRun {
        args: &'static [&'static str],
        trace: &'static str,
        bpf_stats: bool,
    },
    /// bpftrace pairing entries and returns as cudatrace does.
    Bpftrace,
    /// Nothing on the loop, while `cudatrace run` traces another process that uses the same
    /// library (`cudatrace-driver sleep`): what a bystander pays.
    Bystander,
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
        bpf_stats: bool,
    },
    Bpftrace(Bpftrace),
    /// `cudatrace run` of another command, in the background, and its trace.
    Bystander {
        cudatrace: Background,
        trace: PathBuf,
    },
}

/// What a stopped tracer holds, to be checked against the loop's report.
pub enum Stopped {
    None,
    /// Records the tracefs instance took (entries and returns).
    TracefsFloor {
        records: u64,
        /// Events per call: 2 with the return probe, 1 without.
        per_call: u64,
    },
    CudatraceRun {
        trace: PathBuf,
    },
    /// bpftrace's output, with its histogram.
    Bpftrace {
        log: String,
    },
    /// The trace of the other command.
    Bystander {
        trace: PathBuf,
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
            Tracer::TracefsFloor { returns } => Attached::TracefsFloor(TracefsProbes::attach(
                target.tracefs,
                &env.libcuda,
                target.offset,
                returns,
            )?),
            Tracer::CudatraceRun {
                args,
                trace,
                bpf_stats,
            } => Attached::CudatraceRun {
                args,
                trace: env.out.join(trace),
                bpf_stats,
            },
            Tracer::Bpftrace => Attached::Bpftrace(Bpftrace::attach(
                &env.libcuda,
                env.out.join("bpftrace.txt"),
            )?),
            Tracer::Bystander => {
                let trace = env.out.join("bystander.jsonl");
                let cudatrace = start_other_command(env, &trace)?;
                Attached::Bystander { cudatrace, trace }
            }
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
            Attached::CudatraceRun {
                args,
                trace,
                bpf_stats,
            } => {
                let mut command = cudatrace_run(env, trace, args, loop_command);
                if *bpf_stats {
                    command.env("CUDATRACE_BPF_STATS", "1");
                }
                command
            }
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
                let per_call = probes.events_per_call();
                probes.detach()?;
                Stopped::TracefsFloor { records, per_call }
            }
            Attached::CudatraceRun { trace, .. } => Stopped::CudatraceRun { trace },
            Attached::Bpftrace(bpftrace) => Stopped::Bpftrace {
                log: bpftrace.stop()?,
            },
            Attached::Bystander {
                mut cudatrace,
                trace,
            } => {
                // SIGTERM: cudatrace passes it on to its command.
                cudatrace.stop_with(libc::SIGTERM)?;
                Stopped::Bystander { trace }
            }
        })
    }
}

/// Every call line of `trace` is its command's (the header's first pid): the loop beside
/// it was not traced.
fn check_only_the_command_is_traced(trace: &Path) -> Result<()> {
    let text = fs::read_to_string(trace)?;
    let mut lines = text.lines().map(serde_json::from_str::<serde_json::Value>);
    let header = lines.next().context("empty trace")??;
    let command = header["pids"][0].as_u64().context("no pid in the header")?;
    for line in lines {
        let line = line?;
        if line["type"] == "call" {
            ensure!(
                line["pid"].as_u64() == Some(command),
                "{} traced a call of pid {} beside its command {command}",
                trace.display(),
                line["pid"]
            );
        }
    }
    Ok(())
}

/// `cudatrace run -- cudatrace-driver sleep 3600` in the background, once the driver's
/// `cuInit` is in its trace (its probes are attached).
fn start_other_command(env: &Env, trace: &Path) -> Result<Background> {
    let _ = fs::remove_file(trace);
    let driver = env.standin.join("cudatrace-driver");
    let child = cudatrace_run(
        env,
        trace,
        &[],
        &[driver.as_os_str(), "sleep".as_ref(), "3600".as_ref()],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .spawn()
    .context("starting cudatrace run of cudatrace-driver sleep")?;
    let mut background = Background::new(child, "cudatrace run (bystander)");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        check_interrupted()?;
        let text = fs::read_to_string(trace).unwrap_or_default();
        if text.contains(r#""name":"cuInit""#) {
            return Ok(background);
        }
        if let Some(status) = background.try_wait()? {
            bail!("cudatrace run of cudatrace-driver sleep exited ({status}) before tracing");
        }
        ensure!(
            Instant::now() < deadline,
            "cudatrace run of cudatrace-driver sleep did not trace its cuInit in 120 s"
        );
        thread::sleep(Duration::from_millis(20));
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
            Stopped::TracefsFloor { records, per_call } => {
                ensure!(
                    records >= per_call * calls,
                    "the tracefs probes recorded {records} events for {calls} calls (expected {per_call} per call)",
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
            Stopped::Bystander { trace } => {
                Footer::read(&trace)?;
                check_only_the_command_is_traced(&trace)?;
                Tally {
                    recorded: None,
                    lost: None,
                }
            }
        })
    }
}
