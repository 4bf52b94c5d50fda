//! Each traced process's Python interpreter, found where the process has it and given to
//! the probes (`PYPROC`) before the process makes a call: looked at when it is stopped for
//! a library it opened or for its fork, or when tracing starts (`-p`, `--all`). What was
//! found is said once per process (an `interpreter` line) and, for an interpreter that
//! cannot be read, once on stderr.

use std::{
    collections::{HashMap, HashSet},
    fs::{self, File},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result};
use aya::maps::{HashMap as BpfHashMap, MapData};
use tracer_common::stacks::{PyProcess, py_flags};

use super::{
    check::{self, Checked, Types},
    debug_offsets::DebugOffsets,
    dwarf::{self, Dwarf},
    elf::{self, InterpreterFile, NotInterpreter},
    layout::{self, SHIFT_ENV, Shift},
};
use crate::{
    probes::uprobe_multi::{self, MultiLink},
    schema::{CodeFreeProbeCounts, InterpreterLine, LayoutChecked},
};

/// What was found of a process's interpreter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Readable: its calls get stacks. The minor version, for its line tables.
    Readable { minor: u32 },
    /// No interpreter.
    NotPython,
    /// One cudatrace cannot read.
    Unsupported,
}

/// An interpreter file read once, by device and inode.
#[derive(Debug)]
struct ReadFile {
    path: PathBuf,
    result: Result<InterpreterFile, NotInterpreter>,
    /// Its DWARF, read once too.
    dwarf: Dwarf,
}

/// The probes' `KNOWN_CODES`: the code objects of known stacks, by (process image, address).
pub type KnownCodes = BpfHashMap<MapData, [u64; 2], u32>;

/// The processes' interpreters.
pub struct Interpreters {
    map: BpfHashMap<MapData, u32, PyProcess>,
    files: HashMap<(u64, u64), ReadFile>,
    /// By process, since its last exec.
    processes: HashMap<u32, Found>,
    next_generation: u64,
    /// stderr lines said already.
    said: HashSet<String>,
    quiet: bool,
    /// This process's pid namespace inode: a process in it has the tids the probes see.
    own_pid_ns: Option<u64>,
    /// The tests' wrong layout ([`SHIFT_ENV`]).
    shift: Option<Shift>,
    /// Processes whose check found no frame to read (an interpreter not initialised yet,
    /// idle threads): checked again at their first stack.
    unchecked: HashMap<u32, Unchecked>,
    /// `py_code_freed`, when the kernel can link it to one process (uprobe_multi), and the
    /// map of the code objects it counts (`KNOWN_CODES`).
    code_freed: Option<(OwnedFd, KnownCodes)>,
    /// The process image each process got with the count on: its `KNOWN_CODES` entries
    /// are removed when it execs or exits.
    counted: HashMap<u32, u64>,
    /// Its link per process, at `PyCode_Type`'s deallocator, until the process execs or
    /// exits.
    free_probes: HashMap<u32, MultiLink>,
    /// Processes to link it for at their first stack.
    free_pending: HashSet<u32>,
    /// Processes `py_code_freed` was linked in, or could not be (the footer's counts).
    free_counts: CodeFreeProbeCounts,
}

/// A process's layout to check again.
struct Unchecked {
    py: PyProcess,
    types: Types,
    path: PathBuf,
    version: String,
}

