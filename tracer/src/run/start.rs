//! Starting to trace, in the order that lets the command's first call (`cuInit`) be seen:
//! probe (`probe.rs`: load the object, attach what is known at start); fork the command
//! suspended, mark it traced and give it its probes, watch for signals and its exit
//! (`spawn`); write the header and the `library` lines, start `--power`'s sampler, release
//! the command. Each step returns what the next needs; the last returns what the event
//! loop needs ([`Started`]).

use std::{collections::HashMap, ffi::OsString, time::Duration};

use anyhow::{Result, anyhow};

use super::{
    attaching::Attaching,
    event_loop::{Sources, Watches},
    header::{HeaderBase, HeaderFlags, failure_info},
    pipeline::Stages,
    power_feed::PowerFeed,
    prepare::Command,
    probe::{self, ProbeOptions, Probed, Targets},
    window::{self, WindowFilter},
};
use crate::{
    clock::Clocks,
    events::Decoder,
    exit::{ExitCode, Failure},
    inject::{self, GpuInjection},
    kernel_hooks,
    power::PowerSetup,
    privileges,
    probes::{
        attach::Scope,
        discovery::{Found, FoundLibrary},
        library::Library,
        probe_set::INJECTION,
    },
    schema::KernelHooksInfo,
    sinks::jsonl::TraceWriter,
    spawn::{self, Gated},
};

/// What starting is asked for, read from the flags once (`run::run`).
pub struct StartOptions {
    /// What the header says of the flags.
    pub header: HeaderFlags,
    pub targets: Targets,
    pub probes: ProbeOptions,
    pub command: CommandOptions,
    /// `--start-at`/`--duration`, when either is given.
    pub window: Option<WindowAsked>,
    /// `--gpu`: tracing goes on after the window's end for the GPU records.
    pub gpu: bool,
    pub quiet: bool,
}

/// How the command is started.
pub struct CommandOptions {
    /// The command's words (its program already resolved, `Command::program`).
    pub argv: Vec<OsString>,
    /// `-o -`: the command's standard output goes to stderr.
    pub stdout_to_stderr: bool,
}

/// `--start-at` (ns since the epoch) and `--duration`.
pub struct WindowAsked {
    pub start_at: Option<u64>,
    pub duration: Option<Duration>,
}

/// What the event loop needs: the probes, the pipeline's stages, the ring and counters,
/// the watches and the command released, `--power`'s sampler.
pub struct Started {
    pub attaching: Attaching,
    pub stages: Stages,
    pub sources: Sources,
    pub runtime: tokio::runtime::Runtime,
    pub power: Option<PowerFeed>,
}

