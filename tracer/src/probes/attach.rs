//! Attaching plans: the programs of each plan's probe set (libcuda's entry and return pair,
//! the injection library's `gpu_records`) on every planned symbol, each with its probe id
//! and flags as the attach cookie ([`PlannedProbe::cookie`]); on kernels without cookies
//! (before 5.15) the same value goes into `PROBES_AT` by file offset, and the entry program
//! finds it from the address it fired at.
//!
//! Two scopes. **Per process** (kernels with uprobe_multi, 6.6+, unless `--all`): each
//! traced process gets its own uprobe_multi links per library file, filtered by the kernel
//! to that process, so breakpoints exist only in traced processes and nobody else takes
//! the trap; their cookies say so, and the entry program skips the traced-process lookup.
//! **Host**: links for every process (`--all`, a run-private library, or one
//! perf-event link per symbol and program on kernels without uprobe_multi); the eBPF side
//! then drops the calls of untraced processes, after the trap.
//!
//! What the kernel does per process: a link's pid filter decides where breakpoints are
//! written (`link->task->mm == mm`, when a file is mapped or a link made) and whom its
//! program runs for (`same_thread_group`). A fork child inherits its parent's breakpoints
//! (they are in its copy of the memory) but not its links: until it has its own, it takes
//! the trap and nothing runs (the uprobe_multi handler returns 0, so the kernel leaves the
//! breakpoint in place). Hence the child's stop on its return from `fork` (discovery).
//! The links hold the process's thread-group leader: one that execs keeps them, unless a
//! thread other than the leader exec'd (the eBPF side reports it, and the links go).
//!
//! **Refused functions.** One function the kernel cannot probe (a LOCK-prefixed first
//! instruction, say) fails a whole uprobe_multi link, but only where a process maps the
//! file when the breakpoints are written: a process linked before it maps the library
//! would silently lack the breakpoint. So each file is checked once, when it is planned,
//! with cudatrace itself mapping it: the set is halved until the refused functions stand
//! alone, the others keep their links, and every later link leaves the refused ones out.
//! Per-symbol perf links are the last resort (past [`MAX_REFUSED_LINKS`] refusals): their
//! closes wait for a grace period each, one after another.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    os::fd::{AsFd, OwnedFd},
    path::Path,
    sync::mpsc,
    thread::JoinHandle,
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeLinkId, UProbeScope},
    },
};

use super::{
    helpers, maps,
    object::PROBES_OBJECT,
    plan::{Plan, PlannedProbe},
    probe_set::{PROBE_SETS, Programs},
    programs::program,
    uprobe_multi::{self, MultiLink},
};

/// A symbol that could not be attached, and why.
#[derive(Clone, Debug)]
pub struct AttachFailure {
    pub symbol: String,
    pub error: String,
}