impl Interpreters {
    pub fn new(
        map: BpfHashMap<MapData, u32, PyProcess>,
        code_freed: Option<(OwnedFd, KnownCodes)>,
        quiet: bool,
    ) -> Self {
        Interpreters {
            code_freed,
            counted: HashMap::new(),
            free_probes: HashMap::new(),
            free_pending: HashSet::new(),
            free_counts: CodeFreeProbeCounts::default(),
            map,
            files: HashMap::new(),
            processes: HashMap::new(),
            next_generation: 1,
            said: HashSet::new(),
            quiet,
            own_pid_ns: fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino()),
            shift: std::env::var(SHIFT_ENV).ok().and_then(|text| {
                Shift::parse(&text)
                    .inspect_err(|e| eprintln!("cudatrace: --stacks: {e}: ignored"))
                    .ok()
            }),
            unchecked: HashMap::new(),
        }
    }

    /// The layout the probes have for `pid`'s interpreter.
    pub fn layout(&self, pid: u32) -> Option<PyProcess> {
        self.map.get(&pid, 0).ok()
    }

    /// A stack arrived from `pid`: where its check found no frame to read, it is checked
    /// again now, and a layout that fails is refused (the probes forget it; the stacks its
    /// calls sent are dropped, counted `unsupported_python`). Its new `interpreter` line.
    pub fn recheck(&mut self, pid: u32, ts_ns: u64) -> Option<InterpreterLine> {
        let unchecked = self.unchecked.remove(&pid)?;
        // A process gone by now cannot show its layout right: refused too, never trusted.
        let why = match File::open(format!("/proc/{pid}/mem"))
            .map_err(|e| format!("its layout could not be checked: its memory is unreadable ({e})"))
            .and_then(|memory| check_with_tries(&memory, &unchecked.py, &unchecked.types))
        {
            Ok(checked) => {
                if checked.frames == 0 {
                    self.unchecked.insert(pid, unchecked);
                }
                return None;
            }
            Err(why) => why,
        };
        let _ = self.map.remove(&pid);
        self.free_probes.remove(&pid);
        self.free_pending.remove(&pid);
        self.forget_known_codes(pid);
        Some(self.refuse(
            pid,
            ts_ns,
            Some(unchecked.path),
            Some(unchecked.version),
            &why,
        ))
    }

    /// What was found of `pid`'s interpreter, if it was looked at since its last exec.
    pub fn found(&self, pid: u32) -> Option<&Found> {
        self.processes.get(&pid)
    }

    /// Looks at `pid`'s interpreter unless it was looked at since its last exec, and gives
    /// it to the probes; returns its `interpreter` line the first time.
    pub fn look_at(&mut self, pid: u32, ts_ns: u64) -> Option<InterpreterLine> {
        if self.processes.contains_key(&pid) {
            return None;
        }
        if let Some(shift) = &self.shift {
            let line = format!("{SHIFT_ENV} moves {shift} in the table (a test's wrong layout)");
            self.say(&line, &line);
        }
        let context = Made {
            own_pid_ns: self.own_pid_ns,
            shift: self.shift.as_ref(),
        };
        let line = match evaluate(pid, &mut self.files, context) {
            Ok(Evaluated::Readable {
                path,
                version,
                py,
                minor,
                types,
                source,
                table_differs,
                dwarf_unused,
                checked,
            }) => match self.count_and_give(pid, *py) {
                Ok(()) => {
                    self.processes.insert(pid, Found::Readable { minor });
                    if checked.frames == 0 {
                        self.unchecked.insert(
                            pid,
                            Unchecked {
                                py: *py,
                                types,
                                path: path.clone(),
                                version: version.clone(),
                            },
                        );
                    }
                    let which = format!("Python {version} ({})", path.display());
                    if let Some(unused) = &dwarf_unused {
                        self.say(
                            &format!(
                                "pid {pid}: {which}: its DWARF is not used ({unused}): offsets \
                                 from {}",
                                match source {
                                    Source::DebugOffsets => "its _Py_DebugOffsets and the table",
                                    _ => "the table",
                                }
                            ),
                            &format!("{which}: DWARF unused"),
                        );
                    }
                    if !table_differs.is_empty() {
                        let theirs = match &source {
                            Source::Dwarf(file) => {
                                format!("its DWARF ({}) differs", file.display())
                            }
                            _ => "its _Py_DebugOffsets differ".into(),
                        };
                        self.say(
                            &format!(
                                "pid {pid}: {which}: {theirs} from cudatrace's table for \
                                 3.{minor} ({}): the file's are used",
                                table_differs.join("; ")
                            ),
                            &format!("{which}: differs"),
                        );
                    }
                    InterpreterLine {
                        pid,
                        ts_ns,
                        path: Some(path.display().to_string()),
                        python: Some(version),
                        stacks: true,
                        offsets: Some(source.name().into()),
                        offsets_file: match &source {
                            Source::Dwarf(file) => Some(file.display().to_string()),
                            _ => None,
                        },
                        table_differs,
                        dwarf_unused,
                        checked: Some(LayoutChecked {
                            thread_states: checked.thread_states,
                            frames: checked.frames,
                            code_objects: checked.code_objects,
                        }),
                        ..InterpreterLine::default()
                    }
                }
                Err(error) => {
                    self.refuse(pid, ts_ns, Some(path), Some(version), &format!("{error:#}"))
                }
            },
            Ok(Evaluated::NotPython { exe }) => {
                self.processes.insert(pid, Found::NotPython);
                let reason = format!(
                    "no Python interpreter: neither {} nor a libpython3.X.so it maps has _PyRuntime",
                    exe.display()
                );
                self.say(
                    &format!("pid {pid}: {reason}: its calls have no Python stacks"),
                    &reason,
                );
                InterpreterLine {
                    pid,
                    ts_ns,
                    stacks: false,
                    reason: Some(reason),
                    ..InterpreterLine::default()
                }
            }
            Err(Refused {
                path,
                version,
                reason,
            }) => self.refuse(pid, ts_ns, path, version, &reason),
        };
        Some(line)
    }

    fn refuse(
        &mut self,
        pid: u32,
        ts_ns: u64,
        path: Option<PathBuf>,
        version: Option<String>,
        reason: &str,
    ) -> InterpreterLine {
        self.processes.insert(pid, Found::Unsupported);
        let which = match (&path, &version) {
            (Some(path), Some(version)) => format!("Python {version} ({})", path.display()),
            (Some(path), None) => format!("the Python of {}", path.display()),
            _ => "its Python".into(),
        };
        self.say(
            &format!(
                "pid {pid}: {which} cannot be read: {reason}: its calls have no Python stacks"
            ),
            &format!("{which}: {reason}"),
        );
        InterpreterLine {
            pid,
            ts_ns,
            path: path.map(|p| p.display().to_string()),
            python: version,
            stacks: false,
            reason: Some(reason.to_owned()),
            ..InterpreterLine::default()
        }
    }

    /// Prints `line` once per distinct `key` (the same interpreter in many processes is
    /// said once).
    fn say(&mut self, line: &str, key: &str) {
        if self.said.insert(key.to_owned()) && !self.quiet {
            eprintln!("cudatrace: --stacks: {line}");
        }
    }

    /// A process exec'd or exited: the probes forgot its interpreter; so does this.
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
        self.unchecked.remove(&pid);
        self.free_probes.remove(&pid);
        self.free_pending.remove(&pid);
        self.forget_known_codes(pid);
    }

    /// Removes the `KNOWN_CODES` entries of `pid`'s process image with the count on (the
    /// kernel keeps them until then: a full map leaves later stacks unknown).
    fn forget_known_codes(&mut self, pid: u32) {
        let (Some(generation), Some((_, known))) =
            (self.counted.remove(&pid), &mut self.code_freed)
        else {
            return;
        };
        let keys: Vec<[u64; 2]> = known
            .keys()
            .filter_map(Result::ok)
            .filter(|key| key[0] == generation)
            .collect();
        for key in keys {
            let _ = known.remove(&key);
        }
    }

    /// Where the interpreter counts its own code objects freed only from 3.14 on, cudatrace
    /// counts them (`py_code_freed`), so that the count stands for the code identities and
    /// a known stack costs one read a frame less. Not from the start: an interpreter frees
    /// a code object per module imported (64,225 traps in a GPT-2 run, most of them before
    /// its first CUDA call), so the probe is linked at the process's first stack
    /// ([`Self::first_stack`]); until then identities are read per frame.
    fn count_frees(&mut self, pid: u32, mut py: PyProcess) -> PyProcess {
        self.free_probes.remove(&pid);
        self.free_pending.remove(&pid);
        self.forget_known_codes(pid);
        py.flags &= !py_flags::FREE_PENDING;
        if py.flags & py_flags::IDENT_PER_FRAME != 0
            && self.code_freed.is_some()
            && std::env::var_os(IDENT_PER_FRAME_ENV).is_none()
        {
            self.free_pending.insert(pid);
            py.flags |= py_flags::FREE_PENDING;
        }
        py
    }

    /// Processes `py_code_freed` was linked in, and those where it could not be.
    pub fn free_counts(&self) -> CodeFreeProbeCounts {
        self.free_counts.clone()
    }

    /// `pid` sent its first stack: `py_code_freed` is linked to `PyCode_Type`'s deallocator
    /// in its memory alone, and the probes get its layout again with the count on (a new
    /// process image: what was cached under identities read per frame is not reused).
    /// Without the link (no uprobe_multi, the deallocator not found) the walk goes on
    /// reading each frame's identity, as exact and slower.
    pub fn first_stack(&mut self, pid: u32) {
        if !self.free_pending.remove(&pid) {
            return;
        }
        // No layout: the process exited (or exec'd) before its first stack was read here.
        let (Some((program, _)), Ok(mut py)) = (&self.code_freed, self.map.get(&pid, 0)) else {
            return;
        };
        // Linked or not, the probes stop waking the loader at each stack record.
        py.flags &= !py_flags::FREE_PENDING;
        let unlinked = py;
        let linked = free_probe(program.as_fd(), pid, &py).and_then(|link| {
            py.flags |= py_flags::FREE_PROBE;
            py.code_frees = 0;
            py.generation = self.next_generation;
            self.next_generation += 1;
            self.map
                .insert(pid, py, 0)
                .context("giving the layout to the probes again (PYPROC)")?;
            Ok(link)
        });
        match linked {
            Ok(link) => {
                self.free_probes.insert(pid, link);
                self.counted.insert(pid, py.generation);
                self.free_counts.linked += 1;
            }
            Err(error) => {
                self.free_counts.not_linked += 1;
                // The same layout and process image: what the walk cached stays valid.
                let _ = self.map.insert(pid, unlinked, 0);
                let reason = format!("{error:#}");
                self.say(
                    &format!(
                        "pid {pid}: code objects freed cannot be counted ({reason}): each frame's \
                         identity is read per call"
                    ),
                    "free probe",
                );
            }
        }
    }

    /// [`Self::count_frees`], then [`Self::give`].
    fn count_and_give(&mut self, pid: u32, py: PyProcess) -> Result<()> {
        let py = self.count_frees(pid, py);
        self.give(pid, py)
    }

    /// Writes `py` for `pid`, keeping the process image the kernel gave a fork child when
    /// the layout is the same (its caches stay valid).
    fn give(&mut self, pid: u32, mut py: PyProcess) -> Result<()> {
        if let Ok(current) = self.map.get(&pid, 0) {
            let same = PyProcess {
                generation: current.generation,
                code_frees: current.code_frees,
                ..py
            };
            if same == current {
                return Ok(());
            }
        }
        py.generation = self.next_generation;
        self.next_generation += 1;
        self.map
            .insert(pid, py, 0)
            .context("giving the interpreter's layout to the probes (PYPROC)")
    }
}

