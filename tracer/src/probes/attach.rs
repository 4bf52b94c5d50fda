//! Attaching plans: the generic entry and return programs on every planned symbol, each
//! with its probe id as the attach cookie.
//!
//! Two scopes. **Per process** (kernels with uprobe_multi, 6.6+, unless `--all`): each
//! traced process gets its own pair of uprobe_multi links per library file, filtered by
//! the kernel to that process, so breakpoints exist only in traced processes and nobody
//! else takes the trap. **Host**: one pair of links per file for every process (`--all`,
//! or one perf-event link per symbol and program on kernels without uprobe_multi); the
//! eBPF side then drops the calls of untraced processes, after the trap.
//!
//! What the kernel does per process: a link's pid filter decides where breakpoints are
//! written (`link->task->mm == mm`, when a file is mapped or a link made) and whom its
//! program runs for (`same_thread_group`). A fork child inherits its parent's breakpoints
//! (they are in its copy of the memory) but not its links: until it has its own, it takes
//! the trap and nothing runs (the uprobe_multi handler returns 0, so the kernel leaves the
//! breakpoint in place). Hence the child's stop on its return from `fork` (discovery).
//! The links hold the process's thread-group leader: one that execs keeps them, unless a
//! thread other than the leader exec'd (the eBPF side reports it, and the links go).

use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd, OwnedFd},
    path::Path,
    sync::mpsc,
    thread::JoinHandle,
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::Array,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use tracer_common::{MAX_PROBES, ProbeSpec};

use super::{
    object::PROBES_OBJECT,
    plan::Plan,
    probe_set::PROBE_SETS,
    programs::program,
    uprobe_multi::{self, MultiLink},
};

/// A symbol that could not be attached, and why.
#[derive(Clone, Debug)]
pub struct AttachFailure {
    pub symbol: String,
    pub error: String,
}

/// Where the probes of a plan go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Into every process that maps the file (`--all`; kernels without uprobe_multi).
    Host,
    /// Into each traced process, as it maps the file.
    PerProcess,
}

/// The probe sets' programs, loaded once for uprobe_multi links, by name.
#[derive(Debug, Default)]
struct MultiPrograms {
    loaded: HashMap<&'static str, OwnedFd>,
}

/// Everything attached, and how.
#[derive(Debug)]
pub struct Attacher {
    scope: Scope,
    multi: Option<MultiPrograms>,
    /// Why uprobe_multi is not used, where it is not.
    pub fallback_reason: Option<String>,
    /// Host links: two uprobe_multi links per plan.
    host_multi: Vec<MultiLink>,
    /// Host links otherwise: one perf-event link per symbol and program.
    host_perf: Vec<(&'static str, UProbeLinkId)>,
    /// Per-process links: by pid, the library ids linked and their links.
    processes: HashMap<u32, Vec<(u32, Vec<MultiLink>)>>,
    closer: Closer,
}

impl Attacher {
    /// Loads what attaching needs: the uprobe_multi programs where the kernel has them
    /// (before any map is taken out of `bpf`). `all`: probe every process.
    pub fn new(bpf: &Ebpf, all: bool) -> Self {
        let (multi, fallback_reason) = if uprobe_multi::supported() {
            match load_multi(bpf) {
                Ok(programs) => (Some(programs), None),
                Err(error) => (None, Some(format!("{error:#}"))),
            }
        } else {
            (
                None,
                Some("this kernel has no uprobe_multi links (Linux 6.6+)".into()),
            )
        };
        let scope = if multi.is_some() && !all {
            Scope::PerProcess
        } else {
            Scope::Host
        };
        Attacher {
            scope,
            multi,
            fallback_reason,
            host_multi: Vec::new(),
            host_perf: Vec::new(),
            processes: HashMap::new(),
            closer: Closer::start(),
        }
    }

    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// `uprobe_multi` or `perf_event`, for the header and doctor.
    pub fn mechanism(&self) -> &'static str {
        if self.multi.is_some() {
            "uprobe_multi"
        } else {
            "perf_event"
        }
    }

