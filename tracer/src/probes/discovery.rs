//! Libraries found where the traced processes load them, and the probes kept attached there
//! while tracing runs.
//!
//! The eBPF side (`tracer-ebpf/src/discovery.rs`) reports, with the process stopped until
//! this side is done:
//! - a traced process opened a file named like a probe-set library: the file is read
//!   through `/proc/PID/fd/FD` (so a container's own file is found whatever its mount
//!   namespace), planned once per device and inode, attached, then the process continues;
//! - a process with per-process probes forked: the child gets its own before it runs;
//! - a process exec'd from a thread other than its leader: its per-process probes held the
//!   old leader and are dropped (the new image makes them again when it maps a library).
//!
//! Every stop ends in `SIGCONT`, also when tracing ends ([`Discovery::finish`]).

use std::{
    collections::HashSet,
    fs::{self, File},
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    thread::JoinHandle,
};

use anyhow::{Context, Result};
use aya::Ebpf;
use tracer_common::{AttachEvent, SET_UNKNOWN, attach_event, attach_flags};

use super::{
    attach::{self, AttachFailure, Attacher, Scope},
    library::Library,
    maps,
    plan::{FunctionSelection, MissingProbes, Plan, Plans},
    probe_set::{PROBE_SETS, ProbeSet},
};
use crate::schema::{AttachFailureInfo, LibraryLine, ProbeInfo, StopFigures};

/// How a library file came to be attached: the `library` line's `found`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// The default search (ldconfig cache, `LD_LIBRARY_PATH`, the usual directories).
    Search,
    /// `--libcuda PATH`, `--lib PATH`.
    Explicit,
    /// Mapped by a `-p`/`--all` process when tracing started.
    Mapped,
    /// Opened by a traced process while tracing.
    Opened,
    /// Written by cudatrace for the run (`--gpu`'s injection library).
    Written,
}

impl Found {
    pub fn as_str(self) -> &'static str {
        match self {
            Found::Search => "search",
            Found::Explicit => "explicit",
            Found::Mapped => "mapped",
            Found::Opened => "opened",
            Found::Written => "written",
        }
    }
}

/// A library file to plan: its probe set, its exports, the open file, how it was found.
pub struct FoundLibrary {
    pub set: &'static ProbeSet,
    pub library: Library,
    pub file: File,
    pub found: Found,
    /// `Mapped`, `Opened`: the process, and when (`Opened`).
    pub pid: Option<u32>,
    pub ts_ns: Option<u64>,
}

impl FoundLibrary {
    /// Opens and reads `set`'s library at `path`.
    pub fn open(set: &'static ProbeSet, path: &Path, found: Found) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let library = Library::read(set, &file, path)?;
        Ok(FoundLibrary {
            set,
            library,
            file,
            found,
            pid: None,
            ts_ns: None,
        })
    }
}

/// A probe-set library file a process maps, opened but not read yet.
struct MappedFile {
    set: &'static ProbeSet,
    file: File,
    /// As the process's maps name it.
    path: PathBuf,
    device: u64,
    inode: u64,
}

/// Probe-set library files mapped by process `pid` (from its `/proc/PID/maps`), each opened
/// through `/proc/PID/map_files` (which reaches it in any mount namespace) or else
/// `/proc/PID/root`.
fn mapped_files(pid: u32) -> Vec<MappedFile> {
    let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let mut found: Vec<MappedFile> = Vec::new();
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let Some(range) = fields.next() else { continue };
        // perms, offset, device, inode, then the path (which may hold spaces).
        let path = fields.skip(4).collect::<Vec<_>>().join(" ");
        let Some(name) = Path::new(&path).file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(set) = PROBE_SETS
            .iter()
            .copied()
            .find(|set| !set.run_private && set.matches_file_name(name))
        else {
            continue;
        };
        let file = File::open(format!("/proc/{pid}/map_files/{range}"))
            .or_else(|_| File::open(format!("/proc/{pid}/root{path}")));
        let Ok(file) = file else { continue };
        let Ok(metadata) = file.metadata() else {
            continue;
        };
        let (device, inode) = (metadata.dev(), metadata.ino());
        if found.iter().any(|f| (f.device, f.inode) == (device, inode)) {
            continue;
        }
        found.push(MappedFile {
            set,
            file,
            path: PathBuf::from(path),
            device,
            inode,
        });
    }
    found
}