/// What `pid`'s interpreter is, its file read once (`files`, by device and inode).
fn evaluate(
    pid: u32,
    files: &mut HashMap<(u64, u64), ReadFile>,
    context: Made,
) -> Result<Evaluated, Refused> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| Refused {
        path: None,
        version: None,
        reason: format!("its memory map is unreadable ({e})"),
    })?;
    let mappings = parse_maps(&maps);
    let exe_path = fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    // The executable first (a static python), then a libpython it maps.
    let mut candidates: Vec<(File, PathBuf)> = Vec::new();
    if let Ok(file) = File::open(format!("/proc/{pid}/exe")) {
        candidates.push((file, exe_path.clone()));
    }
    for mapping in &mappings {
        let name = mapping
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        if name.starts_with("libpython3")
            && let Ok(file) = File::open(mapping.map_file(pid))
                .or_else(|_| File::open(format!("/proc/{pid}/root{}", mapping.path.display())))
        {
            candidates.push((file, mapping.path.clone()));
        }
    }
    for (file, path) in candidates {
        let Ok(metadata) = file.metadata() else {
            continue;
        };
        let key = (metadata.dev(), metadata.ino());
        let read = files.entry(key).or_insert_with(|| {
            let bytes = fs::read(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&file)
            ));
            let (result, dwarf) = match bytes {
                Ok(bytes) => {
                    let result = elf::read(&bytes, &path);
                    // A debug file where the process's own root has it (a chroot's, a
                    // container's `-dbg` package), or cudatrace's.
                    let own_root = fs::read_link(format!("/proc/{pid}/root"))
                        .is_ok_and(|root| root == Path::new("/"));
                    let roots: Vec<PathBuf> = if own_root {
                        vec!["/".into()]
                    } else {
                        vec![format!("/proc/{pid}/root").into(), "/".into()]
                    };
                    let dwarf = result
                        .as_ref()
                        .ok()
                        .and_then(|interpreter| {
                            interpreter
                                .version_hex
                                .map(|hex| (hex >> 16) & 0xff)
                                .or_else(|| elf::minor_from_name(&path))
                        })
                        .filter(|minor| layout::MINORS.contains(minor))
                        .map_or(Dwarf::Absent, |minor| {
                            dwarf::find(&bytes, &path, &roots, minor)
                        });
                    (result, dwarf)
                }
                Err(e) => (Err(NotInterpreter::NotElf(e.to_string())), Dwarf::Absent),
            };
            ReadFile {
                path: path.clone(),
                result,
                dwarf,
            }
        });
        let interpreter = match &read.result {
            Ok(interpreter) => interpreter,
            Err(_) => continue,
        };
        let path = read.path.clone();
        let mapped = mappings
            .iter()
            .filter(|m| (m.device, m.inode) == key || m.path == path)
            .collect::<Vec<_>>();
        return layout_of(pid, interpreter, &read.dwarf, &path, &mapped, context);
    }
    Ok(Evaluated::NotPython { exe: exe_path })
}

