//! `cudatrace run`, in phases over typed values: check → prepare → start → trace → finish.
//! The flags are read once, here, into what each phase needs; each phase returns what the
//! next needs, and each stage of tracing returns its own figures, from which `finish`
//! builds the footer. From the moment the trace file is open, every way out completes it
//! with a footer.
//!
//! | file | |
//! |---|---|
//! | `args.rs` | the flags and their parsers |
//! | `mod.rs` | the phases; check (privileges, usage), the flags read into each phase's options, and trace (the event loop's run, the stages' figures) |
//! | `prepare.rs` | before the trace file: the libraries probed from the start, NVML, the command's path and user, `--gpu`'s injection |
//! | `output.rs` | the trace file (or stdout), and the trace while it is written |
//! | `output_name.rs` | `-o`'s patterns: `%h` host, `%r` the launcher's rank, `%p` pid, `%t` start time |
//! | `start.rs` | probe, spawn gated, header, release: what the event loop needs |
//! | `probe.rs` | before the command starts: load the object, attach the libraries known at start, the process tracking and discovery, `--kernel`'s hooks |
//! | `attaching.rs` | the probes while tracing: the object lent to the attach layer (`probes/`), the stopped processes; what attaching did as `library` lines, reports and figures |
//! | `missing.rs` | `--missing-probes` |
//! | `header.rs` | the header line (from a value: `HeaderFlags`) and the `library` lines |
//! | `event_loop.rs` | ring, exit, signals and ticks until tracing ends; then detach, drain, settle |
//! | `signals.rs` | the signals that stop tracing: noted at once, passed on to the command |
//! | `pipeline.rs` | source → decode → enrich → sinks, for each record; what its stages counted |
//! | `queue.rs` | `--gpu`: the ordered queue where launch lines wait for CUPTI's record of them |
//! | `loss.rs` | the kernel's drop counters as `lost` lines and footer figures |
//! | `power_feed.rs` | `--power`: the NVML sampler's lines into the pipeline, then its figures |
//! | `finish.rs` | the footer (built once, from the stages' figures), `--export`, the exit code |
//! | `report.rs` | the closing report on stderr |
//! | `outcome.rs` | how the command ended (the trace clock is `crate::clock`) |
//! | `window.rs` | `--start-at`/`--duration`: the window's lines, its end, waiting for the command after it |
//! | `bpf_stats.rs` | `CUDATRACE_BPF_STATS=1`: the programs' run time and count (benchmarks) |
//!
//! The files depend one way, no circle (`cargo xtask check-imports`): `start` on `probe`
//! on `attaching` on `header`; `event_loop` on `pipeline` (on `attaching`, `queue`,
//! `window`, `loss`), `power_feed` and `signals`; `finish` on `report`, `output`, `window`
//! and `signals`; `args` on none. The child is reaped in `crate::spawn`. `--gpu`'s set-up
//! (libcupti, the injection library, the command's environment) is in `crate::inject`; its
//! records go down the same pipeline.

mod args;
mod attaching;
mod bpf_stats;
mod event_loop;
mod finish;
mod header;
mod loss;
mod missing;
mod outcome;
mod output;
mod output_name;
mod pipeline;
mod power_feed;
mod prepare;
mod probe;
mod queue;
mod report;
mod signals;
mod start;
mod window;

pub use args::RunArgs;

use std::{
    num::NonZeroU32,
    path::{Path, PathBuf},
};

use anyhow::anyhow;

use self::{
    event_loop::event_loop,
    finish::{Figures, FinishOptions},
    header::HeaderFlags,
    outcome::Outcome,
    output::Trace,
    pipeline::Pipeline,
    power_feed::PowerFeed,
    prepare::{PrepareOptions, Prepared},
    probe::{ProbeOptions, StackSampling, Targets},
    report::ReportFlags,
    start::{CommandOptions, StartOptions, Started, WindowAsked},
};
use crate::{
    exit::{ExitCode, Failure},
    inject, kernel_hooks, privileges,
    schema::{StacksInfo, WindowFooter},
};

