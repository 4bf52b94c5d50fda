//! Probing, before the command starts: load the eBPF object, plan and attach the libraries
//! known at start (with `--gpu`, the injection library too), then the process tracking and
//! library discovery, the `-p`/`--all` processes' libraries and `--kernel`'s hooks. What
//! attaching did comes back as data ([`Probed`]) for the header and the event loop.

use anyhow::{Result, anyhow};
use aya::maps::{MapData, RingBuf};

use super::{attaching::Attaching, missing};
use crate::{
    clock::monotonic_ns,
    exit::{ExitCode, Failure},
    kernel_hooks::{self, HookChoice},
    probes::{
        attach::Attacher,
        discovery::{Discovery, FoundLibrary, library_names, maps_probe_set_library},
        helpers,
        loaded::LoadedObject,
        maps::{CounterReader, NamePatterns},
        object::{LoadOptions, StackOptions},
        plan::{FunctionSelection, MissingProbes},
        programs,
        stops::Stops,
        tracefs,
    },
    schema::{AttachInfo, InterpreterLine, KernelHooksInfo, LibraryLine},
    stacks::{self, Stacks},
};

/// What is traced besides the command's tree.
pub struct Targets {
    /// `-p`.
    pub pids: Vec<u32>,
    /// `--all`: every process.
    pub all: bool,
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
    /// `--stack-rate`; 0: none.
    pub rate: u32,
}

/// The probes attached before the command starts, and what the header says of them.
pub struct Probed {
    pub attaching: Attaching,
    pub ring: RingBuf<MapData>,
    pub counters: CounterReader,
    /// The header's `attach` object, as attaching the start libraries left it.
    pub attach: AttachInfo,
    /// The ids of the libraries probed from the start: every traced process gets its
    /// probes on them.
    pub start_ids: Vec<u32>,
    /// The `library` lines of the files planned so far, for after the header.
    pub lines: Vec<LibraryLine>,
    /// `--stacks`: the interpreters of the processes traced from the start.
    pub interpreter_lines: Vec<InterpreterLine>,
    pub kernel_hooks: Option<KernelHooksInfo>,
    pub stacks: Option<Stacks>,
}

/// Loads the object and attaches: the libraries probed from the start, the process
/// tracking and library discovery, the libraries of `-p`/`--all` processes, `--kernel`'s
/// hooks. A failure comes with the `attach` object known by then.
pub fn probe(
    options: &ProbeOptions,
    targets: &Targets,
    quiet: bool,
    libraries: Vec<FoundLibrary>,
) -> Result<Probed, (Failure, Option<AttachInfo>)> {
    let loaded = load(options, targets).map_err(|e| (e, None))?;
    crate::phases::reached("loaded");
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
    // The `-p` and `--all` processes that map a probe-set library (by its name) have their
    // interpreters looked at before their probes are attached, so that their first calls
    // find them (looked at after, a busy process's calls of that time were counted
    // `not_python`).
    let mut interpreter_lines = match &mut stacks {
        Some(stacks) => interpreters(stacks, targets, maps_probe_set_library),
        None => Vec::new(),
    };
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
    // Without attach cookies a probe is known by where it fires in a process's recorded
    // mappings: those of the processes traced from the start are recorded before the
    // start libraries' probes attach.
    let early = if helpers::cookies_missing() {
        targets.mapping()
    } else {
        Vec::new()
    };
    let (start_ids, mut lines) =
        attach_start(options, &mut attaching, &mut names, libraries, &early)
            .map_err(|failure| (failure, Some(before)))?;
    crate::phases::reached("libraries_attached");
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
    crate::phases::reached("tracking_attached");
    // And those that map a library found only by what it is (`--lib`, another name).
    if let Some(stacks) = &mut stacks {
        interpreter_lines.extend(interpreters(stacks, targets, |pid| {
            attaching.maps_probed_library(pid)
        }));
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

/// Loads the eBPF object as the flags ask.
fn load(options: &ProbeOptions, targets: &Targets) -> Result<LoadedObject, Failure> {
    LoadedObject::load(&LoadOptions {
        trace_all: targets.all,
        ring_bytes: options.ring_bytes,
        device_prefix: options.device_prefix.clone(),
        map_entries: options.map_entries.clone(),
        stacks: stack_options(options.stacks.as_ref())?,
    })
    .map_err(internal)
}

/// `--stacks`: the interpreters of the `-p` and `--all` processes that `maps` says map a
/// probed library, looked at now (a process looked at before is not looked at again).
fn interpreters(
    stacks: &mut Stacks,
    targets: &Targets,
    maps: impl Fn(u32) -> bool,
) -> Vec<InterpreterLine> {
    let now = monotonic_ns();
    let mut lines = Vec::new();
    for pid in targets.mapping() {
        if maps(pid) {
            lines.extend(stacks.look_at(pid, now));
        }
    }
    lines
}

/// The libraries probed from the start: planned, `early`'s mappings of them recorded
/// (without attach cookies), attached (for the host) or checked, with `--missing-probes` on
/// what failed. Returns their ids and lines.
fn attach_start(
    options: &ProbeOptions,
    attaching: &mut Attaching,
    names: &mut NamePatterns,
    libraries: Vec<FoundLibrary>,
    early: &[u32],
) -> Result<(Vec<u32>, Vec<LibraryLine>), Failure> {
    let explicit: Vec<&FoundLibrary> = libraries.iter().collect();
    names.set(&library_names(&explicit)).map_err(internal)?;
    attaching.allow_stops().map_err(internal)?;
    let (start_ids, lines) = attaching.add_all(libraries, early).map_err(internal)?;
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
    programs::attach_discovery(attaching.bpf(), &tracefs, quiet).map_err(internal)?;
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
        rate: sampling.rate,
    }))
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
    // Unknown (not probed) is left to the loader, whose own error then says why.
    let func_ip = helpers::FUNC_IP;
    if plan.mechanism == "kprobe" && helpers::supported(func_ip) == Ok(false) {
        anyhow::bail!(helpers::refusal(func_ip, &helpers::kernel_release()));
    }
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

impl Targets {
    /// Whether processes already running are traced (`-p`, `--all`).
    pub fn attaches_running(&self) -> bool {
        self.all || !self.pids.is_empty()
    }

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

fn internal(e: anyhow::Error) -> Failure {
    Failure::new(ExitCode::Internal, e)
}