enum Evaluated {
    Readable {
        path: PathBuf,
        version: String,
        minor: u32,
        py: Box<PyProcess>,
        types: Types,
        source: Source,
        table_differs: Vec<String>,
        /// Why DWARF found for it was not used: `FILE: WHY`.
        dwarf_unused: Option<String>,
        checked: Checked,
    },
    NotPython {
        exe: PathBuf,
    },
}

/// Where a layout's offsets came from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Source {
    Table,
    /// The file's `_Py_DebugOffsets` (3.13+), the table for the fields they lack.
    DebugOffsets,
    /// The DWARF of the file named (the interpreter file or its debug file).
    Dwarf(PathBuf),
}

impl Source {
    /// Its name in the `interpreter` line's `offsets`.
    fn name(&self) -> &'static str {
        match self {
            Source::Table => "table",
            Source::DebugOffsets => "debug_offsets",
            Source::Dwarf(_) => "dwarf",
        }
    }
}

struct Refused {
    path: Option<PathBuf>,
    version: Option<String>,
    reason: String,
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, PartialEq)]
struct Mapping {
    range: String,
    start: u64,
    end: u64,
    offset: u64,
    device: u64,
    inode: u64,
    path: PathBuf,
}

impl Mapping {
    /// The mapped file as `/proc/PID/map_files` names it: its range without leading zeros
    /// (`/proc/PID/maps` pads addresses to 8 digits, as a non-PIE executable's show).
    fn map_file(&self, pid: u32) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            self.start, self.end
        ))
    }
}

fn parse_maps(maps: &str) -> Vec<Mapping> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?.to_owned();
            let _perms = fields.next()?;
            let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
            let (major, minor) = fields.next()?.split_once(':')?;
            let device = libc::makedev(
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
            );
            let inode = fields.next()?.parse().ok()?;
            let path: String = fields.collect::<Vec<_>>().join(" ");
            if !path.starts_with('/') {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            Some(Mapping {
                range,
                start,
                end,
                offset,
                device,
                inode,
                path: PathBuf::from(path),
            })
        })
        .collect()
}

