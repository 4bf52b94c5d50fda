//! Starting to trace, in the order that lets the command's first call (`cuInit`) be seen:
//! load the eBPF object, plan and attach the libraries known at start (with `--gpu`, the
//! injection library too) and the process tracking and library discovery (and `--kernel`'s
//! hooks) (`probe`); fork the command suspended, mark it traced and give it its probes,
//! watch for signals and its exit (`spawn`); write the header and the `library` lines,
//! start `--power`'s sampler, release the command. Each step returns what the next needs;
//! the last returns what the event loop needs ([`Started`]).

use std::{collections::HashMap, ffi::OsString, time::Duration};

use anyhow::{Result, anyhow};
use aya::maps::{MapData, RingBuf};

use super::{
    attaching::Attaching,
    event_loop::{Sources, Watches},
    header::{HeaderBase, HeaderFlags, failure_info},
    missing,
    pipeline::Stages,
    power_feed::PowerFeed,
    prepare::Command,
    window::{self, WindowFilter},
};
use crate::{
    clock::{Clocks, monotonic_ns},
    events::Decoder,
    exit::{ExitCode, Failure},
    inject::{self, GpuInjection},
    kernel_hooks::{self, HookChoice},
    power::PowerSetup,
    privileges,
    probes::{
        attach::{Attacher, Scope},
        discovery::{Discovery, FoundLibrary, library_names},
        loaded::LoadedObject,
        maps::{CounterReader, NamePatterns},
        object::{LoadOptions, StackOptions},
        plan::{FunctionSelection, MissingProbes},
        programs,
        stops::Stops,
        tracefs,
    },
    schema::{AttachInfo, InterpreterLine, KernelHooksInfo, LibraryLine},
    sinks::jsonl::TraceWriter,
    spawn::{self, Gated},
    stacks::{self, Stacks},
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

/// What is traced besides the command's tree.
pub struct Targets {
    /// `-p`.
    pub pids: Vec<u32>,
    /// `--all`: every process.
    pub all: bool,
}

/// How the command is started.
pub struct CommandOptions {
    /// The command's words (its program already resolved, `Command::program`).
    pub argv: Vec<OsString>,
    /// `-o -`: the command's standard output goes to stderr.
    pub stdout_to_stderr: bool,
}

/// How the object is loaded and the probes attached.
pub struct ProbeOptions {
    /// `--ring-kib`, in bytes.
    pub ring_bytes: u32,
    /// `--map-entries`.
    pub map_entries: Vec<(String, u32)>,
    /// `--stacks`: `--stack-depth` and `--stack-every`.
    pub stacks: Option<StackSampling>,
    /// What to probe in each library found.
    pub selection: FunctionSelection,
    pub missing_probes: MissingProbes,
    /// `--kernel`: how to hook the driver (`--kernel-hooks`).
    pub kernel_hooks: Option<HookChoice>,
    /// Path prefix of NVIDIA device files.
    pub device_prefix: String,
}

/// `--stacks`' frame budget and sampling.
pub struct StackSampling {
    pub depth: u32,
    pub every: u32,
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
    // A start that fails before its header still writes one, from what was known.
    let mut probed = match probe(&probes, &targets, quiet, libraries) {
        Ok(probed) => probed,
        Err((failure, attach)) => {
            let _ = writer.header(&base.failed_start(attach, None));
            return Err(failure);
        }
    };
    let spawned = match spawn(&command_options, &targets, command, &mut probed) {
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
        mut watches,
    } = spawned;
    let window = window.map(|asked| {
        WindowFilter::new(window::place(asked.start_at, asked.duration, &base.clocks))
    });
    if let Some(window) = &window {
        let _context = runtime.enter();
        watches.close_at = window.stop_at(gpu);
    }
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

/// `--gpu`: what goes into the command, and another tool's injection after it.
fn say_gpu(command: &Command) {
    let Some(gpu) = &command.gpu else {
        return;
    };
    eprintln!(
        "cudatrace: --gpu: CUPTI activity in the command through {}, with {} (from {})",
        gpu.library.path.display(),
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

/// The probes attached before the command starts, and what the header says of them.
struct Probed {
    attaching: Attaching,
    ring: RingBuf<MapData>,
    counters: CounterReader,
    /// The header's `attach` object, as attaching the start libraries left it.
    attach: AttachInfo,
    /// The ids of the libraries probed from the start: every traced process gets its
    /// probes on them.
    start_ids: Vec<u32>,
    /// The `library` lines of the files planned so far, for after the header.
    lines: Vec<LibraryLine>,
    /// `--stacks`: the interpreters of the processes traced from the start.
    interpreter_lines: Vec<InterpreterLine>,
    kernel_hooks: Option<KernelHooksInfo>,
    stacks: Option<Stacks>,
}

/// Loads the object and attaches: the libraries probed from the start, the process
/// tracking and library discovery, the libraries of `-p`/`--all` processes, `--kernel`'s
/// hooks. A failure comes with the `attach` object known by then.
fn probe(
    options: &ProbeOptions,
    targets: &Targets,
    quiet: bool,
    libraries: Vec<FoundLibrary>,
) -> Result<Probed, (Failure, Option<AttachInfo>)> {
    let loaded = LoadedObject::load(&LoadOptions {
        trace_all: targets.all,
        ring_bytes: options.ring_bytes,
        device_prefix: options.device_prefix.clone(),
        map_entries: options.map_entries.clone(),
        stacks: stack_options(options.stacks.as_ref()).map_err(|e| (e, None))?,
    })
    .map_err(|e| (internal(e), None))?;
    let LoadedObject {
        bpf,
        uprobe_multi,
        ring,
        counters,
        probe_table,
        traced,
        mut names,
        linked,
        stops,
        stacks,
    } = loaded;
    let mut stacks = stacks.map(|maps| Stacks::new(maps, quiet));
    let attacher = Attacher::new(uprobe_multi, targets.all);
    if let (Some(reason), false) = (&attacher.fallback_reason, quiet) {
        eprintln!("cudatrace: probing every process that maps the library: {reason}");
    }
    let discovery = Discovery::new(attacher, probe_table, linked, options.selection.clone());
    let (stops, keeper) = Stops::new(stops, monotonic_ns);
    if let Err(error) = keeper {
        eprintln!(
            "cudatrace: WARNING: cannot start the keeper ({error}): if cudatrace is killed \
             with SIGKILL while attaching, the process it stopped stays stopped (`kill -CONT` it)"
        );
    }
    let mut attaching = Attaching::new(bpf, discovery, traced, stops, options.missing_probes);
    let before = attaching.attach_info();
    let (start_ids, mut lines) = attach_start(options, &mut attaching, &mut names, libraries)
        .map_err(|failure| (failure, Some(before)))?;
    // What the start libraries' attaching decided (some symbols may have gone to
    // per-symbol links, some functions been refused).
    let attach = attaching.attach_info();
    let kernel_hooks = attach_tracking(
        options,
        targets,
        quiet,
        &mut attaching,
        &start_ids,
        &mut lines,
    )
    .map_err(|failure| (failure, Some(attach.clone())))?;
    let mut interpreter_lines = Vec::new();
    if let Some(stacks) = &mut stacks {
        // `-p` and `--all` processes that map a probed library: their interpreters now.
        let mapping = targets.mapping();
        let now = monotonic_ns();
        for pid in mapping {
            if attaching.maps_probed_library(pid) {
                interpreter_lines.extend(stacks.look_at(pid, now));
            }
        }
    }
    Ok(Probed {
        attaching,
        ring,
        counters,
        attach,
        start_ids,
        lines,
        interpreter_lines,
        kernel_hooks,
        stacks,
    })
}

/// The libraries probed from the start: planned, attached (for the host) or checked, with
/// `--missing-probes` on what failed. Returns their ids and lines.
fn attach_start(
    options: &ProbeOptions,
    attaching: &mut Attaching,
    names: &mut NamePatterns,
    libraries: Vec<FoundLibrary>,
) -> Result<(Vec<u32>, Vec<LibraryLine>), Failure> {
    let explicit: Vec<&FoundLibrary> = libraries.iter().collect();
    names.set(&library_names(&explicit)).map_err(internal)?;
    attaching.allow_stops().map_err(internal)?;
    let mut lines = Vec::new();
    let mut start_ids = Vec::new();
    for found in libraries {
        let (id, line) = attaching.add(found).map_err(internal)?;
        start_ids.push(id);
        lines.extend(line);
    }
    check_attached(options.missing_probes, attaching)?;
    Ok((start_ids, lines))
}

/// Symbols that failed to attach are reported by `--missing-probes`; nothing attached at
/// all is an error.
fn check_attached(policy: MissingProbes, attaching: &Attaching) -> Result<(), Failure> {
    if attaching.failures.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = attaching
        .failures
        .iter()
        .map(|(_, f)| f.symbol.as_str())
        .collect();
    missing::apply(policy, "functions failed to attach", &names)?;
    if attaching.failures.len() == attaching.plans().probe_count() {
        let paths: Vec<String> = attaching
            .plans()
            .iter()
            .map(|plan| plan.library.path.display().to_string())
            .collect();
        return Err(internal(anyhow!(
            "no probe could be attached to {}: {}",
            paths.join(", "),
            attaching.failures[0].1.error
        )));
    }
    Ok(())
}

/// The process tracking and library discovery, the `-p` targets (and with `--all`, every
/// process: what they map already), `--kernel`'s hooks. Returns what `--kernel` hooked.
fn attach_tracking(
    options: &ProbeOptions,
    targets: &Targets,
    quiet: bool,
    attaching: &mut Attaching,
    start_ids: &[u32],
    lines: &mut Vec<LibraryLine>,
) -> Result<Option<KernelHooksInfo>, Failure> {
    programs::attach_process_tracking(attaching.bpf()).map_err(internal)?;
    let tracefs = tracefs::tracefs().map_err(internal)?;
    programs::attach_discovery(attaching.bpf(), &tracefs).map_err(internal)?;
    for pid in &targets.pids {
        attaching.trace_pid(*pid).map_err(internal)?;
    }
    // What the processes already map, read after discovery is watching: a library they
    // open from now on is reported.
    for pid in targets.mapping() {
        // --all probes every process already: nothing to link.
        lines.extend(attaching.add_mapped(pid, !targets.all).map_err(internal)?);
    }
    for pid in &targets.pids {
        for id in start_ids {
            attaching.link(*id, *pid).map_err(internal)?;
        }
    }
    let Some(choice) = &options.kernel_hooks else {
        return Ok(None);
    };
    attach_kernel_hooks(
        choice,
        &options.device_prefix,
        quiet,
        attaching,
        &targets.pids,
    )
    .map(Some)
    .map_err(internal)
}

/// The command forked and waiting at its gate, and the watches for the end.
struct Spawned {
    gated: Option<Gated>,
    /// The processes traced from the start: the command's first, then the `-p` targets.
    pids: Vec<u32>,
    runtime: tokio::runtime::Runtime,
    watches: Watches,
}

/// Forks the command at its gate, traced and with its probes, and sets up the watches.
fn spawn(
    options: &CommandOptions,
    targets: &Targets,
    command: &Command,
    probed: &mut Probed,
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
        Watches::new(&watched)
    };
    let watches = watch_setup.map_err(internal)?;
    Ok(Spawned {
        gated,
        pids,
        runtime,
        watches,
    })
}

/// `--stacks`'s settings for the probes, or why this kernel cannot give stacks.
fn stack_options(sampling: Option<&StackSampling>) -> Result<Option<StackOptions>, Failure> {
    let Some(sampling) = sampling else {
        return Ok(None);
    };
    let fsbase_offset = stacks::kernel_fsbase()
        .map_err(|e| Failure::new(ExitCode::Usage, anyhow!("--stacks: {e}")))?;
    Ok(Some(StackOptions {
        fsbase_offset,
        depth: sampling.depth,
        every: sampling.every,
    }))
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

/// `--kernel`: picks kprobes or tracepoints, says which and why, attaches them.
fn attach_kernel_hooks(
    choice: &HookChoice,
    device_prefix: &str,
    quiet: bool,
    attaching: &mut Attaching,
    pids: &[u32],
) -> Result<KernelHooksInfo> {
    let support = kernel_hooks::KernelSupport::probe(&tracefs::tracefs()?);
    let plan = kernel_hooks::plan(choice, &support)?;
    let bpf = attaching.bpf();
    let functions = kernel_hooks::attach(bpf, &plan)?;
    for pid in pids {
        kernel_hooks::seed_open_fds(bpf, *pid, device_prefix)?;
    }
    if !quiet {
        let what = match plan.mechanism {
            "kprobe" => format!("kprobes on {}", functions.join(", ")),
            _ => format!("the ioctl/mmap syscall tracepoints on {device_prefix}*"),
        };
        let xid = if plan.xid {
            " and nvidia:nvidia_dev_xid"
        } else {
            ""
        };
        eprintln!("cudatrace: --kernel: {what}{xid} ({})", plan.reason);
    }
    Ok(KernelHooksInfo {
        mechanism: plan.mechanism.to_owned(),
        reason: plan.reason,
        functions,
        xid: plan.xid,
        device_prefix: device_prefix.to_owned(),
    })
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

impl Targets {
    /// The processes whose mappings are read at start: the `-p` targets, or with `--all`
    /// every process but this one.
    fn mapping(&self) -> Vec<u32> {
        if self.all {
            all_pids()
        } else {
            self.pids.clone()
        }
    }
}

/// Every process but this one (`--all`: what they map is attached at start).
fn all_pids() -> Vec<u32> {
    let own = std::process::id();
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .filter(|pid| *pid != own)
                .collect()
        })
        .unwrap_or_default()
}

fn describe_targets(targets: &Targets, pids: &[u32]) -> String {
    if targets.all {
        return "every process using libcuda".into();
    }
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!("pid {} and its children", list.join(", "))
}