    /// Writes a plan's specs into the `SPECS` map: before any of its probes can fire.
    pub fn write_specs(bpf: &mut Ebpf, plan: &Plan) -> Result<()> {
        if let Some(last) = plan.probes.last()
            && last.id >= MAX_PROBES
        {
            bail!(
                "{} symbols to attach in all, more than the {MAX_PROBES} the probes support",
                last.id + 1
            );
        }
        let mut specs: Array<_, ProbeSpec> =
            Array::try_from(bpf.map_mut("SPECS").context("map SPECS missing")?)?;
        for probe in &plan.probes {
            specs.set(probe.id, probe.spec.probe_spec(), 0)?;
        }
        Ok(())
    }

    /// Attaches `plan` (its file reached through `path`) for every process.
    pub fn attach_host(
        &mut self,
        bpf: &mut Ebpf,
        plan: &Plan,
        path: &Path,
    ) -> Result<Vec<AttachFailure>> {
        if let Some(programs) = &self.multi {
            match link_multi(programs, plan, path, 0) {
                Ok(links) => {
                    self.host_multi.extend(links);
                    return Ok(Vec::new());
                }
                // One bad offset fails a whole multi link: per-symbol links name the culprit.
                Err(error) => eprintln!(
                    "cudatrace: uprobe_multi attach to {} failed, attaching symbol by symbol: \
                     {error:#}",
                    plan.library.path.display()
                ),
            }
        }
        attach_per_symbol(bpf, path, plan, &mut self.host_perf)
    }

    /// Attaches `plan` (its file reached through `path`) for process `pid` alone, unless
    /// it is already. Returns whether links were made.
    pub fn link_process(&mut self, plan: &Plan, path: &Path, pid: u32) -> Result<bool> {
        let programs = self
            .multi
            .as_ref()
            .context("per-process probes need uprobe_multi")?;
        let linked = self.processes.entry(pid).or_default();
        if linked.iter().any(|(library, _)| *library == plan.id) {
            return Ok(false);
        }
        linked.push((plan.id, link_multi(programs, plan, path, pid)?));
        Ok(true)
    }

    /// The library ids linked for `pid`.
    pub fn linked_libraries(&self, pid: u32) -> Vec<u32> {
        self.processes
            .get(&pid)
            .map(|links| links.iter().map(|(library, _)| *library).collect())
            .unwrap_or_default()
    }

    /// Drops `pid`'s links (it exited, or exec'd into a new leader), in the background:
    /// each close waits for an RCU grace period.
    pub fn forget_process(&mut self, pid: u32) {
        if let Some(links) = self.processes.remove(&pid) {
            self.closer
                .close(links.into_iter().flat_map(|(_, pair)| pair).collect());
        }
    }

    /// Detaches everything. Each uprobe link close waits for an RCU grace period (about
    /// 0.1 s in our VMs), so links are closed from several threads at once.
    pub fn detach_all(&mut self, bpf: &mut Ebpf) {
        self.closer.finish();
        let mut multi: Vec<MultiLink> = self.host_multi.drain(..).collect();
        for (_, links) in self.processes.drain() {
            multi.extend(links.into_iter().flat_map(|(_, pair)| pair));
        }
        drop_in_parallel(multi);
        let mut links = Vec::with_capacity(self.host_perf.len());
        for (program_name, link_id) in self.host_perf.drain(..) {
            let program: Option<&mut UProbe> = bpf
                .program_mut(program_name)
                .and_then(|p| p.try_into().ok());
            if let Some(link) = program.and_then(|p| p.take_link(link_id).ok()) {
                links.push(link);
            }
        }
        drop_in_parallel(links);
        self.multi = None;
        let names: Vec<String> = bpf.programs().map(|(name, _)| name.to_owned()).collect();
        for name in names {
            if let Some(program) = bpf.program_mut(&name) {
                let _ = match program {
                    aya::programs::Program::UProbe(p) => p.unload(),
                    aya::programs::Program::TracePoint(p) => p.unload(),
                    _ => Ok(()),
                };
            }
        }
    }
}