/// The names the eBPF side recognises libraries by: every probe set's soname (with any
/// version after it), and the exact file name of each library given by path.
pub fn library_names(explicit: &[&FoundLibrary]) -> Vec<maps::LibraryName> {
    let mut names: Vec<maps::LibraryName> = PROBE_SETS
        .iter()
        .filter(|set| !set.run_private)
        .map(|set| maps::LibraryName {
            set: set.index(),
            name: set.soname.to_owned(),
            exact: false,
        })
        .collect();
    for found in explicit.iter().filter(|found| !found.set.run_private) {
        let Some(name) = found.library.file.path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !found.set.matches_file_name(name) && !names.iter().any(|n| n.name == name) {
            names.push(maps::LibraryName {
                set: found.set.index(),
                name: name.to_owned(),
                exact: true,
            });
        }
    }
    names
}

/// The attach layer while tracing: the object, the plans (one per library file), the
/// links, and the processes stopped for them.
pub struct Discovery {
    /// The object, until [`Discovery::end`] hands it to the thread that detaches it.
    bpf: Option<Ebpf>,
    pub attacher: Attacher,
    pub plans: Plans,
    /// Each plan's file, open: probes attach to `/proc/self/fd/N`, which reaches the file
    /// whatever mount namespace its path belongs to.
    files: Vec<File>,
    policy: MissingProbes,
    /// `--functions`: what to probe in each library found (its catalog alone for a
    /// run-private one).
    selection: FunctionSelection,
    /// Missing-function lists already reported, so that each copy does not repeat them.
    reported_missing: HashSet<Vec<&'static str>>,
    /// Symbols that failed to attach, per library id.
    pub failures: Vec<(u32, AttachFailure)>,
    /// Some traced process opened or mapped a probe-set library.
    pub loaded_any: bool,
    pub stops: StopFigures,
    /// Tracing is ending: processes are continued, nothing more is attached.
    ending: bool,
    /// The events' clock (`CLOCK_MONOTONIC` ns), to time the stops.
    clock: fn() -> u64,
    finished: bool,
}

/// The object while tracing runs.
fn object(bpf: &mut Option<Ebpf>) -> &mut Ebpf {
    bpf.as_mut().expect("the object is kept until tracing ends")
}

impl Discovery {
    /// The eBPF object (its maps, its programs), until tracing ends.
    pub fn bpf(&mut self) -> &mut Ebpf {
        object(&mut self.bpf)
    }

    pub fn new(
        bpf: Ebpf,
        attacher: Attacher,
        policy: MissingProbes,
        selection: FunctionSelection,
        clock: fn() -> u64,
    ) -> Self {
        Discovery {
            bpf: Some(bpf),
            attacher,
            plans: Plans::default(),
            files: Vec::new(),
            policy,
            selection,
            reported_missing: HashSet::new(),
            failures: Vec::new(),
            loaded_any: false,
            stops: StopFigures::default(),
            ending: false,
            clock,
            finished: false,
        }
    }

    fn attach_path(&self, library: u32) -> PathBuf {
        PathBuf::from(format!(
            "/proc/self/fd/{}",
            self.files[library as usize].as_raw_fd()
        ))
    }