/// Starts tracing, writing the header and the `library` lines. A start that fails before
/// its header still writes one, from what was known by then.
pub fn start(
    options: StartOptions,
    command: &Command,
    libraries: Vec<FoundLibrary>,
    power: Option<PowerSetup>,
    writer: &mut TraceWriter,
) -> Result<Started, Failure> {
    let StartOptions {
        header,
        targets,
        probes,
        command: command_options,
        window,
        gpu,
        quiet,
    } = options;
    let base = HeaderBase {
        flags: header,
        clocks: Clocks::now(),
        power: power.as_ref().map(|setup| setup.info.clone()),
        gpu: command.gpu.as_ref().map(GpuInjection::header),
    };
    // Started late (`-p PID --gpu`), the library goes in once the probes are attached.
    let late = command.gpu.as_ref().is_some_and(|gpu| gpu.late.is_some());
    // With processes already running (`-p`, `--all`), the window is placed once the probes
    // are attached: attaching to them takes its time (seconds in a slow machine), which
    // the window is not for; a window from before would lose those calls, or all of a
    // short one. A command starts only after that anyway.
    let after_attach = late || targets.attaches_running();
    let place = |asked: &WindowAsked, clocks: &Clocks| {
        WindowFilter::new(window::place(asked.start_at, asked.duration, clocks))
    };
    let mut window_filter = window
        .as_ref()
        .filter(|_| !after_attach)
        .map(|asked| place(asked, &base.clocks));
    // A start that fails before its header still writes one, from what was known.
    let mut probed = match probe::probe(&probes, &targets, quiet, libraries) {
        Ok(probed) => probed,
        Err((failure, attach)) => {
            let _ = writer.header(&base.failed_start(attach, None));
            return Err(failure);
        }
    };
    crate::phases::reached("probes_attached");
    if after_attach {
        window_filter = window.as_ref().map(|asked| place(asked, &Clocks::now()));
    }
    let window = window_filter;
    // Started late, the libraries end their window when tracing stops: no grace after it.
    let close = window.as_ref().map(|window| (window, gpu && !late));
    let spawned = match spawn(&command_options, &targets, command, &mut probed, close) {
        Ok(spawned) => spawned,
        Err(failure) => {
            let header = base.failed_start(Some(probed.attach), probed.kernel_hooks);
            let _ = writer.header(&header);
            return Err(failure);
        }
    };
    let Spawned {
        gated,
        pids,
        runtime,
        watches,
    } = spawned;
    crate::phases::reached("spawned");
    write_header(writer, &base, &probed, &pids, window.as_ref())?;
    // The sampler starts before the command does: its first samples are the GPUs' power
    // before the command touched them.
    let power = start_power(power, quiet)?;
    let child = match gated {
        Some(gated) => Some(gated.release().map_err(internal_spawn)?),
        None => None,
    };
    if !quiet {
        say_what_is_traced(&targets, &probed.attaching, &pids);
        say_gpu(command);
    }
    // `-p PID --gpu`: the probes are attached, the header written: the library goes in.
    let late = attach_late(command, quiet, &mut probed.attaching, writer)?;
    let Probed {
        attaching,
        ring,
        counters,
        kernel_hooks,
        stacks,
        ..
    } = probed;
    let decoder = Decoder::new(kernel_functions(kernel_hooks.as_ref()).map_err(internal)?);
    Ok(Started {
        attaching,
        stages: Stages {
            decoder,
            window,
            stacks,
            control: command.gpu.as_ref().map(|gpu| gpu.control.clone()),
        },
        sources: Sources {
            ring,
            counters,
            watches,
            child,
            late,
        },
        runtime,
        power,
    })
}

/// The header (with the window, if any), then the `library` and `interpreter` lines of
/// what was probed from the start.
fn write_header(
    writer: &mut TraceWriter,
    base: &HeaderBase,
    probed: &Probed,
    pids: &[u32],
    window: Option<&WindowFilter>,
) -> Result<(), Failure> {
    let attaching = &probed.attaching;
    let failures = attaching.failures.iter().map(|(_, f)| failure_info(f));
    let mut header = base.header(
        attaching.plans(),
        probed.attach.clone(),
        pids,
        failures.collect(),
        probed.kernel_hooks.clone(),
    );
    header.window = window.map(|window| window.info.clone());
    let header_error = |e: std::io::Error| {
        Failure::new(
            ExitCode::OutputNotWritable,
            anyhow!("writing the trace header: {e}"),
        )
    };
    writer.header(&header).map_err(header_error)?;
    for line in &probed.lines {
        writer.write(line).map_err(header_error)?;
    }
    for line in &probed.interpreter_lines {
        writer.write(line).map_err(header_error)?;
    }
    Ok(())
}

/// `--power`: starts the sampler NVML was prepared for.
fn start_power(power: Option<PowerSetup>, quiet: bool) -> Result<Option<PowerFeed>, Failure> {
    let Some(setup) = power else {
        return Ok(None);
    };
    if !quiet {
        eprintln!("cudatrace: --power: {}", setup.describe());
    }
    let (sampler, receiver) = setup
        .start()
        .map_err(|e| internal(anyhow!("starting the NVML sampler: {e}")))?;
    Ok(Some(PowerFeed::Sampling { sampler, receiver }))
}