/// `py_code_freed` linked at `PyCode_Type.tp_dealloc` of `pid` (read from its memory:
/// the function every code object is freed through).
fn free_probe(program: std::os::fd::BorrowedFd<'_>, pid: u32, py: &PyProcess) -> Result<MultiLink> {
    let memory = File::open(format!("/proc/{pid}/mem")).context("opening its memory")?;
    let mut bytes = [0u8; 8];
    // PyTypeObject's `tp_dealloc`: after the header, `ob_size`, `tp_name`, `tp_basicsize`
    // and `tp_itemsize`.
    std::os::unix::fs::FileExt::read_exact_at(&memory, &mut bytes, py.code_type + TP_DEALLOC)
        .context("reading PyCode_Type.tp_dealloc")?;
    let dealloc = u64::from_le_bytes(bytes);
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).context("reading its maps")?;
    let mapping = parse_maps(&maps)
        .into_iter()
        .find(|m| m.start <= dealloc && dealloc < m.end)
        .with_context(|| format!("PyCode_Type.tp_dealloc {dealloc:#x} is in no file it maps"))?;
    let offset = dealloc - mapping.start + mapping.offset;
    // The file the process maps, whatever its mount namespace; the kernel is given it as
    // this process's descriptor.
    let file = File::open(mapping.map_file(pid))
        .with_context(|| format!("opening {} as it maps it", mapping.path.display()))?;
    let path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&file)
    ));
    uprobe_multi::link(
        program,
        "py_code_freed",
        &path,
        &mapping.path,
        &[offset],
        &[],
        false,
        pid,
    )
}

/// Set (hidden, for `cargo xtask bench --only stacks`): no count of code objects freed,
/// identities read per frame, so that both ways are measured side by side.
pub const IDENT_PER_FRAME_ENV: &str = "CUDATRACE_STACKS_IDENT_PER_FRAME";

/// `tp_dealloc`'s offset in `PyTypeObject` (64-bit, 3.10 to 3.14).
const TP_DEALLOC: u64 = 48;

/// Tries of the check on the live process before a layout is refused. A busy program's
/// stacks move under the check's reads (it walks every thread's frames): a PyTorch training
/// loop on the H200 failed 3 tries in a row in 2 of 3 attaches (run p1, 2026-11-27), while
/// a wrong layout fails every try. A try takes about a millisecond.
const CHECK_TRIES: usize = 16;

/// What a layout is made with beyond the file.
#[derive(Clone, Copy)]
struct Made<'a> {
    /// This process's pid namespace inode.
    own_pid_ns: Option<u64>,
    shift: Option<&'a Shift>,
}

