//! A tracing session, set up in the order that lets the command's first call (`cuInit`) be
//! seen: load the eBPF object, attach the plans and the process tracking (and `--kernel`'s
//! hooks), fork the command suspended and mark it traced, watch for signals and its exit,
//! write the header, release the command; then wire the pipeline and run the event loop.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use anyhow::{Result, anyhow};
use aya::Ebpf;

use super::{
    args::RunArgs,
    clock::Clocks,
    event_loop::{Watches, event_loop},
    header,
    outcome::Outcome,
    pipeline::Pipeline,
    power_feed::PowerFeed,
};
use crate::{
    analysis::Analysis,
    events::Decoder,
    exit::{ExitCode, Failure},
    inject::{self, GpuInjection},
    kernel_hooks,
    power::PowerSetup,
    privileges::{self, TargetUser},
    probes::{
        attach::{self, AttachFailure, Attached},
        maps,
        object::{self, LoadOptions},
        plan::Plans,
        programs, tracefs,
    },
    schema::{AttachFailureInfo, Header, KernelHooksInfo, PowerInfo},
    sinks::jsonl::TraceWriter,
    spawn,
};

pub struct Session<'a> {
    pub args: &'a RunArgs,
    pub plans: &'a Plans,
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
    /// How the probes were attached, and why uprobe_multi was not used where it failed.
    pub probe_mechanism: String,
    pub uprobe_multi_fallback: Option<String>,
}

fn internal(e: anyhow::Error) -> Failure {
    Failure::new(ExitCode::Internal, e)
}

impl Session<'_> {
    /// The header, for `pids` traced from the start.
    pub fn header(&self, pids: &[u32], failures: Vec<AttachFailureInfo>) -> Header {
        // The objects of `--power` and `--gpu` come from their own set-up, and how the probes
        // were attached from the attach layer.
        Header {
            power: self.power_info.clone(),
            gpu: self.gpu.map(GpuInjection::header),
            probe_mechanism: self.probe_mechanism.clone(),
            uprobe_multi_fallback: self.uprobe_multi_fallback.clone(),
            ..header::header(
                self.args,
                self.plans,
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
        let mut bpf = object::load(&LoadOptions {
            trace_all: self.args.all,
            ring_bytes: self.args.ring_kib * 1024,
            device_prefix: self.device_prefix().to_owned(),
            map_entries: self.args.map_entries.clone(),
        })
        .map_err(internal)?;
        let (attached, failures) = self.attach_probes(&mut bpf)?;
        self.probe_mechanism = attached.mechanism().to_owned();
        if let Some(why) = &attached.multi_fallback {
            // One line here (the kernel's error, a verifier log's first line); all of it
            // in the header.
            let first = why.lines().next().unwrap_or_default();
            let instead = if attached.mechanism() == "uprobe_multi" {
                "attached the other functions with smaller uprobe_multi links"
            } else {
                "using one perf link per symbol (slower to attach and detach)"
            };
            eprintln!("cudatrace: uprobe_multi attach failed ({instead}): {first}");
            self.uprobe_multi_fallback = Some(why.clone());
        }
        programs::attach_process_tracking(&mut bpf).map_err(internal)?;
        let mut pids = self.args.pids.clone();
        for pid in &pids {
            maps::trace_pid(&mut bpf, *pid).map_err(internal)?;
        }
        if self.args.kernel {
            self.attach_kernel_hooks(&mut bpf, &pids)
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
        if let Some(gated) = &gated {
            pids.insert(0, gated.pid);
            maps::trace_pid(&mut bpf, gated.pid).map_err(internal)?;
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
        let failure_info = failures
            .into_iter()
            .map(|f| AttachFailureInfo {
                symbol: f.symbol,
                error: f.error,
            })
            .collect();
        writer
            .header(&self.header(&pids, failure_info))
            .map_err(|e| {
                Failure::new(
                    ExitCode::OutputNotWritable,
                    anyhow!("writing the trace header: {e}"),
                )
            })?;

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
            let libraries: Vec<String> = self
                .plans
                .iter()
                .map(|plan| plan.library.describe())
                .collect();
            eprintln!(
                "cudatrace: {} probes ({}) on {}; tracing {}",
                self.plans.probe_count(),
                attached.mechanism(),
                libraries.join(", "),
                describe_targets(self.args, &pids)
            );
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
            Decoder::new(self.plans, self.kernel_functions().map_err(internal)?),
            analysis,
            writer,
            self.gpu.is_some(),
        );
        let loop_result = runtime.block_on(event_loop(
            bpf,
            attached,
            &mut pipeline,
            watches,
            child,
            self.args.quiet,
            power,
        ));
        loop_result.map_err(internal)
    }

    /// Attaches every plan; symbols that failed are reported by `--missing-probes`.
    fn attach_probes(&self, bpf: &mut Ebpf) -> Result<(Attached, Vec<AttachFailure>), Failure> {
        let mut attached = Attached::default();
        let failures = match attach::attach(bpf, self.plans, &mut attached) {
            Ok(failures) => failures,
            Err(e) => {
                attach::detach_all(bpf, &mut attached);
                return Err(internal(e));
            }
        };
        if !failures.is_empty() {
            let names: Vec<&str> = failures.iter().map(|f| f.symbol.as_str()).collect();
            self.args
                .missing_probes
                .apply("functions failed to attach", &names)?;
            if failures.len() == self.plans.probe_count() {
                let paths: Vec<String> = self
                    .plans
                    .iter()
                    .map(|plan| plan.library.path.display().to_string())
                    .collect();
                return Err(internal(anyhow!(
                    "no probe could be attached to {}: {}",
                    paths.join(", "),
                    failures[0].error
                )));
            }
        }
        Ok((attached, failures))
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

fn describe_targets(args: &RunArgs, pids: &[u32]) -> String {
    if args.all {
        return "every process using libcuda".into();
    }
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!("pid {} and its children", list.join(", "))
}