/// Runs `cudatrace run` and returns the process exit code.
pub fn run(args: RunArgs) -> Result<i32, Failure> {
    crate::phases::begin();
    check(&args)?;
    let Options {
        prepare,
        output,
        start,
        finish,
    } = Options::read(args);
    let Prepared {
        libraries,
        power,
        command,
    } = prepare::prepare(&prepare)?;
    crate::phases::reached("prepared");
    let inputs = output::inputs(&libraries, &command, power.as_ref());
    let user = command.user.as_ref();
    let mut trace = Trace::open(output.as_deref(), start.gpu, user, power.as_ref(), &inputs)?;
    let quiet = start.quiet;
    let (traced, figures) = match start::start(start, &command, libraries, power, &mut trace.writer)
    {
        Ok(started) => trace_until_end(started, &mut trace, quiet),
        Err(failure) => (Err(failure), Figures::default()),
    };
    let code = finish::finish(&finish, command, trace, traced, figures);
    crate::phases::reached("finished");
    code
}

/// The flags, read once into what each phase needs.
struct Options {
    prepare: PrepareOptions,
    /// `-o`.
    output: Option<PathBuf>,
    start: StartOptions,
    finish: FinishOptions,
}

impl Options {
    fn read(args: RunArgs) -> Self {
        let selection = args.selection();
        let header = header_flags(&args);
        let report = ReportFlags {
            quiet: args.quiet,
            ring_kib: args.ring_kib,
        };
        let stdout_to_stderr = args.output.as_deref() == Some(Path::new("-"));
        let window = (args.start_at.is_some() || args.duration.is_some()).then_some(WindowAsked {
            start_at: args.start_at,
            duration: args.duration,
        });
        let RunArgs {
            pids,
            all,
            output,
            libcuda,
            libs,
            missing_probes,
            functions,
            launch_entry_only: _,
            as_root,
            quiet,
            ring_kib,
            kernel,
            kernel_hooks,
            kernel_device_prefix,
            power,
            nvml,
            gpu,
            cupti,
            map_entries,
            stacks,
            stack_depth,
            stack_every,
            stack_rate,
            export,
            start_at: _,
            duration: _,
            command,
        } = args;
        Options {
            prepare: PrepareOptions {
                libcuda,
                libs,
                functions,
                missing_probes,
                power,
                nvml,
                as_root,
                program: command.first().cloned(),
                gpu,
                cupti,
                pids: pids.clone(),
            },
            output,
            start: StartOptions {
                header,
                targets: Targets { pids, all },
                probes: ProbeOptions {
                    ring_bytes: ring_kib * 1024,
                    map_entries,
                    stacks: stacks.map(|_| StackSampling {
                        depth: stack_depth,
                        every: stack_every,
                        rate: stack_rate.map_or(0, NonZeroU32::get),
                    }),
                    selection,
                    missing_probes,
                    kernel_hooks: kernel.then_some(kernel_hooks),
                    device_prefix: kernel_device_prefix
                        .unwrap_or_else(|| kernel_hooks::DEVICE_PREFIX.to_owned()),
                },
                command: CommandOptions {
                    argv: command,
                    stdout_to_stderr,
                },
                window,
                gpu,
                quiet,
            },
            finish: FinishOptions { export, report },
        }
    }
}

/// The smallest ring `--stacks` takes: code records are up to 18 KiB.
const MIN_STACKS_RING_KIB: u32 = 64;