/// The layout of `interpreter` (the file `path`, mapped by `pid` as `mapped`), checked on
/// the live process.
fn layout_of(
    pid: u32,
    interpreter: &InterpreterFile,
    dwarf: &Dwarf,
    path: &Path,
    mapped: &[&Mapping],
    context: Made,
) -> Result<Evaluated, Refused> {
    let refuse = |version: Option<String>, reason: String| Refused {
        path: Some(path.to_owned()),
        version,
        reason,
    };
    let (minor, version) = match interpreter.version_hex {
        Some(hex) => {
            if hex >> 24 != 3 {
                return Err(refuse(Some(elf::version_text(hex)), "not CPython 3".into()));
            }
            ((hex >> 16) & 0xff, elf::version_text(hex))
        }
        None => match elf::minor_from_name(path) {
            Some(minor) => (minor, format!("3.{minor}")),
            None => {
                return Err(refuse(
                    None,
                    "its version is unknown (no Py_Version, and the file name names none)".into(),
                ));
            }
        },
    };
    let refuse = |reason: String| Refused {
        path: Some(path.to_owned()),
        version: Some(version.clone()),
        reason,
    };
    let Some(mut py) = layout::table(minor) else {
        return Err(refuse(format!(
            "Python 3.{minor} is not supported (3.10 to 3.14 are)"
        )));
    };
    if interpreter.version_hex.is_none() && minor != 10 {
        return Err(refuse("no Py_Version, which CPython 3.11+ has".into()));
    }
    if let Some(shift) = context.shift {
        shift.apply(&mut py);
    }
    let table = py;
    if interpreter.debug_build {
        return Err(refuse(
            "a debug build (Py_REF_DEBUG): another object layout".into(),
        ));
    }
    // DWARF first (it gives every field), then `_Py_DebugOffsets`, which must agree with it
    // where both give a field, then the table (docs/python-stacks.md says why).
    let mut source = Source::Table;
    let mut dwarf_unused = None;
    let dwarf_offsets = match dwarf {
        Dwarf::Read(offsets) => {
            py = offsets.apply(py);
            source = Source::Dwarf(offsets.file.clone());
            Some(offsets)
        }
        Dwarf::Failed { file, error } => {
            dwarf_unused = Some(format!("{}: {error}", file.display()));
            None
        }
        Dwarf::Absent => None,
    };
    let mut table_differs = Vec::new();
    if minor >= 13 {
        let offsets = DebugOffsets::read(&interpreter.runtime_bytes, minor)
            .map_err(|e| refuse(e.to_string()))?;
        if offsets.free_threaded {
            return Err(refuse(format!(
                "a free-threaded build (3.{minor}t): cudatrace reads the default build only"
            )));
        }
        if Some(offsets.version as u32) != interpreter.version_hex {
            return Err(refuse(format!(
                "its _Py_DebugOffsets say version {:#x}, Py_Version {:#x}",
                offsets.version,
                interpreter.version_hex.unwrap_or(0)
            )));
        }
        if let Some(dwarf_offsets) = dwarf_offsets
            && let Some(error) = dwarf_offsets.disagreement(&offsets, &py)
        {
            dwarf_unused = Some(format!("{}: {error}", dwarf_offsets.file.display()));
            (py, source) = (table, Source::Table);
        }
        if source == Source::Table {
            table_differs = offsets.differences(&py);
            py = offsets.apply(py).ok_or_else(|| {
                refuse(
                    "its _Py_DebugOffsets give a layout the probes cannot read in one piece".into(),
                )
            })?;
            source = Source::DebugOffsets;
        }
    }
    layout::drop_optional_misfits(&mut py);
    if let (Source::Dwarf(file), Some(dwarf_offsets)) = (&source, dwarf_offsets) {
        table_differs = dwarf_offsets.differences(&table);
        if !layout::fits(&py) {
            return Err(refuse(format!(
                "its DWARF ({}) gives a layout the probes cannot read in one piece",
                file.display()
            )));
        }
    }
    if !layout::fits(&py) {
        return Err(refuse(
            "its layout cannot be read by the probes in one piece".into(),
        ));
    }
    let Some(code_type) = interpreter.code_type else {
        return Err(refuse("it does not export PyCode_Type".into()));
    };
    let bias = if interpreter.relocatable {
        let page = |x: u64| x & !0xfff;
        let (first_address, first_offset) = interpreter.first_load;
        mapped
            .iter()
            .find(|m| m.offset == page(first_offset))
            .map(|m| m.start.wrapping_sub(page(first_address)))
            .ok_or_else(|| refuse("it is not mapped where expected".into()))?
    } else {
        0
    };
    py.runtime = interpreter.runtime.wrapping_add(bias);
    py.code_type = code_type.wrapping_add(bias);
    let pid_ns = fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino());
    if minor >= 11 && pid_ns.is_some() && pid_ns == context.own_pid_ns {
        py.flags |= py_flags::NATIVE_TID;
    }
    let arch = tracer_common::arch::TARGET;
    if !arch.pthread_self_is_thread_pointer && py.flags & py_flags::NATIVE_TID == 0 {
        // See `Arch::pthread_self_is_thread_pointer`.
        return Err(refuse(if minor < 11 {
            format!(
                "on {} a thread's state is told by its native_thread_id, which Python 3.{minor} \
                 does not have (3.11+ does)",
                arch.name
            )
        } else {
            format!(
                "on {} a thread's state is told by its native_thread_id, which is a tid of \
                 another pid namespace here",
                arch.name
            )
        }));
    }
    let types = Types {
        code: py.code_type,
        str: interpreter.str_type.map(|at| at.wrapping_add(bias)),
        bytes: interpreter.bytes_type.map(|at| at.wrapping_add(bias)),
    };
    let memory = File::open(format!("/proc/{pid}/mem"))
        .map_err(|e| refuse(format!("its memory is unreadable ({e})")))?;
    let checked = check_with_tries(&memory, &py, &types).map_err(refuse)?;
    Ok(Evaluated::Readable {
        path: path.to_owned(),
        version,
        minor,
        py: Box::new(py),
        types,
        source,
        table_differs,
        dwarf_unused,
        checked,
    })
}

/// The check on the live process, tried again where it fails: a process looked at while it
/// runs (`-p`, `--all`, a recheck) can move a frame under the reads; a stopped process fails
/// each try the same. The reason, for the `interpreter` line, where every try failed.
fn check_with_tries(memory: &File, py: &PyProcess, types: &Types) -> Result<Checked, String> {
    let mut result = check::check(memory, py, types);
    for _ in 1..CHECK_TRIES {
        if result.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        result = check::check(memory, py, types);
    }
    result.map_err(|why| format!("its layout fails the check on the live process: {why}"))
}

#[cfg(test)]
mod tests {
    use std::{
        io::{BufRead, BufReader},
        process::{Child, Command, Stdio},
    };

    use super::*;

    /// A Python waiting in `wait()` called from `<module>` (two frames, two code objects,
    /// one thread state) until its stdin closes.
    struct Waiting(Child);

    impl Waiting {
        fn start(command: &[&str]) -> Waiting {
            let script = "import sys\n\
                          def wait():\n    print('ready', flush=True)\n    sys.stdin.readline()\n\
                          wait()\n";
            let mut child = Command::new(command[0])
                .args(&command[1..])
                .args(["-c", script])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            BufReader::new(child.stdout.as_mut().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert_eq!(line, "ready\n", "{command:?}");
            Waiting(child)
        }
    }