/// `-p PID --gpu`: puts the injection library into each process (docs/gpu.md, "Attaching
/// to a running process"), its probes attached to the anonymous file it goes in as (a
/// `library` line each) before it starts; returns the pids it went into. A process that
/// cannot take it ends the run (its refusal was checked before; this is what changed
/// since, or a thread that never reached a safe point).
fn attach_late(
    command: &Command,
    quiet: bool,
    attaching: &mut Attaching,
    writer: &mut TraceWriter,
) -> Result<Vec<u32>, Failure> {
    let Some(gpu) = &command.gpu else {
        return Ok(Vec::new());
    };
    let Some(late) = &gpu.late else {
        return Ok(Vec::new());
    };
    let mut attached = Vec::new();
    for &pid in &late.pids {
        let mut take = |handed: inject::late::Handed| -> Result<Vec<u8>, String> {
            let shown_as = std::path::Path::new(&handed.library_shown_as);
            let library = Library::read(&INJECTION, &handed.library, shown_as)
                .map_err(|e| format!("reading the library: {e}"))?;
            let found = FoundLibrary {
                set: &INJECTION,
                library,
                file: handed.library,
                found: if handed.reused {
                    Found::Mapped
                } else {
                    Found::Written
                },
                pid: Some(pid),
                ts_ns: None,
            };
            // Mapped already: without attach cookies its mappings are recorded first.
            let (ids, lines) = attaching
                .add_all(vec![found], &[pid])
                .map_err(|e| format!("attaching its probes: {e:#}"))?;
            if ids
                .first()
                .and_then(|id| attaching.plans().get(*id))
                .is_none_or(|plan| plan.probes.is_empty())
            {
                return Err(format!(
                    "the injection library lacks {}: rebuild cudatrace",
                    tracer_common::GPU_RECORDS_SYMBOL
                ));
            }
            for line in &lines {
                writer
                    .write(line)
                    .map_err(|e| format!("writing its library line: {e}"))?;
            }
            gpu.control
                .add_late(pid, &handed.control)
                .map_err(|e| format!("{e:#}"))?;
            Ok(gpu.late_settings(&handed.control_path))
        };
        let done = inject::late::attach(pid, &mut take).map_err(|e| {
            Failure::new(
                ExitCode::AttachRefused,
                anyhow!("--gpu: cannot attach to process {pid}: {e}"),
            )
        })?;
        if !quiet {
            let reused = if done.target.injected.is_some() {
                ", its library from an earlier attach"
            } else {
                ""
            };
            eprintln!(
                "cudatrace: --gpu: attached to process {pid}{reused}: thread {} stopped {} µs \
                 (in {}), {} µs in all, {} thread stops passed over in {} tries",
                done.injected.tid,
                done.injected.stopped.as_micros(),
                done.injected.syscall,
                done.took.as_micros(),
                done.injected.passed_over,
                done.injected.rounds
            );
        }
        attached.push(pid);
    }
    Ok(attached)
}

/// `--gpu`: what goes into the command, and another tool's injection after it.
fn say_gpu(command: &Command) {
    let Some(gpu) = &command.gpu else {
        return;
    };
    let into = if gpu.late.is_some() {
        "the processes, attached,"
    } else {
        "the command"
    };
    eprintln!(
        "cudatrace: --gpu: CUPTI activity in {into} through {}, with {} (from {})",
        gpu.library_path().display(),
        gpu.cupti.path.display(),
        gpu.cupti.from
    );
    if let Some(chain) = &gpu.chain {
        eprintln!(
            "cudatrace: --gpu: the command's own CUDA_INJECTION64_PATH ({}) starts after \
             cudatrace's; while it holds CUPTI, GPU recording yields to it (gpu_gap lines)",
            chain.to_string_lossy()
        );
    }
}

/// The command forked and waiting at its gate, and the watches for the end.
struct Spawned {
    gated: Option<Gated>,
    /// The processes traced from the start: the command's first, then the `-p` targets.
    pids: Vec<u32>,
    runtime: tokio::runtime::Runtime,
    watches: Watches,
}

