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
//! The stops themselves, and continuing the processes, are [`super::stops`]'s. What is
//! done here comes back as data ([`Attached`]): the run turns it into `library` lines and
//! reports.

use std::{
    fs::{self, File},
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
    thread::JoinHandle,
};

use anyhow::{Context, Result};
use aya::Ebpf;
use tracer_common::{AttachEvent, LibraryMapping, SET_UNKNOWN, attach_event};

use super::{
    attach::{self, AttachOutcome, Attacher, Scope},
    helpers,
    library::Library,
    maps::{self, LinkedSet, ProbeTable},
    plan::{FunctionSelection, Plans},
    probe_set::{PROBE_SETS, ProbeSet},
};

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

/// A file planned and not yet attached ([`Discovery::plan`]).
struct Planned {
    id: u32,
    found: Found,
    pid: Option<u32>,
    ts_ns: Option<u64>,
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

/// Whether process `pid` maps a probe-set library (one of [`mapped_files`]).
pub fn maps_probe_set_library(pid: u32) -> bool {
    !mapped_files(pid).is_empty()
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

/// What the attach layer did, in the order it did it.
#[derive(Debug)]
pub enum Attached {
    /// A library file planned for the first time (its plan is [`Discovery::plans`]'s
    /// `id`), and what attaching it left out.
    Library(NewLibrary),
    /// A traced process opened or maps a probe-set library.
    Loaded,
    /// Process `pid` got its own probes on library `library`, but they left something out
    /// (only then is it said).
    Linked {
        pid: u32,
        library: u32,
        outcome: AttachOutcome,
    },
}

/// A library file planned and attached for the first time.
#[derive(Debug)]
pub struct NewLibrary {
    pub id: u32,
    pub found: Found,
    /// `Mapped`, `Opened`: the process, and when (`Opened`).
    pub pid: Option<u32>,
    pub ts_ns: Option<u64>,
    pub outcome: AttachOutcome,
}

/// What the attach layer did for one attach event.
#[derive(Debug, Default)]
pub struct Handled {
    pub attached: Vec<Attached>,
    /// What could not be done (the process goes on without it).
    pub error: Option<anyhow::Error>,
    /// The library file the event was about, where known: what the error left unattached.
    pub library: Option<PathBuf>,
}

/// The attach layer while tracing: the plans (one per library file) and the links. The
/// object is lent to it to attach and detach.
pub struct Discovery {
    attacher: Attacher,
    pub plans: Plans,
    /// Each plan's file, open: probes attach to `/proc/self/fd/N`, which reaches the file
    /// whatever mount namespace its path belongs to.
    files: Vec<File>,
    /// `--functions`: what to probe in each library found (its catalog alone for a
    /// run-private one).
    selection: FunctionSelection,
    probe_table: ProbeTable,
    linked: LinkedSet,
}

impl Discovery {
    pub fn new(
        attacher: Attacher,
        probe_table: ProbeTable,
        linked: LinkedSet,
        selection: FunctionSelection,
    ) -> Self {
        Discovery {
            attacher,
            plans: Plans::default(),
            files: Vec::new(),
            selection,
            probe_table,
            linked,
        }
    }

    /// How the probes are attached.
    pub fn attacher(&self) -> &Attacher {
        &self.attacher
    }

    fn attach_path(&self, library: u32) -> PathBuf {
        PathBuf::from(format!(
            "/proc/self/fd/{}",
            self.files[library as usize].as_raw_fd()
        ))
    }

    /// Plans `found` (or finds its plan, for a file already planned) and attaches it for
    /// the host when that is the scope. Returns its id; a new file is in `attached`.
    fn add(
        &mut self,
        bpf: &mut Ebpf,
        found: FoundLibrary,
        attached: &mut Vec<Attached>,
    ) -> Result<u32> {
        let (id, planned) = self.plan(found)?;
        if let Some(planned) = planned {
            self.attach_planned(bpf, planned, attached)?;
        }
        Ok(id)
    }

    /// Plans the libraries `found`, records process `pids`' mappings of planned files
    /// where probes are known by where they fire (no attach cookies), and only then
    /// attaches the new files: a probe that fires in a traced process from its attach on
    /// is known at once. Returns their ids, in order.
    pub fn add_all(
        &mut self,
        bpf: &mut Ebpf,
        found: Vec<FoundLibrary>,
        pids: &[u32],
        attached: &mut Vec<Attached>,
    ) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut new = Vec::new();
        for found in found {
            let (id, planned) = self.plan(found)?;
            ids.push(id);
            new.extend(planned);
        }
        for &pid in pids {
            self.record_mappings(bpf, pid)?;
        }
        for planned in new {
            self.attach_planned(bpf, planned, attached)?;
        }
        Ok(ids)
    }

    /// Without attach cookies, records process `pid`'s mappings of the files planned so
    /// far (a mapping recorded before is not recorded again).
    fn record_mappings(&self, bpf: &mut Ebpf, pid: u32) -> Result<()> {
        if helpers::cookies_missing() {
            maps::identity::add_mappings(bpf, pid, &self.planned_mappings(pid))?;
        }
        Ok(())
    }

    /// Plans `found`, or finds the plan of its file. Returns its id and, for a file new
    /// here, what attaching it needs ([`Discovery::attach_planned`]).
    fn plan(&mut self, found: FoundLibrary) -> Result<(u32, Option<Planned>)> {
        let file = &found.library.file;
        if let Some(plan) = self.plans.of_file(file.device, file.inode) {
            return Ok((plan.id, None));
        }
        let selection = if found.set.run_private {
            FunctionSelection::default()
        } else {
            self.selection.clone()
        };
        let id = self.plans.add(found.set, &found.library, &selection)?.id;
        let FoundLibrary {
            file,
            found: how,
            pid,
            ts_ns,
            ..
        } = found;
        self.files.push(file);
        let plan = self.plans.get(id).expect("just planned");
        self.probe_table.write(plan)?;
        Ok((
            id,
            Some(Planned {
                id,
                found: how,
                pid,
                ts_ns,
            }),
        ))
    }

    /// Attaches a file just planned, for the host when that is the scope (else checks
    /// that the kernel takes its probes); its library goes in `attached`.
    fn attach_planned(
        &mut self,
        bpf: &mut Ebpf,
        planned: Planned,
        attached: &mut Vec<Attached>,
    ) -> Result<()> {
        let Planned {
            id,
            found: how,
            pid,
            ts_ns,
        } = planned;
        let plan = self.plans.get(id).expect("planned");
        let mut outcome = AttachOutcome::default();
        if !plan.probes.is_empty() {
            let path = self.attach_path(id);
            let file = &self.files[id as usize];
            // A run-private file (the injection library) is mapped by this run's processes
            // alone: host links cost nobody else, and every traced process has them however
            // it was created.
            outcome = if self.attacher.scope() == Scope::Host || plan.set.run_private {
                self.attacher.attach_host(bpf, plan, &path, file)?
            } else {
                self.attacher.check_refused(plan, &path, file)?
            };
        }
        attached.push(Attached::Library(NewLibrary {
            id,
            found: how,
            pid,
            ts_ns,
            outcome,
        }));
        Ok(())
    }

    /// Gives `pid` its own probes on library `id` (per-process scope); what they left out
    /// is in `attached`. Returns whether the process has any.
    pub fn link(&mut self, id: u32, pid: u32, attached: &mut Vec<Attached>) -> Result<bool> {
        if self.attacher.scope() != Scope::PerProcess {
            return Ok(false);
        }
        let plan = self.plans.get(id).context("no such library")?;
        if !plan.probes.is_empty() && !plan.set.run_private {
            let path = self.attach_path(id);
            let plan = self.plans.get(id).expect("checked");
            let outcome = self.attacher.link_process(plan, &path, pid)?;
            if !outcome.failures.is_empty() || outcome.first_refusal.is_some() {
                attached.push(Attached::Linked {
                    pid,
                    library: id,
                    outcome,
                });
            }
        }
        let linked = !self.attacher.linked_libraries(pid).is_empty();
        if linked {
            self.linked.mark(pid)?;
        }
        Ok(linked)
    }

    /// Acts on an attach event from the ring (a library opened, a fork, an exec from
    /// another thread than the leader). The process's stop is not its business.
    pub fn handle(&mut self, bpf: &mut Ebpf, event: &AttachEvent) -> Handled {
        let pid = event.header.pid;
        let mut handled = Handled::default();
        let result = match event.what {
            attach_event::LIBRARY_OPENED => self.opened(bpf, event, &mut handled),
            attach_event::FORKED => self.forked(bpf, pid, event.parent, &mut handled),
            attach_event::NEW_LEADER => {
                self.attacher.forget_process(pid);
                Ok(())
            }
            _ => Ok(()),
        };
        handled.error = result.err();
        handled
    }

    fn opened(&mut self, bpf: &mut Ebpf, event: &AttachEvent, handled: &mut Handled) -> Result<()> {
        let pid = event.header.pid;
        let fd_path = format!("/proc/{pid}/fd/{}", event.fd);
        handled.library = fs::read_link(&fd_path).ok();
        let file = match File::open(&fd_path) {
            Ok(file) => file,
            // Gone already (the process was killed): nothing to attach.
            Err(_) => return Ok(()),
        };
        let metadata = file.metadata()?;
        let id = match self.plans.of_file(metadata.dev(), metadata.ino()) {
            Some(plan) => plan.id,
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
                            None => return Ok(()),
                        }
                    }
                };
                let library = Library::read(set, &file, &path)?;
                self.add(
                    bpf,
                    FoundLibrary {
                        set,
                        library,
                        file,
                        found: Found::Opened,
                        pid: Some(pid),
                        ts_ns: Some(event.header.ts_ns),
                    },
                    &mut handled.attached,
                )?
            }
        };
        handled.attached.push(Attached::Loaded);
        if helpers::cookies_missing() {
            // The process is stopped at the open: its mmaps of this fd come after.
            maps::identity::add_library_fd(bpf, pid, event.fd, id)?;
        }
        self.link(id, pid, &mut handled.attached)?;
        Ok(())
    }

    /// A child of a process with per-process probes: the same probes, before it runs.
    fn forked(
        &mut self,
        bpf: &mut Ebpf,
        child: u32,
        parent: u32,
        handled: &mut Handled,
    ) -> Result<()> {
        let libraries = self.attacher.linked_libraries(parent);
        if libraries.is_empty() {
            // The parent is gone (and forgotten): what the child maps says it.
            return self.add_mapped(bpf, child, true, &mut handled.attached);
        }
        for id in libraries {
            handled.library = self.plans.get(id).map(|plan| plan.library.path.clone());
            self.link(id, child, &mut handled.attached)?;
        }
        Ok(())
    }

    /// Plans the probe-set libraries process `pid` maps (a file already planned is not
    /// read again) and, when `link`, gives the process its probes on each.
    pub fn add_mapped(
        &mut self,
        bpf: &mut Ebpf,
        pid: u32,
        link: bool,
        attached: &mut Vec<Attached>,
    ) -> Result<()> {
        let mut ids = Vec::new();
        let mut found = Vec::new();
        for mapped in mapped_files(pid) {
            match self.plans.of_file(mapped.device, mapped.inode) {
                Some(plan) => ids.push(plan.id),
                None => found.push(FoundLibrary {
                    set: mapped.set,
                    library: Library::read(mapped.set, &mapped.file, &mapped.path)?,
                    file: mapped.file,
                    found: Found::Mapped,
                    pid: Some(pid),
                    ts_ns: None,
                }),
            }
        }
        // Without attach cookies the process's mappings are recorded before the new files'
        // probes attach: its calls from then on are known (recorded after, a busy
        // process's calls in between were lost as `unidentified_probe`).
        ids.extend(self.add_all(bpf, found, &[pid], attached)?);
        for id in ids {
            attached.push(Attached::Loaded);
            if link {
                self.link(id, pid, attached)?;
            }
        }
        Ok(())
    }

    /// Process `pid`'s mappings of planned library files, from its `/proc/PID/maps`, each
    /// file known by its `/proc/PID/map_files` entry (as [`mapped_files`] knows it).
    fn planned_mappings(&self, pid: u32) -> Vec<LibraryMapping> {
        let Ok(maps) = fs::read_to_string(format!("/proc/{pid}/maps")) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for line in maps.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [range, _perms, offset, ..] = fields[..] else {
                continue;
            };
            let Some((start, end)) = range.split_once('-') else {
                continue;
            };
            let parse = |hex: &str| u64::from_str_radix(hex, 16).ok();
            let (Some(start), Some(end), Some(file_offset)) =
                (parse(start), parse(end), parse(offset))
            else {
                continue;
            };
            let Ok(metadata) = fs::metadata(format!("/proc/{pid}/map_files/{range}")) else {
                continue;
            };
            if let Some(plan) = self.plans.of_file(metadata.dev(), metadata.ino()) {
                found.push(LibraryMapping {
                    start,
                    end,
                    file_offset,
                    library: plan.id,
                    _pad: 0,
                });
            }
        }
        found
    }

    /// Whether process `pid` maps a file planned here.
    pub fn maps_planned_file(&self, pid: u32) -> bool {
        mapped_files(pid)
            .iter()
            .any(|mapped| self.plans.of_file(mapped.device, mapped.inode).is_some())
    }

    /// A traced process exited: its links go.
    pub fn process_exited(&mut self, pid: u32) {
        self.attacher.forget_process(pid);
    }

    /// Tracing ends: the links and the object go to a thread of their own that detaches
    /// everything (the kernel takes a grace period per detach) while the caller drains
    /// the ring. Joining the thread means all is detached; nothing is attached from here on.
    pub fn detach_on_thread(&mut self, mut bpf: Ebpf) -> JoinHandle<()> {
        let links = self.attacher.take_links(&mut bpf);
        std::thread::spawn(move || {
            std::thread::scope(|scope| {
                scope.spawn(move || links.close());
                attach::unload_programs(&mut bpf);
            });
            drop(bpf);
        })
    }

    /// Detaches everything: closes the links, then unloads the programs.
    pub fn detach_all(&mut self, bpf: &mut Ebpf) {
        self.attacher.detach_all(bpf);
    }
}
