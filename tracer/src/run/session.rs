//! A tracing session, set up in the order that lets the command's first call (`cuInit`) be
//! seen: load the eBPF object, plan and attach the libraries known at start (with `--gpu`,
//! the injection library too) and the process tracking and library discovery (and
//! `--kernel`'s hooks), fork the command suspended, mark it traced and give it its probes,
//! watch for signals and its exit, write the header and the `library` lines, start
//! `--power`'s sampler, release the command; then wire the pipeline and run the event loop.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use anyhow::{Result, anyhow};
use aya::Ebpf;

use super::{
    args::RunArgs,
    event_loop::{Watches, event_loop},
    header,
    outcome::Outcome,
    pipeline::Pipeline,
    power_feed::PowerFeed,
};
use crate::{
    analysis::Analysis,
    clock::{Clocks, monotonic_ns},
    events::Decoder,
    exit::{ExitCode, Failure},
    inject::{self, GpuInjection},
    kernel_hooks,
    power::PowerSetup,
    privileges::{self, TargetUser},
    probes::{
        attach::{Attacher, Scope},
        discovery::{Discovery, FoundLibrary, library_names},
        maps,
        object::{self, LoadOptions},
        plan::Plans,
        programs, tracefs,
    },
    schema::{AttachFailureInfo, AttachInfo, Header, KernelHooksInfo, LibraryLine, PowerInfo},
    sinks::jsonl::TraceWriter,
    spawn,
};

pub struct Session<'a> {
    pub args: &'a RunArgs,
    /// The libraries probed from the start (`--libcuda`, `--lib`, the default search);
    /// taken when tracing starts.
    pub start: Vec<FoundLibrary>,
    pub user: Option<&'a TargetUser>,
    /// The command's resolved path (`None` for `-p` and `--all`).
    pub program: Option<PathBuf>,
    pub clocks: Clocks,
    /// `--kernel`: what was chosen and hooked.
    pub kernel_hooks: Option<KernelHooksInfo>,
    /// `--power`: NVML started, until the sampler starts.
    pub power: Option<PowerSetup>,
    /// `--power`: the header's `power` object.
    pub power_info: Option<PowerInfo>,
    /// `--gpu`: what goes into the command.
    pub gpu: Option<&'a GpuInjection>,
    /// The plans made before the header, for it.
    pub planned: Plans,
    pub attach: AttachInfo,
    /// Some traced process loaded a probe-set library.
    pub loaded_any: bool,
}

fn internal(e: anyhow::Error) -> Failure {
    Failure::new(ExitCode::Internal, e)
}