/// Loads every probe set's programs (the maps they use must still be in `bpf`: before the
/// event loop takes the ring out).
fn load_multi(bpf: &Ebpf) -> Result<MultiPrograms> {
    let mut programs = MultiPrograms::default();
    for set in PROBE_SETS {
        for (name, retprobe) in set.programs.names() {
            if !programs.loaded.contains_key(name) {
                let fd = uprobe_multi::load_program(bpf, PROBES_OBJECT, name, retprobe)?;
                programs.loaded.insert(name, fd);
            }
        }
    }
    Ok(programs)
}

/// The links for all of `plan`'s symbols, one per program: returns first, so no entry is
/// pushed without its return.
fn link_multi(
    programs: &MultiPrograms,
    plan: &Plan,
    path: &Path,
    pid: u32,
) -> Result<Vec<MultiLink>> {
    let offsets: Vec<u64> = plan.probes.iter().map(|p| p.file_offset).collect();
    let cookies: Vec<u64> = plan.probes.iter().map(|p| u64::from(p.id)).collect();
    let mut links = Vec::with_capacity(2);
    for (name, retprobe) in plan.set.programs.names() {
        let program = programs
            .loaded
            .get(name)
            .with_context(|| format!("program {name} not loaded"))?;
        links.push(uprobe_multi::link(
            program.as_fd(),
            name,
            path,
            &offsets,
            &cookies,
            retprobe,
            pid,
        )?);
    }
    Ok(links)
}

/// One perf-event link per symbol and program (kernels before 6.6). Detaching these is
/// slow: each close waits for an RCU grace period, one after another.
fn attach_per_symbol(
    bpf: &mut Ebpf,
    lib_path: &Path,
    plan: &Plan,
    attached: &mut Vec<(&'static str, UProbeLinkId)>,
) -> Result<Vec<AttachFailure>> {
    let mut failures = Vec::new();
    let mut failed: HashSet<u32> = HashSet::new();
    for (program_name, _) in plan.set.programs.names() {
        let program: &mut UProbe = program(bpf, program_name)?;
        // A second plan finds the programs loaded already.
        if program.fd().is_err() {
            program
                .load()
                .with_context(|| format!("loading {program_name}"))?;
        }
        for probe in &plan.probes {
            if failed.contains(&probe.id) {
                continue;
            }
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(probe.file_offset),
                cookie: Some(u64::from(probe.id)),
            };
            match program.attach(point, lib_path, UProbeScope::AllProcesses) {
                Ok(link) => attached.push((program_name, link)),
                Err(error) => {
                    failed.insert(probe.id);
                    failures.push(AttachFailure {
                        symbol: probe.symbol.clone(),
                        error: format!("{:#}", anyhow::Error::from(error)),
                    });
                }
            }
        }
    }
    Ok(failures)
}

/// Drops everything in `items` from up to 64 threads at once.
fn drop_in_parallel<T: Send>(mut items: Vec<T>) {
    let per_thread = items.len().div_ceil(64).max(1);
    std::thread::scope(|scope| {
        while !items.is_empty() {
            let chunk: Vec<T> = items.drain(..per_thread.min(items.len())).collect();
            scope.spawn(move || drop(chunk));
        }
    });
}

/// Closes links in a background thread, so that a process's exit does not hold up the
/// event loop for a grace period.
#[derive(Debug)]
struct Closer {
    sender: Option<mpsc::Sender<Vec<MultiLink>>>,
    thread: Option<JoinHandle<()>>,
}

impl Closer {
    fn start() -> Self {
        let (sender, receiver) = mpsc::channel::<Vec<MultiLink>>();
        let thread = std::thread::Builder::new()
            .name("cudatrace-close".into())
            .spawn(move || {
                while let Ok(mut links) = receiver.recv() {
                    while let Ok(more) = receiver.try_recv() {
                        links.extend(more);
                    }
                    drop_in_parallel(links);
                }
            })
            .ok();
        Closer {
            sender: thread.is_some().then_some(sender),
            thread,
        }
    }

    fn close(&self, links: Vec<MultiLink>) {
        match &self.sender {
            Some(sender) => {
                if let Err(mpsc::SendError(links)) = sender.send(links) {
                    drop_in_parallel(links);
                }
            }
            None => drop_in_parallel(links),
        }
    }

    /// Waits until everything handed over is closed.
    fn finish(&mut self) {
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