/// What one attach call did besides making links: what it left out, and what the run should
/// hear about.
#[derive(Debug, Default)]
pub struct AttachOutcome {
    /// The symbols not attached, and why.
    pub failures: Vec<AttachFailure>,
    /// The kernel's error for the run's first refused uprobe_multi link, when this call met
    /// it: the other functions were attached with smaller uprobe_multi links.
    pub first_refusal: Option<String>,
    /// Functions left unchecked after [`MAX_REFUSED_LINKS`] refused links (they are linked
    /// per process, where a refusal fails that process's link).
    pub unchecked: usize,
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
pub struct MultiPrograms {
    loaded: HashMap<&'static str, OwnedFd>,
}

impl MultiPrograms {
    /// Loads every probe set's programs for uprobe_multi links where the kernel has them,
    /// or says why not. The maps they use must still be in `bpf` (before any is taken out).
    pub fn load(bpf: &Ebpf) -> Result<Self, String> {
        if !uprobe_multi::supported() {
            return Err("this kernel has no uprobe_multi links (Linux 6.6+)".into());
        }
        // Tests take the older kernels' path (per-symbol links, aya's programs) here too.
        if std::env::var_os("CUDATRACE_NO_UPROBE_MULTI").is_some() {
            return Err("CUDATRACE_NO_UPROBE_MULTI is set".into());
        }
        let mut programs = MultiPrograms::default();
        for set in PROBE_SETS {
            for (name, retprobe) in set.programs.names() {
                if !programs.loaded.contains_key(name) {
                    let fd = uprobe_multi::load_program(bpf, PROBES_OBJECT, name, retprobe)
                        .map_err(|error| format!("{error:#}"))?;
                    programs.loaded.insert(name, fd);
                }
            }
        }
        Ok(programs)
    }
}

/// Failed uprobe_multi attempts (each costs the kernel a grace period to undo) after which
/// the rest of a set goes to per-symbol links.
pub const MAX_REFUSED_LINKS: usize = 64;

/// Everything attached, and how.
#[derive(Debug)]
pub struct Attacher {
    scope: Scope,
    multi: Option<MultiPrograms>,
    /// Why uprobe_multi is not used, where it is not.
    pub fallback_reason: Option<String>,
    /// The kernel's error for the first uprobe_multi link it refused (a function it cannot
    /// probe): the set was then split around the refused functions.
    pub refused_reason: Option<String>,
    /// Host links: uprobe_multi links per plan.
    host_multi: Vec<MultiLink>,
    /// Host links otherwise: one perf-event link per symbol and program.
    host_perf: Vec<(&'static str, UProbeLinkId)>,
    /// Per-process links: by pid, the library ids linked and their links.
    processes: HashMap<u32, Vec<(u32, Vec<MultiLink>)>>,
    /// Probe ids the kernel refused, by library id: later links leave them out.
    refused: HashMap<u32, HashSet<u32>>,
    closer: Closer,
}

impl Attacher {
    /// Attaches with the uprobe_multi programs where they loaded, else per-symbol links.
    /// `all`: probe every process.
    pub fn new(uprobe_multi: Result<MultiPrograms, String>, all: bool) -> Self {
        let (multi, fallback_reason) = match uprobe_multi {
            Ok(programs) => (Some(programs), None),
            Err(reason) => (None, Some(reason)),
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
            refused_reason: None,
            host_multi: Vec::new(),
            host_perf: Vec::new(),
            processes: HashMap::new(),
            refused: HashMap::new(),
            closer: Closer::start(),
        }
    }

    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// `uprobe_multi`, `perf_event`, or `uprobe_multi+perf_event` when some symbols went to
    /// per-symbol links after all; for the header and doctor.
    pub fn mechanism(&self) -> &'static str {
        match (self.multi.is_some(), self.host_perf.is_empty()) {
            (true, true) => "uprobe_multi",
            (true, false) => "uprobe_multi+perf_event",
            (false, _) => "perf_event",
        }
    }

    /// Attaches `plan` (its file reached through `path`, open as `file`) for every process.
    pub fn attach_host(
        &mut self,
        bpf: &mut Ebpf,
        plan: &Plan,
        path: &Path,
        file: &File,
    ) -> Result<AttachOutcome> {
        let _mapped = map_for_check(file);
        if self.multi.is_none() {
            return Ok(AttachOutcome {
                failures: attach_per_symbol(bpf, path, plan, &plan.probes, &mut self.host_perf)?,
                ..AttachOutcome::default()
            });
        }
        let split = self.link_split(plan, &plan.probes, path, 0)?;
        self.host_multi.extend(split.links);
        let mut failures = split.failures;
        if !split.left_over.is_empty() {
            failures.extend(attach_per_symbol(
                bpf,
                path,
                plan,
                &split.left_over,
                &mut self.host_perf,
            )?);
        }
        Ok(AttachOutcome {
            failures,
            first_refusal: split.first_refusal,
            unchecked: 0,
        })
    }

    /// Per-process scope: finds the functions of `plan` the kernel refuses, once per file,
    /// with cudatrace itself mapping it (a process linked before it maps the file would
    /// not be refused, and would lack those breakpoints). Returns them, as attach failures.
    pub fn check_refused(
        &mut self,
        plan: &Plan,
        path: &Path,
        file: &File,
    ) -> Result<AttachOutcome> {
        let _mapped = map_for_check(file);
        let split = self.link_split(plan, &plan.probes, path, std::process::id())?;
        // The check's own links served their purpose.
        self.closer.close(split.links);
        Ok(AttachOutcome {
            failures: split.failures,
            first_refusal: split.first_refusal,
            // Too many refusals to tell them apart: they are linked per process, where a
            // refusal fails that process's link (and says so).
            unchecked: split.left_over.len(),
        })
    }

