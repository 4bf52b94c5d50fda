//! What cudatrace reads of a running process before it touches it: its mappings, its
//! state (`/proc/PID/status`), its word size, and the addresses of its own `dlopen` and
//! `dlsym` (from the ELF symbols of the libc it mapped). Every refusal is decided here,
//! from files alone: `cudatrace doctor -p PID` says the same as an attach would.

use std::{
    fs,
    path::{Path, PathBuf},
};

use object::{Object, ObjectSegment, ObjectSymbol};

/// One line of `/proc/PID/maps`.
#[cfg(target_arch = "x86_64")]
use super::trampoline::CODE_LEN;
/// Not used: elsewhere than x86-64 every process is refused before room is sought.
#[cfg(not(target_arch = "x86_64"))]
const CODE_LEN: usize = 0;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub perms: String,
    pub offset: u64,
    /// The file, as the process sees it (may end in " (deleted)").
    pub path: String,
}

impl Mapping {
    pub fn executable(&self) -> bool {
        self.perms.as_bytes().get(2) == Some(&b'x')
    }

    /// The file name, without its folder.
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or("")
    }
}

/// Parses `/proc/PID/maps`.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (range, perms, offset) = (fields.next()?, fields.next()?, fields.next()?);
            let (_device, _inode) = (fields.next()?, fields.next()?);
            let path = fields.collect::<Vec<_>>().join(" ");
            let (start, end) = range.split_once('-')?;
            Some(Mapping {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                perms: perms.to_owned(),
                offset: u64::from_str_radix(offset, 16).ok()?,
                path,
            })
        })
        .collect()
}

/// A field of `/proc/PID/status` (`TracerPid`, `Seccomp`, ...).
pub fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim())
    })
}

/// Why cudatrace will not attach to a process, each with what the user can do.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error("process {0} is gone (it exited)")]
    Gone(u32),
    #[error(
        "process {pid} is already traced by process {tracer} ({name}): Linux allows one \
         ptrace tracer at a time; detach that debugger or tracer first"
    )]
    AlreadyTraced { pid: u32, tracer: u32, name: String },
    #[error(
        "process {0} runs under a seccomp filter: the calls the injection makes (its own \
         dlopen, mmap of the library, a thread) may be refused or kill it; start it under \
         `cudatrace run --gpu -- CMD` instead"
    )]
    Seccomp(u32),
    #[error(
        "ptrace is forbidden on this machine (kernel.yama.ptrace_scope = 3, which only a \
         reboot lifts): start the program under `cudatrace run --gpu -- CMD` instead"
    )]
    YamaForbidden,
    #[error(
        "process {0} is not a 64-bit x86 program: attaching injects x86-64 code, so it \
         supports those only (arm64 and 32-bit programs: start them under `cudatrace run \
         --gpu -- CMD`)"
    )]
    NotX86_64(u32),
    #[error(
        "process {0} has not loaded libcuda: nothing to record; attach once it uses CUDA \
         (or start it under `cudatrace run --gpu -- CMD`)"
    )]
    NoLibcuda(u32),
    #[error(
        "process {pid} already has cudatrace's injection library from {path}: it runs under \
         `cudatrace run --gpu` (or another cudatrace's attach), which records its GPU already"
    )]
    OtherInjection { pid: u32, path: String },
    #[error(
        "process {0} has no dlopen and dlsym in a libc or libdl it mapped (a static program?): \
         the injection library cannot be loaded into it"
    )]
    NoDlopen(u32),
    #[error(
        "process {0} has no /proc in its root (a container without one): the injection \
         library goes in as an anonymous file, which the process loads through \
         /proc/self/fd; mount /proc in its root, or start it under `cudatrace run --gpu`"
    )]
    NoProc(u32),
    #[error(
        "process {0} runs in another PID namespace (a container): the injection library \
         finds cudatrace, and its window's end, by pids the process cannot see; run it \
         with the host's PID namespace (docker --pid=host) or start it under `cudatrace run \
         --gpu`"
    )]
    OtherPidNamespace(u32),
    #[error("no executable page of process {0} has room for the trampoline")]
    NoRoom(u32),
    #[error("cannot read {what} of process {pid}: {why}")]
    Unreadable {
        pid: u32,
        what: &'static str,
        why: String,
    },
}