/// Forks the command at its gate, traced and with its probes, and sets up the watches
/// (with `close`, the window's end, later with `--gpu`).
fn spawn(
    options: &CommandOptions,
    targets: &Targets,
    command: &Command,
    probed: &mut Probed,
    close: Option<(&WindowFilter, bool)>,
) -> Result<Spawned, Failure> {
    // Fork before any thread exists; the child waits at the gate.
    let gated = match &command.program {
        Some(path) => {
            let mut env = privileges::command_env(command.user.as_ref());
            if let Some(gpu) = &command.gpu {
                env = inject::with_vars(env, gpu.env());
            }
            let redirect = options.stdout_to_stderr;
            Some(
                spawn::spawn_gated(path, &options.argv, &env, command.user.as_ref(), redirect)
                    .map_err(internal_spawn)?,
            )
        }
        None => None,
    };
    // Each traced process holds two link fds per library: raise our own fd limit, once
    // the command has been forked with the limit it would have had anyway.
    raise_open_files_limit();
    let mut pids = targets.pids.clone();
    if let Some(gated) = &gated {
        pids.insert(0, gated.pid);
        probed.attaching.trace_pid(gated.pid).map_err(internal)?;
        // Its probes exist before its exec: they apply to the image it execs.
        for id in &probed.start_ids {
            probed.attaching.link(*id, gated.pid).map_err(internal)?;
        }
    }
    // Signals and the exit watch are set up before the header: from the moment the trace
    // file says tracing started, SIGINT/SIGTERM must end in a footer, and a `-p` target
    // that exits right away must not be missed.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| internal(e.into()))?;
    // The command when there is one, else every `-p` target: tracing ends when the last
    // of them exits.
    let watched: Vec<u32> = match &gated {
        Some(gated) => vec![gated.pid],
        None => targets.pids.clone(),
    };
    let watch_setup = {
        let _context = runtime.enter();
        let close_at = close.and_then(|(window, gpu)| window.stop_at(gpu));
        Watches::new(&watched, close_at)
    };
    let watches = watch_setup.map_err(internal)?;
    Ok(Spawned {
        gated,
        pids,
        runtime,
        watches,
    })
}

fn internal(e: anyhow::Error) -> Failure {
    Failure::new(ExitCode::Internal, e)
}

fn internal_spawn(e: spawn::SpawnError) -> Failure {
    let code = match &e {
        spawn::SpawnError::Exec { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
            ExitCode::CommandNotFound
        }
        spawn::SpawnError::Exec { .. } => ExitCode::NotExecutable,
        _ => ExitCode::Internal,
    };
    Failure::new(code, e)
}

fn say_what_is_traced(targets: &Targets, attaching: &Attaching, pids: &[u32]) {
    let attacher = attaching.attacher();
    let scope = match attacher.scope() {
        Scope::PerProcess => "per traced process",
        Scope::Host => "for every process",
    };
    let targets = describe_targets(targets, pids);
    if attaching.plans().is_empty() {
        eprintln!(
            "cudatrace: no library found at start; libraries are attached as traced \
             processes load them ({}, {scope}); tracing {targets}",
            attacher.mechanism()
        );
        return;
    }
    let libraries: Vec<String> = attaching
        .plans()
        .iter()
        .map(|plan| plan.library.describe())
        .collect();
    eprintln!(
        "cudatrace: {} probes ({}, {scope}) on {}; tracing {targets}",
        attaching.plans().probe_count(),
        attacher.mechanism(),
        libraries.join(", "),
    );
}

/// Names of kprobed kernel functions by address; only those, and only with kprobes (all
/// of /proc/kallsyms costs about 24 MB of heap).
fn kernel_functions(hooks: Option<&KernelHooksInfo>) -> Result<HashMap<u64, String>> {
    Ok(match hooks {
        Some(hooks) if hooks.mechanism == "kprobe" => kernel_hooks::kallsyms()?
            .into_iter()
            .filter(|(name, _)| {
                hooks.functions.contains(name)
                    || kernel_hooks::INTERRUPT_FUNCTIONS.contains(&name.as_str())
            })
            .map(|(name, address)| (address, name))
            .collect(),
        _ => HashMap::new(),
    })
}

/// Raises the soft limit of open files to the hard one (per-process probes take two fds
/// per traced process and library).
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn describe_targets(targets: &Targets, pids: &[u32]) -> String {
    if targets.all {
        return "every process using libcuda".into();
    }
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!("pid {} and its children", list.join(", "))
}