    /// Plans `found` (or finds its plan, for a file already planned) and attaches it for
    /// the host when that is the scope. Returns its id and, for a new file, its line.
    pub fn add(&mut self, found: FoundLibrary) -> Result<(u32, Option<LibraryLine>)> {
        let file = &found.library.file;
        if let Some(plan) = self.plans.of_file(file.device, file.inode) {
            return Ok((plan.id, None));
        }
        let selection = if found.set.run_private {
            FunctionSelection::default()
        } else {
            self.selection.clone()
        };
        let id = self.plans.add(found.set, &found.library, &selection).id;
        let FoundLibrary {
            file,
            found: how,
            pid,
            ts_ns,
            ..
        } = found;
        self.files.push(file);
        let plan = self.plans.get(id).expect("just planned");
        // The policy was applied to the libraries given or searched for before tracing;
        // one found later cannot stop the run, so `error` only warns for it, once per list.
        let first_time = self.reported_missing.insert(plan.missing.clone());
        let found_later = matches!(how, Found::Mapped | Found::Opened);
        if !plan.missing.is_empty()
            && first_time
            && found_later
            && self.policy != MissingProbes::Ignore
        {
            let why = format!("functions not exported by {}", plan.library.path.display());
            let _ = MissingProbes::Warn.apply(&why, &plan.missing);
        }
        if !plan.unmatched_globs.is_empty() && found_later && self.policy != MissingProbes::Ignore {
            let what = format!(
                "patterns of --functions match no export of {}",
                plan.library.path.display()
            );
            let globs: Vec<&str> = plan.unmatched_globs.iter().map(String::as_str).collect();
            let _ = MissingProbes::Warn.apply(&what, &globs);
        }
        Attacher::write_specs(object(&mut self.bpf), plan)?;
        if !plan.probes.is_empty() {
            let path = self.attach_path(id);
            let plan = self.plans.get(id).expect("just planned");
            let file = &self.files[id as usize];
            // A run-private file (the injection library) is mapped by this run's processes
            // alone: host links cost nobody else, and every traced process has them however
            // it was created.
            let failures = if self.attacher.scope() == Scope::Host || plan.set.run_private {
                self.attacher
                    .attach_host(object(&mut self.bpf), plan, &path, file)?
            } else {
                self.attacher.check_refused(plan, &path, file)?
            };
            self.failures
                .extend(failures.into_iter().map(|failure| (id, failure)));
        }
        let plan = self.plans.get(id).expect("just planned");
        Ok((
            id,
            Some(library_line(plan, how, pid, ts_ns, &self.failures)),
        ))
    }

    /// Gives `pid` its own probes on library `id` (per-process scope). Returns whether
    /// the process has any.
    pub fn link(&mut self, id: u32, pid: u32) -> Result<bool> {
        if self.attacher.scope() != Scope::PerProcess {
            return Ok(false);
        }
        let plan = self.plans.get(id).context("no such library")?;
        if !plan.probes.is_empty() && !plan.set.run_private {
            let path = self.attach_path(id);
            let plan = self.plans.get(id).expect("checked");
            let failures = self.attacher.link_process(plan, &path, pid)?;
            if !failures.is_empty() {
                let names: Vec<&str> = failures.iter().map(|f| f.symbol.as_str()).collect();
                eprintln!(
                    "cudatrace: pid {pid}: {} functions of {} not attached: {} ({})",
                    names.len(),
                    plan.library.path.display(),
                    names.join(", "),
                    failures[0].error
                );
            }
        }
        let linked = !self.attacher.linked_libraries(pid).is_empty();
        if linked {
            maps::mark_linked(object(&mut self.bpf), pid)?;
        }
        Ok(linked)
    }

    /// Acts on an attach event from the ring; returns the `library` lines of files
    /// attached for the first time.
    pub fn handle(&mut self, event: &AttachEvent) -> Vec<LibraryLine> {
        let pid = event.header.pid;
        let stopped = event.header.flags & attach_flags::STOPPED != 0;
        if event.header.flags & attach_flags::STOP_FAILED != 0 {
            self.stops.failed += 1;
        }
        let mut lines = Vec::new();
        if !self.ending {
            let result = match event.what {
                attach_event::LIBRARY_OPENED => self.opened(event).map(|l| lines.extend(l)),
                attach_event::FORKED => self.forked(pid, event.parent).map(|l| lines = l),
                attach_event::NEW_LEADER => {
                    self.attacher.forget_process(pid);
                    Ok(())
                }
                _ => Ok(()),
            };
            if let Err(error) = result {
                eprintln!("cudatrace: pid {pid}: {error:#}");
            }
        }
        if stopped {
            self.continue_process(pid, event.header.ts_ns);
        }
        lines
    }