/// What attaching needs to know of a process, read before it is touched.
#[derive(Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by the x86-64 inject
pub struct Target {
    pub pid: u32,
    pub maps: Vec<Mapping>,
    pub dlopen: u64,
    pub dlsym: u64,
    /// Where the trampoline's code goes: the unused tail of an executable mapping.
    pub code_at: u64,
    /// The libcuda the process mapped.
    pub libcuda: String,
    /// The libcupti it mapped already, if any.
    pub libcupti: Option<String>,
    /// cudatrace's injection library, if an earlier attach loaded it.
    pub injected: Option<Loaded>,
    /// The lowest descriptor the library's file is moved to in the process
    /// ([`library_fd_floor`]).
    pub library_fd_floor: u64,
}

/// Where the library's descriptor goes: at or above [`LIBRARY_FD_FLOOR`], or three
/// quarters of the process's soft `RLIMIT_NOFILE` where that is lower. The descriptor
/// stays open for as long as the library is loaded (the loader knows the library by its
/// `/proc/self/fd` path), so it is put out of the way of the low numbers a program's own
/// files take, without growing its descriptor table much (the kernel sizes it by the
/// highest descriptor, so not near a limit of a million).
pub fn library_fd_floor(limits: &str) -> u64 {
    let soft = limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse::<u64>().ok())
        .unwrap_or(1024);
    LIBRARY_FD_FLOOR.min(soft * 3 / 4)
}

/// The usual floor for the library's descriptor.
pub const LIBRARY_FD_FLOOR: u64 = 1000;

/// cudatrace's injection library as an earlier attach left it in the process.
#[derive(Debug)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by the x86-64 inject
pub struct Loaded {
    /// As the process's maps name it (`/memfd:libcudatrace_inject-HASH.so (deleted)`).
    pub path: String,
    /// Its first mapping, through which cudatrace opens it (`/proc/PID/map_files`).
    pub file: PathBuf,
    /// Its `cudatrace_attach`, called straight away.
    pub attach: u64,
}

/// The library's name in a mapping's path: the file name, without the `memfd:` an
/// anonymous file's has and the ` (deleted)` it ends with.
pub fn library_name(path: &str) -> &str {
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    let name = path.rsplit('/').next().unwrap_or("");
    name.strip_prefix("memfd:").unwrap_or(name)
}

/// Reads the process and decides whether an attach can go ahead; `library` is the name of
/// the injection library this cudatrace would load (what an earlier attach's is compared
/// with).
pub fn inspect(pid: u32, library: &str) -> Result<Target, Refusal> {
    let read = |what: &'static str| {
        fs::read_to_string(format!("/proc/{pid}/{what}")).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Refusal::Gone(pid)
            } else {
                Refusal::Unreadable {
                    pid,
                    what,
                    why: e.to_string(),
                }
            }
        })
    };
    let status = read("status")?;
    if status_field(&status, "State").is_some_and(|state| state.starts_with('Z')) {
        return Err(Refusal::Gone(pid));
    }
    if fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").is_ok_and(|v| v.trim() == "3") {
        return Err(Refusal::YamaForbidden);
    }
    if let Some(tracer) = status_field(&status, "TracerPid")
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|&tracer| tracer != 0)
    {
        let name = fs::read_to_string(format!("/proc/{tracer}/comm"))
            .map(|n| n.trim().to_owned())
            .unwrap_or_default();
        return Err(Refusal::AlreadyTraced { pid, tracer, name });
    }
    if status_field(&status, "Seccomp").is_some_and(|mode| mode != "0") {
        return Err(Refusal::Seccomp(pid));
    }
    match is_x86_64(&format!("/proc/{pid}/exe")) {
        Ok(true) => {}
        Ok(false) => return Err(Refusal::NotX86_64(pid)),
        Err(e) => {
            return Err(Refusal::Unreadable {
                pid,
                what: "exe",
                why: e.to_string(),
            });
        }
    }
    let maps = parse_maps(&read("maps")?);
    let libcuda = maps
        .iter()
        .find(|m| m.file_name().starts_with("libcuda.so"))
        .map(|m| m.path.clone())
        .ok_or(Refusal::NoLibcuda(pid))?;
    if !same_namespace(pid, "pid") {
        return Err(Refusal::OtherPidNamespace(pid));
    }
    if !has_proc(pid) {
        return Err(Refusal::NoProc(pid));
    }
    let injected = match maps
        .iter()
        .find(|m| library_name(&m.path).starts_with("libcudatrace_inject"))
    {
        Some(mapping) if library_name(&mapping.path) != library => {
            return Err(Refusal::OtherInjection {
                pid,
                path: mapping.path.clone(),
            });
        }
        Some(mapping) => Some(
            loaded(pid, &maps, &mapping.path).ok_or(Refusal::Unreadable {
                pid,
                what: "the injection library an earlier attach loaded",
                why: "no cudatrace_attach in it".into(),
            })?,
        ),
        None => None,
    };
    let libcupti = maps
        .iter()
        .find(|m| m.file_name().starts_with("libcupti.so"))
        .map(|m| m.path.clone());
    let (dlopen, dlsym) = loader_functions(pid, &maps).ok_or(Refusal::NoDlopen(pid))?;
    let code_at = room_for_code(pid, &maps, CODE_LEN as u64).ok_or(Refusal::NoRoom(pid))?;
    let library_fd_floor = library_fd_floor(&read("limits")?);
    Ok(Target {
        pid,
        maps,
        dlopen,
        dlsym,
        code_at,
        libcuda,
        libcupti,
        injected,
        library_fd_floor,
    })
}