    /// Attaches `plan` (its file reached through `path`) for process `pid` alone, unless
    /// it is already; the functions the kernel refused are left out. Returns the symbols
    /// that could not be attached for it.
    pub fn link_process(&mut self, plan: &Plan, path: &Path, pid: u32) -> Result<AttachOutcome> {
        if self.multi.is_none() {
            bail!("per-process probes need uprobe_multi");
        }
        if self
            .processes
            .get(&pid)
            .is_some_and(|linked| linked.iter().any(|(library, _)| *library == plan.id))
        {
            return Ok(AttachOutcome::default());
        }
        let refused = self.refused.get(&plan.id);
        let probes: Vec<PlannedProbe> = plan
            .probes
            .iter()
            .filter(|probe| !refused.is_some_and(|ids| ids.contains(&probe.id)))
            .cloned()
            .collect();
        let split = if probes.is_empty() {
            Split::default()
        } else {
            self.link_split(plan, &probes, path, pid)?
        };
        let mut failures = split.failures;
        failures.extend(split.left_over.into_iter().map(|probe| AttachFailure {
            symbol: probe.symbol,
            error: format!(
                "not attached for pid {pid}: more than {MAX_REFUSED_LINKS} refused uprobe_multi \
                 links"
            ),
        }));
        self.processes
            .entry(pid)
            .or_default()
            .push((plan.id, split.links));
        Ok(AttachOutcome {
            failures,
            first_refusal: split.first_refusal,
            unchecked: 0,
        })
    }