    fn opened(&mut self, event: &AttachEvent) -> Result<Option<LibraryLine>> {
        let pid = event.header.pid;
        let fd_path = format!("/proc/{pid}/fd/{}", event.fd);
        let file = match File::open(&fd_path) {
            Ok(file) => file,
            // Gone already (the process was killed): nothing to attach.
            Err(_) => return Ok(None),
        };
        let metadata = file.metadata()?;
        let (id, line) = match self.plans.of_file(metadata.dev(), metadata.ino()) {
            Some(plan) => (plan.id, None),
            None => {
                let path = if event.set == SET_UNKNOWN {
                    fs::read_link(&fd_path)?
                } else {
                    let len = (event.path_len as usize).min(event.path.len());
                    PathBuf::from(String::from_utf8_lossy(&event.path[..len]).into_owned())
                };
                let set = match PROBE_SETS.get(event.set as usize) {
                    Some(set) => *set,
                    None => {
                        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                        match PROBE_SETS
                            .iter()
                            .find(|s| !s.run_private && s.matches_file_name(name))
                        {
                            Some(set) => *set,
                            // A long path that is no library after all.
                            None => return Ok(None),
                        }
                    }
                };
                let library = Library::read(set, &file, &path)?;
                self.add(FoundLibrary {
                    set,
                    library,
                    file,
                    found: Found::Opened,
                    pid: Some(pid),
                    ts_ns: Some(event.header.ts_ns),
                })?
            }
        };
        self.loaded_any = true;
        self.link(id, pid)?;
        Ok(line)
    }

    /// A child of a process with per-process probes: the same probes, before it runs.
    /// Returns the `library` lines of files planned for it.
    fn forked(&mut self, child: u32, parent: u32) -> Result<Vec<LibraryLine>> {
        let libraries = self.attacher.linked_libraries(parent);
        if libraries.is_empty() {
            // The parent is gone (and forgotten): what the child maps says it.
            return self.add_mapped(child, true);
        }
        for id in libraries {
            self.link(id, child)?;
        }
        Ok(Vec::new())
    }

    /// Plans the probe-set libraries process `pid` maps (a file already planned is not
    /// read again) and, when `link`, gives the process its probes on each. Returns the
    /// `library` lines of the files planned for the first time.
    pub fn add_mapped(&mut self, pid: u32, link: bool) -> Result<Vec<LibraryLine>> {
        let mut lines = Vec::new();
        for mapped in mapped_files(pid) {
            let id = match self.plans.of_file(mapped.device, mapped.inode) {
                Some(plan) => plan.id,
                None => {
                    let library = Library::read(mapped.set, &mapped.file, &mapped.path)?;
                    let (id, line) = self.add(FoundLibrary {
                        set: mapped.set,
                        library,
                        file: mapped.file,
                        found: Found::Mapped,
                        pid: Some(pid),
                        ts_ns: None,
                    })?;
                    lines.extend(line);
                    id
                }
            };
            self.loaded_any = true;
            if link {
                self.link(id, pid)?;
            }
        }
        Ok(lines)
    }

    fn continue_process(&mut self, pid: u32, stopped_at_ns: u64) {
        // Ending, nothing more is attached: each stop goes on at once (a stop that raced
        // with the end is continued here, whatever the stop counts say).
        if !self.ending && !maps::stop_handled(object(&mut self.bpf), pid) {
            // Another thread's stop of the same process is still to be handled.
            return;
        }
        // SAFETY: kill(2); the pid was stopped by our probes (ESRCH if it died since).
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        let stopped_ns = (self.clock)().saturating_sub(stopped_at_ns);
        self.stops.count += 1;
        self.stops.total_ns += stopped_ns;
        self.stops.max_ns = self.stops.max_ns.max(stopped_ns);
    }