/// Whether the ELF file is a 64-bit x86 program.
fn is_x86_64(path: &str) -> std::io::Result<bool> {
    let mut header = [0u8; 20];
    use std::io::Read;
    fs::File::open(path).and_then(|mut file| file.read_exact(&mut header))?;
    Ok(header[..4] == *b"\x7fELF"
        && header[4] == 2
        && u16::from_le_bytes([header[18], header[19]]) == 62)
}

/// Whether the process is in cudatrace's own namespace of this kind (`pid`, `mnt`).
fn same_namespace(pid: u32, kind: &str) -> bool {
    let ns = |path: String| fs::read_link(path).ok();
    ns(format!("/proc/{pid}/ns/{kind}")) == ns(format!("/proc/self/ns/{kind}"))
}

/// Whether the process's root has a procfs at `/proc` (it loads the library through
/// `/proc/self/fd`).
fn has_proc(pid: u32) -> bool {
    let Ok(path) = std::ffi::CString::new(format!("/proc/{pid}/root/proc")) else {
        return false;
    };
    // SAFETY: statfs fills the struct for a NUL-terminated path.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(path.as_ptr(), &mut stat) }) == 0
        && stat.f_type == libc::PROC_SUPER_MAGIC
}

/// The injection library mapped at `path`: opened through its first mapping, and where
/// its `cudatrace_attach` is.
fn loaded(pid: u32, maps: &[Mapping], path: &str) -> Option<Loaded> {
    let first = maps.iter().find(|m| m.path == path && m.offset == 0)?;
    let file = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        first.start, first.end
    ));
    let bytes = fs::read(&file).ok()?;
    let elf = object::File::parse(&*bytes).ok()?;
    let bias = bias(maps, path, &elf)?;
    let attach = elf
        .dynamic_symbols()
        .find(|s| s.is_definition() && s.name() == Ok("cudatrace_attach"))?
        .address();
    Some(Loaded {
        path: path.to_owned(),
        file,
        attach: bias + attach,
    })
}

/// The file of a mapping, opened through the process's own view (`/proc/PID/root`).
fn mapped_file(pid: u32, mapping: &Mapping) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{}", mapping.path))
}

/// The load bias of a mapped file: where its first mapping starts, less the first
/// segment's address.
fn bias(maps: &[Mapping], path: &str, file: &object::File) -> Option<u64> {
    let first = maps.iter().find(|m| m.path == path && m.offset == 0)?;
    let lowest = file
        .segments()
        .filter(|segment| segment.file_range().0 == 0)
        .map(|segment| segment.address())
        .min()
        .unwrap_or(0);
    Some(first.start - (lowest & !0xfff))
}