impl Session<'_> {
    /// The header, for `pids` traced from the start.
    pub fn header(&self, pids: &[u32], failures: Vec<AttachFailureInfo>) -> Header {
        // The objects of `--power` and `--gpu` come from their own set-up.
        Header {
            power: self.power_info.clone(),
            gpu: self.gpu.map(GpuInjection::header),
            ..header::header(
                self.args,
                &self.planned,
                self.attach.clone(),
                self.clocks,
                pids,
                failures,
                self.kernel_hooks.clone(),
            )
        }
    }

    /// Traces until the command exits or a signal stops it, writing to `writer` through
    /// `analysis`.
    pub fn trace(
        &mut self,
        writer: &mut TraceWriter,
        analysis: &mut Analysis,
    ) -> Result<Outcome, Failure> {
        let bpf = object::load(&LoadOptions {
            trace_all: self.args.all,
            ring_bytes: self.args.ring_kib * 1024,
            device_prefix: self.device_prefix().to_owned(),
            map_entries: self.args.map_entries.clone(),
        })
        .map_err(internal)?;
        let attacher = Attacher::new(&bpf, self.args.all);
        self.attach = AttachInfo {
            scope: match attacher.scope() {
                Scope::PerProcess => "process",
                Scope::Host => "host",
            }
            .into(),
            mechanism: attacher.mechanism().into(),
            fallback_reason: attacher.fallback_reason.clone(),
            refused: None,
        };
        if let (Some(reason), false) = (&attacher.fallback_reason, self.args.quiet) {
            eprintln!("cudatrace: probing every process that maps the library: {reason}");
        }
        // From here on every way out (errors included) continues what the probes stopped.
        let mut discovery = Discovery::new(
            bpf,
            attacher,
            self.args.missing_probes,
            self.args.selection(),
            monotonic_ns,
        );
        let explicit: Vec<&FoundLibrary> = self.start.iter().collect();
        maps::set_library_names(discovery.bpf(), &library_names(&explicit)).map_err(internal)?;
        maps::allow_stops(discovery.bpf(), true).map_err(internal)?;

        let mut lines: Vec<LibraryLine> = Vec::new();
        let mut start_ids = Vec::new();
        for found in std::mem::take(&mut self.start) {
            let (id, line) = discovery.add(found).map_err(internal)?;
            start_ids.push(id);
            lines.extend(line);
        }
        self.check_attached(&discovery)?;
        // What the start libraries' attaching decided (some symbols may have gone to
        // per-symbol links, some functions been refused).
        self.attach.mechanism = discovery.attacher.mechanism().into();
        self.attach.refused = discovery.attacher.refused_reason.clone();
        programs::attach_process_tracking(discovery.bpf()).map_err(internal)?;
        let tracefs = tracefs::tracefs().map_err(internal)?;
        programs::attach_discovery(discovery.bpf(), &tracefs).map_err(internal)?;

        let mut pids = self.args.pids.clone();
        for pid in &pids {
            maps::trace_pid(discovery.bpf(), *pid).map_err(internal)?;
        }
        // What the processes already map, read after discovery is watching: a library
        // they open from now on is reported.
        let mapping: Vec<u32> = if self.args.all {
            all_pids()
        } else {
            pids.clone()
        };
        for pid in mapping {
            // --all probes every process already: nothing to link.
            lines.extend(
                discovery
                    .add_mapped(pid, !self.args.all)
                    .map_err(internal)?,
            );
        }
        for pid in &self.args.pids {
            for id in &start_ids {
                discovery.link(*id, *pid).map_err(internal)?;
            }
        }
        if self.args.kernel {
            self.attach_kernel_hooks(discovery.bpf(), &pids)
                .map_err(internal)?;
        }

        // Fork before any thread exists; the child waits at the gate.
        let gated = match &self.program {
            Some(path) => {
                let mut env = privileges::command_env(self.user);
                if let Some(gpu) = self.gpu {
                    env = inject::with_vars(env, gpu.env());
                }
                let redirect = self.args.output.as_deref() == Some(Path::new("-"));
                Some(
                    spawn::spawn_gated(path, &self.args.command, &env, self.user, redirect)
                        .map_err(internal_spawn)?,
                )
            }
            None => None,
        };
        // Each traced process holds two link fds per library: raise our own fd limit, once
        // the command has been forked with the limit it would have had anyway.
        raise_open_files_limit();
        if let Some(gated) = &gated {
            pids.insert(0, gated.pid);
            maps::trace_pid(discovery.bpf(), gated.pid).map_err(internal)?;
            // Its probes exist before its exec: they apply to the image it execs.
            for id in &start_ids {
                discovery.link(*id, gated.pid).map_err(internal)?;
            }
        }
        // Signals and the exit watch are set up before the header: from the moment the
        // trace file says tracing started, SIGINT/SIGTERM must end in a footer, and a
        // `-p` target that exits right away must not be missed.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| internal(e.into()))?;
        // The command when there is one, else every `-p` target: tracing ends when the
        // last of them exits.
        let watched: Vec<u32> = match &gated {
            Some(gated) => vec![gated.pid],
            None => self.args.pids.clone(),
        };
        let watch_setup = {
            let _context = runtime.enter();
            Watches::new(&watched)
        };
        let watches = watch_setup.map_err(internal)?;
        self.planned = discovery.plans.clone();
        let failure_info = discovery
            .failures
            .iter()
            .map(|(_, f)| AttachFailureInfo {
                symbol: f.symbol.clone(),
                error: f.error.clone(),
            })
            .collect();
        let header_error = |e: std::io::Error| {
            Failure::new(
                ExitCode::OutputNotWritable,
                anyhow!("writing the trace header: {e}"),
            )
        };
        writer
            .header(&self.header(&pids, failure_info))
            .map_err(header_error)?;
        for line in &lines {
            writer.write(line).map_err(header_error)?;
        }

        // The sampler starts before the command does: its first samples are the GPUs'
        // power before the command touched them.
        let power = match self.power.take() {
            Some(setup) => {
                if !self.args.quiet {
                    eprintln!("cudatrace: --power: {}", setup.describe());
                }
                let (sampler, receiver) = setup
                    .start()
                    .map_err(|e| internal(anyhow!("starting the NVML sampler: {e}")))?;
                Some(PowerFeed { sampler, receiver })
            }
            None => None,
        };
        let child = match gated {
            Some(gated) => Some(gated.release().map_err(internal_spawn)?),
            None => None,
        };
        if !self.args.quiet {
            self.say_what_is_traced(&discovery, &pids);
            if let Some(gpu) = self.gpu {
                eprintln!(
                    "cudatrace: --gpu: CUPTI activity in the command through {}, with {} (from {})",
                    gpu.library.path.display(),
                    gpu.cupti.path.display(),
                    gpu.cupti.from
                );
            }
        }
        let mut pipeline = Pipeline::new(
            Decoder::new(self.kernel_functions().map_err(internal)?),
            &mut discovery,
            analysis,
            writer,
            self.gpu.is_some(),
        );
        let loop_result = runtime.block_on(event_loop(
            &mut pipeline,
            watches,
            child,
            self.args.quiet,
            power,
        ));
        pipeline.writer.footer.stops = pipeline.discovery.stops.clone();
        self.loaded_any = discovery.loaded_any;
        discovery.finish();
        loop_result.map_err(internal)
    }

    /// Symbols that failed to attach are reported by `--missing-probes`; nothing attached
    /// at all is an error.
    fn check_attached(&self, discovery: &Discovery) -> Result<(), Failure> {
        if discovery.failures.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = discovery
            .failures
            .iter()
            .map(|(_, f)| f.symbol.as_str())
            .collect();
        self.args
            .missing_probes
            .apply("functions failed to attach", &names)?;
        if discovery.failures.len() == discovery.plans.probe_count() {
            let paths: Vec<String> = discovery
                .plans
                .iter()
                .map(|plan| plan.library.path.display().to_string())
                .collect();
            return Err(internal(anyhow!(
                "no probe could be attached to {}: {}",
                paths.join(", "),
                discovery.failures[0].1.error
            )));
        }
        Ok(())
    }

    fn say_what_is_traced(&self, discovery: &Discovery, pids: &[u32]) {
        let scope = match discovery.attacher.scope() {
            Scope::PerProcess => "per traced process",
            Scope::Host => "for every process",
        };
        let targets = describe_targets(self.args, pids);
        if discovery.plans.is_empty() {
            eprintln!(
                "cudatrace: no library found at start; libraries are attached as traced \
                 processes load them ({}, {scope}); tracing {targets}",
                discovery.attacher.mechanism()
            );
            return;
        }
        let libraries: Vec<String> = discovery
            .plans
            .iter()
            .map(|plan| plan.library.describe())
            .collect();
        eprintln!(
            "cudatrace: {} probes ({}, {scope}) on {}; tracing {targets}",
            discovery.plans.probe_count(),
            discovery.attacher.mechanism(),
            libraries.join(", "),
        );
    }

    fn device_prefix(&self) -> &str {
        self.args
            .kernel_device_prefix
            .as_deref()
            .unwrap_or(kernel_hooks::DEVICE_PREFIX)
    }

    /// `--kernel`: picks kprobes or tracepoints, says which and why, attaches them.
    fn attach_kernel_hooks(&mut self, bpf: &mut Ebpf, pids: &[u32]) -> Result<()> {
        let support = kernel_hooks::KernelSupport::probe(&tracefs::tracefs()?);
        let plan = kernel_hooks::plan(&self.args.kernel_hooks, &support)?;
        let functions = kernel_hooks::attach(bpf, &plan)?;
        for pid in pids {
            kernel_hooks::seed_open_fds(bpf, *pid, self.device_prefix())?;
        }
        if !self.args.quiet {
            let what = match plan.mechanism {
                "kprobe" => format!("kprobes on {}", functions.join(", ")),
                _ => format!(
                    "the ioctl/mmap syscall tracepoints on {}*",
                    self.device_prefix()
                ),
            };
            let xid = if plan.xid {
                " and nvidia:nvidia_dev_xid"
            } else {
                ""
            };
            eprintln!("cudatrace: --kernel: {what}{xid} ({})", plan.reason);
        }
        self.kernel_hooks = Some(KernelHooksInfo {
            mechanism: plan.mechanism.to_owned(),
            reason: plan.reason,
            functions,
            xid: plan.xid,
            device_prefix: self.device_prefix().to_owned(),
        });
        Ok(())
    }

    /// Names of kprobed kernel functions by address; only those, and only with kprobes
    /// (all of /proc/kallsyms costs about 24 MB of heap).
    fn kernel_functions(&self) -> Result<HashMap<u64, String>> {
        Ok(match &self.kernel_hooks {
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

fn describe_targets(args: &RunArgs, pids: &[u32]) -> String {
    if args.all {
        return "every process using libcuda".into();
    }
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!("pid {} and its children", list.join(", "))
}