    /// A traced process exited: its links go.
    pub fn process_exited(&mut self, pid: u32) {
        self.attacher.forget_process(pid);
    }

    /// Tracing ends: no more stops, and from now on events only continue processes.
    pub fn begin_ending(&mut self) {
        self.ending = true;
        if let Some(bpf) = &mut self.bpf
            && let Err(error) = maps::allow_stops(bpf, false)
        {
            eprintln!("cudatrace: {error:#}");
        }
    }

    /// Continues every process still stopped.
    fn continue_stopped(&mut self) {
        let Some(bpf) = &mut self.bpf else { return };
        for pid in maps::stopped_pids(bpf).unwrap_or_default() {
            maps::forget_stopped(bpf, pid);
            // SAFETY: kill(2) of a process our probes stopped.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
    }

    /// Tracing ends: no more stops, every process still stopped goes on, and the links
    /// and the object go to a thread of their own that detaches everything (the kernel
    /// takes a grace period per detach), while the caller drains the ring: stop events
    /// still in it continue their processes. Joining the thread means all is detached.
    pub fn end(&mut self) -> JoinHandle<()> {
        self.begin_ending();
        self.continue_stopped();
        self.finished = true;
        let mut bpf = self
            .bpf
            .take()
            .expect("the object is kept until tracing ends");
        let links = self.attacher.take_links(&mut bpf);
        std::thread::spawn(move || {
            std::thread::scope(|scope| {
                scope.spawn(move || links.close());
                attach::unload_programs(&mut bpf);
            });
            drop(bpf);
        })
    }

    /// Continues every process still stopped (after the last events were handled) and
    /// detaches everything: what [`Discovery::end`] left, and the programs.
    pub fn finish(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.begin_ending();
        self.continue_stopped();
        if let Some(bpf) = &mut self.bpf {
            self.attacher.detach_all(bpf);
        }
    }
}

impl Drop for Discovery {
    /// Every way out (an error, a panic) continues what was stopped.
    fn drop(&mut self) {
        self.finish();
    }
}

/// The `library` line of a plan.
pub fn library_line(
    plan: &Plan,
    found: Found,
    pid: Option<u32>,
    ts_ns: Option<u64>,
    failures: &[(u32, AttachFailure)],
) -> LibraryLine {
    let failed: HashSet<&str> = failures
        .iter()
        .filter(|(id, _)| *id == plan.id)
        .map(|(_, f)| f.symbol.as_str())
        .collect();
    LibraryLine {
        id: plan.id,
        set: plan.set.library.to_owned(),
        path: plan.library.path.display().to_string(),
        device: plan.library.device,
        inode: plan.library.inode,
        version: plan.library.version.clone(),
        standin: plan.library.standin,
        found: found.as_str().to_owned(),
        pid,
        ts_ns,
        probes: plan
            .probes
            .iter()
            .filter(|p| !failed.contains(p.symbol.as_str()))
            .map(|p| ProbeInfo {
                id: p.id,
                lib: p.library,
                symbol: p.symbol.clone(),
                function: p.function().into(),
                family: p.spec.family.as_str().into(),
                entry_only: p.entry_only,
            })
            .collect(),
        missing_functions: plan.missing.iter().map(|f| f.to_string()).collect(),
        aliases: plan.aliases.clone(),
        attach_failures: failures
            .iter()
            .filter(|(id, _)| *id == plan.id)
            .map(|(_, f)| AttachFailureInfo {
                symbol: f.symbol.clone(),
                error: f.error.clone(),
            })
            .collect(),
        ..LibraryLine::default()
    }
}