/// The process's `dlopen` and `dlsym`: from its libc (glibc 2.34 and later, musl) or its
/// libdl (older glibc).
fn loader_functions(pid: u32, maps: &[Mapping]) -> Option<(u64, u64)> {
    let mut paths: Vec<&Mapping> = maps
        .iter()
        .filter(|m| {
            let name = m.file_name();
            m.offset == 0
                && (name.starts_with("libc.so")
                    || name.starts_with("libc.musl")
                    || name.starts_with("ld-musl")
                    || name.starts_with("libdl.so"))
        })
        .collect();
    paths.dedup_by(|a, b| a.path == b.path);
    let (mut dlopen, mut dlsym) = (None, None);
    for mapping in paths {
        let Ok(bytes) = fs::read(mapped_file(pid, mapping)) else {
            continue;
        };
        let Ok(file) = object::File::parse(&*bytes) else {
            continue;
        };
        let Some(bias) = bias(maps, &mapping.path, &file) else {
            continue;
        };
        for symbol in file.dynamic_symbols() {
            if !symbol.is_definition() {
                continue;
            }
            match symbol.name() {
                Ok("dlopen") => dlopen = dlopen.or(Some(bias + symbol.address())),
                Ok("dlsym") => dlsym = dlsym.or(Some(bias + symbol.address())),
                _ => {}
            }
        }
    }
    Some((dlopen?, dlsym?))
}

/// A loadable segment: (vaddr, memsz, executable, file offset).
type Segment = (u64, u64, bool, u64);

/// The `PT_LOAD` segments of a 64-bit little-endian ELF file, from its program headers
/// alone (the first pages: a library of a gigabyte is not read whole).
fn load_segments(path: &Path) -> Option<Vec<Segment>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = fs::File::open(path).ok()?;
    let mut header = [0u8; 64];
    file.read_exact(&mut header).ok()?;
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as usize;
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (
        u64_at(&header, 32),
        u16_at(&header, 54),
        u16_at(&header, 56),
    );
    if phentsize < 56 || phnum > 256 {
        return None;
    }
    let mut table = vec![0u8; phentsize * phnum];
    file.seek(SeekFrom::Start(phoff)).ok()?;
    file.read_exact(&mut table).ok()?;
    Some(
        table
            .chunks_exact(phentsize)
            .filter(|ph| u32_at(ph, 0) == object::elf::PT_LOAD)
            .map(|ph| {
                let executable = u32_at(ph, 4) & object::elf::PF_X != 0;
                (u64_at(ph, 16), u64_at(ph, 40), executable, u64_at(ph, 8))
            })
            .collect(),
    )
}