    /// Links `probes` of `plan` for `pid` (0: every process) with uprobe_multi links: one
    /// link per program if the kernel takes them all, else the set is halved until each
    /// refused function stands alone (2 log n links per refused function).
    fn link_split(
        &mut self,
        plan: &Plan,
        probes: &[PlannedProbe],
        path: &Path,
        pid: u32,
    ) -> Result<Split> {
        let programs = self
            .multi
            .as_ref()
            .context("uprobe_multi programs not loaded")?;
        let mut split = Split::default();
        let mut refused_ids = Vec::new();
        let mut refusals = 0;
        let mut pending: Vec<&[PlannedProbe]> = vec![probes];
        while let Some(chunk) = pending.pop() {
            if chunk.is_empty() {
                continue;
            }
            if refusals >= MAX_REFUSED_LINKS {
                split.left_over.extend_from_slice(chunk);
                continue;
            }
            match link_multi(
                programs,
                &plan.set.programs,
                chunk,
                (path, &plan.library.path),
                pid,
            ) {
                Ok(made) => split.links.extend(made),
                // A program that does not load, or a bad path: no subset would do better.
                Err(error) if !is_link_refused(&error) => return Err(error),
                Err(error) => {
                    refusals += 1;
                    if self.refused_reason.is_none() {
                        let reason = format!("{error:#}");
                        split.first_refusal = Some(reason.clone());
                        self.refused_reason = Some(reason);
                    }
                    if let [probe] = chunk {
                        refused_ids.push(probe.id);
                        split.failures.push(AttachFailure {
                            symbol: probe.symbol.clone(),
                            error: format!("{error:#}"),
                        });
                    } else {
                        let (first, second) = chunk.split_at(chunk.len() / 2);
                        pending.push(second);
                        pending.push(first);
                    }
                }
            }
        }
        self.refused.entry(plan.id).or_default().extend(refused_ids);
        Ok(split)
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

    /// Takes every uprobe link out of the attacher and the object, without closing them
    /// yet: closing them detaches the probes. Nothing is attached from here on.
    pub fn take_links(&mut self, bpf: &mut Ebpf) -> Links {
        let closer = std::mem::replace(&mut self.closer, Closer::none());
        let mut multi: Vec<MultiLink> = self.host_multi.drain(..).collect();
        for (_, links) in self.processes.drain() {
            multi.extend(links.into_iter().flat_map(|(_, pair)| pair));
        }
        let mut per_symbol = Vec::with_capacity(self.host_perf.len());
        for (program_name, link_id) in self.host_perf.drain(..) {
            let program: Option<&mut UProbe> = bpf
                .program_mut(program_name)
                .and_then(|p| p.try_into().ok());
            if let Some(link) = program.and_then(|p| p.take_link(link_id).ok()) {
                per_symbol.push(link);
            }
        }
        self.multi = None;
        Links {
            multi,
            per_symbol,
            closer,
        }
    }

    /// Detaches everything: closes the links, then unloads the programs.
    pub fn detach_all(&mut self, bpf: &mut Ebpf) {
        self.take_links(bpf).close();
        unload_programs(bpf);
    }
}

/// The links of attached probes, taken out of the object: closing them detaches the
/// probes. Each uprobe link close waits for an RCU grace period (about 0.1 s in our VMs,
/// several times that on a loaded machine), so [`Links::close`] closes them from several
/// threads at once.
pub struct Links {
    multi: Vec<MultiLink>,
    per_symbol: Vec<UProbeLink>,
    /// The links already handed over for closing (processes that exited).
    closer: Closer,
}

impl Links {
    /// Closes every link: the probes are gone when this returns.
    pub fn close(self) {
        let Links {
            multi,
            per_symbol,
            mut closer,
        } = self;
        std::thread::scope(|scope| {
            scope.spawn(move || drop_in_parallel(multi));
            scope.spawn(move || closer.finish());
            drop_in_parallel(per_symbol);
        });
    }
}

/// Unloads the object's uprobe, tracepoint and kprobe programs, detaching what is still
/// attached. Each detach waits for the kernel (a grace period), so the programs are
/// unloaded from several threads at once.
pub fn unload_programs(bpf: &mut Ebpf) {
    std::thread::scope(|scope| {
        for (_, program) in bpf.programs_mut() {
            scope.spawn(move || {
                let _ = match program {
                    aya::programs::Program::UProbe(p) => p.unload(),
                    aya::programs::Program::TracePoint(p) => p.unload(),
                    aya::programs::Program::KProbe(p) => p.unload(),
                    _ => Ok(()),
                };
            });
        }
    });
}

/// The kernel refused to create a link (an errno from `BPF_LINK_CREATE`), as opposed to the
/// program failing to load, which no subset of the symbols would change.
fn is_link_refused(error: &anyhow::Error) -> bool {
    error.downcast_ref::<std::io::Error>().is_some()
}

/// Maps `file` into cudatrace itself, privately and read-only, for as long as the result
/// lives: the kernel then writes (or refuses) breakpoints when a link is made, as it would
/// in a traced process that maps the file. Nothing here ever runs its code.
fn map_for_check(file: &File) -> Option<memmap2::Mmap> {
    // SAFETY: a private read-only mapping of a library file that nothing here writes.
    unsafe { memmap2::MmapOptions::new().map_copy_read_only(file) }.ok()
}

/// What [`Attacher::link_split`] made of a set of probes.
#[derive(Default)]
struct Split {
    links: Vec<MultiLink>,
    /// The refused functions.
    failures: Vec<AttachFailure>,
    /// What is left past [`MAX_REFUSED_LINKS`] refusals.
    left_over: Vec<PlannedProbe>,
    /// The run's first refusal, met here.
    first_refusal: Option<String>,
}

/// The links for `probes`, one per program: returns first, so no entry is pushed without
/// its return. Entry-only probes (`--launch-entry-only`) are left out of the return link.
fn link_multi(
    programs: &MultiPrograms,
    set_programs: &Programs,
    probes: &[PlannedProbe],
    (path, shown_as): (&Path, &Path),
    pid: u32,
) -> Result<Vec<MultiLink>> {
    let mut links = Vec::with_capacity(2);
    for (name, retprobe) in set_programs.names() {
        let linked: Vec<&PlannedProbe> = probes
            .iter()
            .filter(|p| !(retprobe && p.entry_only))
            .collect();
        if linked.is_empty() {
            continue;
        }
        let offsets: Vec<u64> = linked.iter().map(|p| p.file_offset).collect();
        let cookies: Vec<u64> = linked.iter().map(|p| p.cookie(pid != 0)).collect();
        let program = programs
            .loaded
            .get(name)
            .with_context(|| format!("program {name} not loaded"))?;
        links.push(uprobe_multi::link(
            program.as_fd(),
            name,
            path,
            shown_as,
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
    probes: &[PlannedProbe],
    attached: &mut Vec<(&'static str, UProbeLinkId)>,
) -> Result<Vec<AttachFailure>> {
    let mut failures = Vec::new();
    let mut failed: HashSet<u32> = HashSet::new();
    let no_cookies = helpers::cookies_missing();
    if no_cookies {
        // Named before their breakpoints exist, so that no call finds its probe unnamed.
        for probe in probes {
            maps::identity::add_probe(bpf, probe.library, probe.file_offset, probe.cookie(false))?;
        }
    }
    for (program_name, retprobe) in plan.set.programs.names() {
        let program: &mut UProbe = program(bpf, program_name)?;
        // A second plan finds the programs loaded already.
        if program.fd().is_err() {
            program
                .load()
                .with_context(|| format!("loading {program_name}"))?;
        }
        for probe in probes {
            if failed.contains(&probe.id) || (retprobe && probe.entry_only) {
                continue;
            }
            // Without cookies (before 5.15) the entry program finds the probe by address.
            let cookie = (!no_cookies).then(|| probe.cookie(false));
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(probe.file_offset),
                cookie,
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
    /// One with no thread: closes at once (what is left once the links are taken out).
    fn none() -> Self {
        Closer {
            sender: None,
            thread: None,
        }
    }

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
        if links.is_empty() {
            return;
        }
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