    impl Drop for Waiting {
        fn drop(&mut self) {
            drop(self.0.stdin.take());
            let _ = self.0.wait();
        }
    }

    /// Whether `path` is there; in CI (`CI=true`) it must be.
    fn present(path: &Path) -> bool {
        let there = path.exists();
        assert!(
            there || std::env::var("CI").as_deref() != Ok("true"),
            "CI: {} is missing",
            path.display()
        );
        there
    }

    /// The interpreters this machine has (pyenv's, Debian's, the `--stacks` root tests'
    /// Debian root with trixie's 3.13 and sid's 3.14, where this runs as root), with their
    /// minor version and frames of `wait()` (3.14's `print` adds none).
    fn interpreters() -> Vec<(Vec<String>, u32)> {
        let mut found = Vec::new();
        for (version, minor) in [
            ("3.10.13", 10),
            ("3.11.7", 11),
            ("3.12.1", 12),
            ("3.13.0", 13),
        ] {
            let binary = format!("/root/.pyenv/versions/{version}/bin/python3.{minor}");
            if present(Path::new(&binary)) {
                found.push((vec![binary], minor));
            }
        }
        if present(Path::new("/usr/bin/python3.11")) {
            found.push((vec!["/usr/bin/python3.11".into()], 11));
        }
        let trixie = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/pythons/trixie");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            for (python, minor) in [("/usr/bin/python3", 13), ("/usr/bin/python3.14", 14)] {
                if present(&Path::new(trixie).join(&python[1..])) {
                    found.push((vec!["chroot".into(), trixie.into(), python.into()], minor));
                }
            }
        }
        found
    }

    fn evaluated(pid: u32, shift: Option<&str>) -> Result<Evaluated, Refused> {
        let shift = shift.map(|text| Shift::parse(text).unwrap());
        let own_pid_ns = fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino());
        let context = Made {
            own_pid_ns,
            shift: shift.as_ref(),
        };
        evaluate(pid, &mut HashMap::new(), context)
    }

    /// Fields a move of 8 bytes either way leaves unnoticed by the check, by minor version,
    /// and why: each is harmless (the same value, a start of a read that still holds its
    /// fields) or reads a value the check can only bound.
    const GAPS: &[(&str, &[u32], &str)] = &[
        (
            "interp_read",
            &[10, 11, 12, 13, 14],
            "a read's start: the read still holds its fields",
        ),
        (
            "tstate_read",
            &[10, 11, 12, 13, 14],
            "a read's start: the read still holds its fields",
        ),
        (
            "frame_read",
            &[11, 12, 13, 14],
            "a read's start: the read still holds its fields",
        ),
        (
            "runtime_interpreters",
            &[10, 11, 12],
            "`interpreters.main`: the same interpreter",
        ),
        (
            "interp_next",
            &[10, 11, 12],
            "a zero word: no other interpreter, as it should read",
        ),
        ("interp_thread_epoch", &[11], "another count"),
        (
            "tstate_frame",
            &[11, 12],
            "a zero word: a thread without frames (allowed: idle)",
        ),
        (
            "cframe_frame",
            &[11],
            "a zero word: a thread without frames (allowed: idle)",
        ),
        (
            "frame_previous",
            &[11],
            "`frame_obj`, mostly 0: the walk ends early",
        ),
        ("tstate_native_id", &[11, 12], "another tid-sized value"),
        (
            "tstate_datastack",
            &[12],
            "the data stack's chunk: a wrong one bounds a window wrongly, costing reads, \
             never frames (the window holds the process's memory wherever it starts)",
        ),
        (
            "tstate_datastack_top",
            &[12],
            "the data stack's top: a wrong one bounds a window wrongly, costing reads, \
             never frames",
        ),
        ("frame_owner", &[12], "another byte in the owners' range"),
        (
            "frame_instr",
            &[10],
            "`f_lasti`'s neighbour, another plausible index",
        ),
        (
            "code_adaptive",
            &[10],
            "3.10 has no adaptive bytecode: unused",
        ),
        (
            "code_firsttraceable",
            &[11, 12, 13, 14],
            "an int the check can only bound",
        ),
        (
            "code_ident",
            &[10, 11, 12, 13, 14],
            "where the identity is read: any word identifies",
        ),
        (
            "code_epoch_size",
            &[10, 11, 12, 13, 14],
            "a size, not an offset",
        ),
        (
            "owner_skip_from",
            &[10, 11, 12, 13, 14],
            "an owner, not an offset",
        ),
    ];

    /// Every field the table gives, moved 8 bytes either way, is refused, or comes out
    /// right (`_Py_DebugOffsets` give or derive it; a field the version lacks), but for the
    /// gaps said in [`GAPS`].
    #[test]
    fn every_field_moved_is_refused_or_set_right_but_the_known_gaps() {
        for (command, minor) in interpreters() {
            let command: Vec<&str> = command.iter().map(String::as_str).collect();
            let python = Waiting::start(&command);
            let pid = python.0.id();
            let Ok(Evaluated::Readable { py: right, .. }) = evaluated(pid, None) else {
                panic!("{command:?}: not readable");
            };
            for field in layout::FIELDS {
                for by in ["+8", "-8"] {
                    let shift = format!("{}{by}", field.name);
                    let Ok(Evaluated::Readable { py, .. }) = evaluated(pid, Some(&shift)) else {
                        continue;
                    };
                    let gap = GAPS
                        .iter()
                        .any(|(name, minors, _)| *name == field.name && minors.contains(&minor));
                    assert!(
                        py == right || gap,
                        "{command:?}: {shift} passes the check and is not a known gap"
                    );
                }
            }
        }
    }

    /// pyenv's libpython for a pyenv `python3.X` (`-g` builds: it has DWARF), none for
    /// another interpreter (Debian's are stripped).
    fn dwarf_file(command: &[&str]) -> Option<PathBuf> {
        let version = command[0].strip_prefix("/root/.pyenv/versions/")?;
        let (version, binary) = version.split_once("/bin/")?;
        Some(PathBuf::from(format!(
            "/root/.pyenv/versions/{version}/lib/lib{binary}.so.1.0"
        )))
    }

    /// The right layout passes the check on every interpreter here, having read exactly
    /// what the process has; one field moved in the table is refused, naming the field,
    /// unless the file's DWARF (pyenv's) or its own `_Py_DebugOffsets` (3.13+) give it,
    /// which win and are said to differ.
    #[test]
    fn the_check_passes_the_right_layout_and_refuses_a_moved_field() {
        let interpreters = interpreters();
        assert!(!interpreters.is_empty());
        for (command, minor) in interpreters {
            let command: Vec<&str> = command.iter().map(String::as_str).collect();
            let python = Waiting::start(&command);
            let pid = python.0.id();
            let dwarf = dwarf_file(&command);
            let Ok(Evaluated::Readable {
                checked,
                source,
                table_differs,
                dwarf_unused,
                ..
            }) = evaluated(pid, None)
            else {
                panic!("{command:?}: not readable");
            };
            let expected = Checked {
                thread_states: 1,
                frames: 2,
                code_objects: 2,
            };
            assert_eq!(checked, expected, "{command:?}");
            let expected_source = match &dwarf {
                Some(file) => Source::Dwarf(file.clone()),
                None if minor >= 13 => Source::DebugOffsets,
                None => Source::Table,
            };
            assert_eq!(
                (&source, table_differs.len(), dwarf_unused),
                (&expected_source, 0, None),
                "{command:?}"
            );

            let py = layout::table(minor).unwrap();
            let failing = "its layout fails the check on the live process: ";
            for (shift, why) in [
                (
                    "tstate_interp+8",
                    format!(
                        "a thread state does not point back at its interpreter (tstate_interp \
                         at {})",
                        py.tstate_interp + 8
                    ),
                ),
                (
                    "frame_code+8",
                    format!(
                        "a frame's code object (frame_code at {}, code_ob_type at 8) is not of \
                         type code",
                        py.frame_code + 8
                    ),
                ),
                (
                    "code_qualname+8",
                    format!(
                        "a code object's co_qualname (code_qualname at {}) is not a str as laid \
                         out: its type is not str",
                        py.code_qualname + 8
                    ),
                ),
            ] {
                // No interpreter's `_Py_DebugOffsets` give `tstate_interp`; DWARF does.
                let corrected = dwarf.is_some() || (minor >= 13 && shift != "tstate_interp+8");
                match evaluated(pid, Some(shift)) {
                    Ok(Evaluated::Readable {
                        checked,
                        source,
                        table_differs,
                        ..
                    }) if corrected => {
                        assert_eq!((checked, &source), (expected, &expected_source));
                        let field = &shift[..shift.len() - 2];
                        let value = layout::field(field).unwrap().get(&py);
                        assert_eq!(
                            table_differs,
                            [format!(
                                "{field}: {value} in the file, {} in the table",
                                value + 8
                            )],
                            "{command:?}"
                        );
                    }
                    Err(refused) if !corrected => {
                        assert_eq!(refused.reason, format!("{failing}{why}"), "{command:?}");
                    }
                    _ => panic!("{command:?} {shift}: corrected {corrected}"),
                }
            }
        }
    }

    #[test]
    fn maps_lines_are_read_with_their_files() {
        let maps = "00400000-00420000 r--p 00000000 fd:01 1311 /usr/bin/python3.11\n\
                    7f00-7f10 rw-p 00000000 00:00 0 \n\
                    7f20-7f30 r-xp 00001000 08:02 77 /opt/lib/libpython3.12.so.1.0\n";
        let read = parse_maps(maps);
        assert_eq!(read.len(), 2);
        assert_eq!(
            read[1],
            Mapping {
                range: "7f20-7f30".into(),
                start: 0x7f20,
                end: 0x7f30,
                offset: 0x1000,
                device: libc::makedev(8, 2),
                inode: 77,
                path: "/opt/lib/libpython3.12.so.1.0".into(),
            }
        );
    }
}