/// An address where `len` bytes fit between the end of an executable segment's contents
/// and the end of its last page: mapped, executable, never run. libc is tried first.
fn room_for_code(pid: u32, maps: &[Mapping], len: u64) -> Option<u64> {
    let mut candidates: Vec<&Mapping> = maps
        .iter()
        .filter(|m| m.executable() && m.path.starts_with('/'))
        .collect();
    candidates.sort_by_key(|m| !m.file_name().starts_with("libc.so"));
    let mut seen = Vec::new();
    for mapping in candidates {
        if seen.contains(&mapping.path) {
            continue;
        }
        seen.push(mapping.path.clone());
        let Some(segments) = load_segments(&mapped_file(pid, mapping)) else {
            continue;
        };
        let Some(first) = maps
            .iter()
            .find(|m| m.path == mapping.path && m.offset == 0)
        else {
            continue;
        };
        let lowest = segments
            .iter()
            .filter(|s| s.3 == 0)
            .map(|s| s.0)
            .min()
            .unwrap_or(0);
        let bias = first.start.wrapping_sub(lowest & !0xfff);
        for &(vaddr, memsz, executable, _) in &segments {
            if !executable {
                continue;
            }
            let end = bias.wrapping_add(vaddr).wrapping_add(memsz);
            let start = (end + 15) & !15;
            let page_end = (end + 0xfff) & !0xfff;
            let inside = maps
                .iter()
                .any(|m| m.executable() && m.start <= start && page_end <= m.end);
            if inside && start + len <= page_end {
                return Some(start);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_and_status_are_read() {
        let maps = parse_maps(
            "7f0000000000-7f0000001000 r-xp 00002000 08:01 1234    /usr/lib/x86_64-linux-gnu/libc.so.6\n\
             7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]\n\
             7f0000005000-7f0000006000 r-xp 00000000 00:1f 99 /tmp/a b/libcuda.so.1 (deleted)\n",
        );
        assert_eq!(maps.len(), 3);
        assert_eq!(
            (
                maps[0].start,
                maps[0].end,
                maps[0].offset,
                maps[0].file_name()
            ),
            (0x7f0000000000, 0x7f0000001000, 0x2000, "libc.so.6")
        );
        assert!(maps[0].executable() && !maps[1].executable());
        assert_eq!(maps[2].path, "/tmp/a b/libcuda.so.1 (deleted)");
        let status = "Name:\tpython3\nTracerPid:\t0\nSeccomp:\t2\n";
        assert_eq!(status_field(status, "TracerPid"), Some("0"));
        assert_eq!(status_field(status, "Seccomp"), Some("2"));
        assert_eq!(status_field(status, "Missing"), None);
        // An anonymous file's name, as an earlier attach left the library.
        for (path, name) in [
            (
                "/memfd:libcudatrace_inject-00ab.so (deleted)",
                "libcudatrace_inject-00ab.so",
            ),
            (
                "/run/cudatrace/libcudatrace_inject-00ab.so",
                "libcudatrace_inject-00ab.so",
            ),
            ("/tmp/a b/libcuda.so.1 (deleted)", "libcuda.so.1"),
        ] {
            assert_eq!(library_name(path), name);
        }
    }

    #[test]
    fn the_librarys_descriptor_goes_high_but_below_the_limit() {
        let limits = |soft: &str| {
            format!(
                "Limit                     Soft Limit           Hard Limit           Units     \n\
                 Max processes             63432                63432                processes \n\
                 Max open files            {soft:<20} 1048576              files     \n"
            )
        };
        assert_eq!(library_fd_floor(&limits("1024")), 768);
        assert_eq!(library_fd_floor(&limits("1048576")), 1000);
        assert_eq!(library_fd_floor(&limits("4096")), 1000);
        assert_eq!(library_fd_floor(&limits("64")), 48);
        assert_eq!(library_fd_floor(&limits("unlimited")), 768);
    }

    /// A 32-bit x86 program and a 64-bit Arm one are told from a 64-bit x86 one by their
    /// ELF header (no 32-bit toolchain here to build a real one).
    #[test]
    fn only_64_bit_x86_programs_are_taken() {
        let dir = std::env::temp_dir().join(format!("cudatrace-elf-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let header = |class: u8, machine: u16| {
            let mut bytes = vec![0u8; 64];
            bytes[..4].copy_from_slice(b"\x7fELF");
            bytes[4] = class;
            bytes[5] = 1;
            bytes[18..20].copy_from_slice(&machine.to_le_bytes());
            bytes
        };
        for (name, class, machine, taken) in [
            ("i386", 1, 3, false),
            ("aarch64", 2, 183, false),
            ("x86_64", 2, 62, true),
        ] {
            let path = dir.join(name);
            fs::write(&path, header(class, machine)).unwrap();
            assert_eq!(is_x86_64(path.to_str().unwrap()).unwrap(), taken, "{name}");
        }
        assert_eq!(
            Refusal::NotX86_64(7).to_string(),
            "process 7 is not a 64-bit x86 program: attaching injects x86-64 code, so it \
             supports those only (arm64 and 32-bit programs: start them under `cudatrace run \
             --gpu -- CMD`)"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// This test process: its own libc's dlopen and dlsym are found where the dynamic
    /// loader put them.
    #[test]
    fn this_processs_dlopen_is_found() {
        let pid = std::process::id();
        let maps = parse_maps(&fs::read_to_string("/proc/self/maps").unwrap());
        let (dlopen, dlsym) = loader_functions(pid, &maps).unwrap();
        assert_eq!(dlopen, libc::dlopen as *const () as usize as u64);
        assert_eq!(dlsym, libc::dlsym as *const () as usize as u64);
        let at = room_for_code(pid, &maps, 0x118).unwrap();
        assert!(
            maps.iter()
                .any(|m| m.executable() && m.start <= at && at + 0x118 <= m.end)
        );
        assert!(is_x86_64("/proc/self/exe").unwrap());
        assert!(!is_x86_64("/proc/self/status").unwrap());
    }
}