/// What can be checked before anything is prepared: privileges, something to trace, the
/// `-p` targets, `--gpu`'s usage and environment.
fn check(args: &RunArgs) -> Result<(), Failure> {
    privileges::check().map_err(|e| Failure::new(ExitCode::NotPrivileged, e))?;
    bpf_stats::enable();
    if args.command.is_empty() && args.pids.is_empty() && !args.all {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!("nothing to trace: give a command after --, -p PID, or --all"),
        ));
    }
    for pid in &args.pids {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(Failure::new(
                ExitCode::NoSuchProcess,
                anyhow!("no process with pid {pid}"),
            ));
        }
    }
    if args.stacks.is_some() && args.ring_kib < MIN_STACKS_RING_KIB {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!(
                "--stacks needs --ring-kib {MIN_STACKS_RING_KIB} or more (a code object's \
                 record takes up to 18 KiB)"
            ),
        ));
    }
    window::check(args.start_at, args.duration)
        .map_err(|e| Failure::new(ExitCode::Usage, anyhow!(e)))?;
    // A test switch, but a bad value is still the caller's mistake.
    crate::probes::programs::ChildHook::chosen().map_err(|e| Failure::new(ExitCode::Usage, e))?;
    if args.gpu {
        inject::check_usage(!args.command.is_empty(), &args.pids, args.all)?;
        if args.pids.is_empty() {
            // The command's environment is ours (with HOME/USER/LOGNAME changed under sudo).
            inject::check_environment(&privileges::command_env(None))?;
        }
        // Attaching: every refusal before anything is prepared, the processes untouched.
        for &pid in &args.pids {
            inject::late::check(pid).map_err(|refusal| {
                Failure::new(
                    ExitCode::AttachRefused,
                    anyhow!("--gpu: cannot attach to process {pid}: {refusal}"),
                )
            })?;
        }
    }
    Ok(())
}

/// What the header says of the flags.
fn header_flags(args: &RunArgs) -> HeaderFlags {
    let mode = if args.all {
        "all"
    } else if args.command.is_empty() {
        "pid"
    } else {
        "command"
    };
    HeaderFlags {
        mode,
        command: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        functions: args.functions.to_string(),
        launch_entry_only: args.launch_entry_only || args.gpu,
        ring_bytes: args.ring_kib * 1024,
        stacks: args.stacks.as_ref().map(|selection| StacksInfo {
            families: selection.names(),
            depth: args.stack_depth,
            every: (args.stack_every > 1).then_some(args.stack_every),
            rate: args.stack_rate.map(NonZeroU32::get),
        }),
        job_ids: header::job_ids(),
    }
}

/// How tracing ended.
pub struct Traced {
    pub outcome: Outcome,
    /// Some traced process loaded a probe-set library.
    pub loaded_any: bool,
    /// The window closed while the command ran: its pid, to wait for after the footer.
    pub running: Option<u32>,
}

/// Traces until the command exits or a signal stops it: the event loop, then every
/// process the probes stopped continued and everything detached. Returns how tracing
/// ended and what its stages counted (also when it failed).
fn trace_until_end(
    started: Started,
    trace: &mut Trace,
    quiet: bool,
) -> (Result<Traced, Failure>, Figures) {
    let Started {
        mut attaching,
        stages,
        sources,
        runtime,
        mut power,
    } = started;
    let child = sources.child;
    let mut pipeline = Pipeline::new(
        stages,
        &mut attaching,
        &mut trace.analysis,
        &mut trace.writer,
    );
    let ended = runtime.block_on(event_loop(&mut pipeline, sources, &mut power, quiet));
    let stages = pipeline.figures();
    let attached = attaching.close();
    crate::phases::reached("links_closed");
    let power = power.and_then(PowerFeed::figures);
    let outcome = match ended {
        Ok(outcome) => outcome,
        // What was counted before the failure: the losses, the stops, a sampler that ended.
        Err(error) => {
            let figures = Figures {
                loss: stages.loss,
                stops: attached.stops,
                power,
                ..Figures::default()
            };
            return (Err(Failure::new(ExitCode::Internal, error)), figures);
        }
    };
    let figures = Figures {
        loss: stages.loss,
        stops: attached.stops,
        power,
        undecodable: stages.undecodable,
        stacks: stages.stacks,
        window: stages.window.map(|window| WindowFooter {
            closed: outcome.window_closed,
            ..window
        }),
    };
    let traced = Traced {
        outcome,
        loaded_any: attached.loaded_any,
        running: child.filter(|_| outcome.window_closed),
    };
    (Ok(traced), figures)
}
