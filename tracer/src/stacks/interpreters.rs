//! Each traced process's Python interpreter, found where the process has it and given to
//! the probes (`PYPROC`) before the process makes a call: looked at when it is stopped for
//! a library it opened or for its fork, or when tracing starts (`-p`, `--all`). What was
//! found is said once per process (an `interpreter` line) and, for an interpreter that
//! cannot be read, once on stderr.

use std::{
    collections::{HashMap, HashSet},
    fs::{self, File},
    os::unix::fs::{FileExt, MetadataExt},
    path::{Path, PathBuf},
};

use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result};
use aya::maps::{HashMap as BpfHashMap, MapData};
use tracer_common::stacks::{PyProcess, py_flags};

use super::{
    debug_offsets::DebugOffsets,
    elf::{self, InterpreterFile, NotInterpreter},
    layout,
};
use crate::{
    probes::uprobe_multi::{self, MultiLink},
    schema::InterpreterLine,
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
}

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
    /// `py_code_freed`, when the kernel can link it to one process (uprobe_multi).
    code_freed: Option<OwnedFd>,
    /// Its link per process, at `PyCode_Type`'s deallocator, until the process execs or
    /// exits.
    free_probes: HashMap<u32, MultiLink>,
}

impl Interpreters {
    pub fn new(
        map: BpfHashMap<MapData, u32, PyProcess>,
        code_freed: Option<OwnedFd>,
        quiet: bool,
    ) -> Self {
        Interpreters {
            code_freed,
            free_probes: HashMap::new(),
            map,
            files: HashMap::new(),
            processes: HashMap::new(),
            next_generation: 1,
            said: HashSet::new(),
            quiet,
            own_pid_ns: fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino()),
        }
    }

    /// The layout the probes have for `pid`'s interpreter.
    pub fn layout(&self, pid: u32) -> Option<PyProcess> {
        self.map.get(&pid, 0).ok()
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
        let line = match self.evaluate(pid) {
            Ok(Evaluated::Readable {
                path,
                version,
                py,
                minor,
            }) => match {
                let py = self.count_frees(pid, *py);
                self.give(pid, py)
            } {
                Ok(()) => {
                    self.processes.insert(pid, Found::Readable { minor });
                    InterpreterLine {
                        pid,
                        ts_ns,
                        path: Some(path.display().to_string()),
                        python: Some(version),
                        stacks: true,
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
        self.free_probes.remove(&pid);
    }

    /// Where the interpreter counts its own code objects freed only from 3.14 on: links
    /// `py_code_freed` to `PyCode_Type`'s deallocator in `pid` (its memory only), so that
    /// the count stands for the code identities and a known stack costs one read a frame
    /// less. Without the link (no uprobe_multi, the deallocator not found) the walk reads
    /// each frame's identity, as exact and slower.
    fn count_frees(&mut self, pid: u32, mut py: PyProcess) -> PyProcess {
        self.free_probes.remove(&pid);
        if py.flags & py_flags::IDENT_PER_FRAME == 0 {
            return py;
        }
        let Some(program) = &self.code_freed else {
            return py;
        };
        if std::env::var_os(IDENT_PER_FRAME_ENV).is_some() {
            return py;
        }
        match free_probe(program.as_fd(), pid, &py) {
            Ok(link) => {
                self.free_probes.insert(pid, link);
                py.flags |= py_flags::FREE_PROBE;
            }
            Err(error) => {
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
        py
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

    fn evaluate(&mut self, pid: u32) -> Result<Evaluated, Refused> {
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
            let read = self.files.entry(key).or_insert_with(|| {
                let result = fs::read(format!(
                    "/proc/self/fd/{}",
                    std::os::fd::AsRawFd::as_raw_fd(&file)
                ))
                .map_err(|e| NotInterpreter::NotElf(e.to_string()))
                .and_then(|bytes| elf::read(&bytes, &path));
                ReadFile {
                    path: path.clone(),
                    result,
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
            return layout_of(pid, interpreter, &path, &mapped, self.own_pid_ns);
        }
        Ok(Evaluated::NotPython { exe: exe_path })
    }
}

enum Evaluated {
    Readable {
        path: PathBuf,
        version: String,
        minor: u32,
        py: Box<PyProcess>,
    },
    NotPython {
        exe: PathBuf,
    },
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

/// The layout of `interpreter` (the file `path`, mapped by `pid` as `mapped`), checked on
/// the live process.
fn layout_of(
    pid: u32,
    interpreter: &InterpreterFile,
    path: &Path,
    mapped: &[&Mapping],
    own_pid_ns: Option<u64>,
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
    if interpreter.debug_build {
        return Err(refuse(
            "a debug build (Py_REF_DEBUG): another object layout".into(),
        ));
    }
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
        py = offsets.apply(py).ok_or_else(|| {
            refuse("its _Py_DebugOffsets give a layout the probes cannot read in one piece".into())
        })?;
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
    if minor >= 11 && pid_ns.is_some() && pid_ns == own_pid_ns {
        py.flags |= py_flags::NATIVE_TID;
    }
    check_live(pid, &py).map_err(refuse)?;
    Ok(Evaluated::Readable {
        path: path.to_owned(),
        version,
        minor,
        py: Box::new(py),
    })
}

/// `py_code_freed` linked at `PyCode_Type.tp_dealloc` of `pid` (read from its memory:
/// the function every code object is freed through).
fn free_probe(program: std::os::fd::BorrowedFd<'_>, pid: u32, py: &PyProcess) -> Result<MultiLink> {
    let memory = File::open(format!("/proc/{pid}/mem")).context("opening its memory")?;
    let mut bytes = [0u8; 8];
    // PyTypeObject's `tp_dealloc`: after the header, `ob_size`, `tp_name`, `tp_basicsize`
    // and `tp_itemsize`.
    memory
        .read_exact_at(&mut bytes, py.code_type + TP_DEALLOC)
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

/// Checks the layout on the live (stopped) process: `PyCode_Type` is the type named
/// `code`, and the interpreter's first thread state points back at its interpreter. An
/// interpreter not initialised yet passes (the probes say so per call).
fn check_live(pid: u32, py: &PyProcess) -> Result<(), String> {
    let memory = File::open(format!("/proc/{pid}/mem"))
        .map_err(|e| format!("its memory is unreadable ({e})"))?;
    let word = |address: u64| -> Result<u64, String> {
        let mut bytes = [0u8; 8];
        memory
            .read_exact_at(&mut bytes, address)
            .map_err(|e| format!("reading its memory at {address:#x}: {e}"))?;
        Ok(u64::from_le_bytes(bytes))
    };
    // PyTypeObject's `tp_name`, after the object header and `ob_size`.
    let name = word(py.code_type + 24)?;
    let mut text = [0u8; 5];
    memory
        .read_exact_at(&mut text, name)
        .map_err(|e| format!("reading PyCode_Type's name: {e}"))?;
    if &text != b"code\0" {
        return Err("PyCode_Type is not the type named \"code\": not the layout expected".into());
    }
    let interp = word(py.runtime + u64::from(py.runtime_interpreters))?;
    if interp == 0 {
        return Ok(());
    }
    let tstate = word(interp + u64::from(py.interp_threads))?;
    if tstate != 0 && word(tstate + u64::from(py.tstate_interp))? != interp {
        return Err(
            "its first thread state does not point back at its interpreter: not the layout expected"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
