//! Finding a probe set's library file and reading its exported functions.

use std::{
    collections::HashMap,
    env, fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
};

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

use super::probe_set::{PROBE_SETS, ProbeSet};

/// Directories searched after the ldconfig cache and `LD_LIBRARY_PATH`, with this
/// architecture's multiarch folders.
pub fn usual_dirs() -> Vec<String> {
    let multiarch = tracer_common::arch::TARGET.multiarch;
    vec![
        "/usr/local/nvidia/lib64".into(),
        "/usr/local/nvidia/lib".into(),
        format!("/usr/lib/{multiarch}"),
        "/usr/lib64".into(),
        "/usr/lib".into(),
        format!("/lib/{multiarch}"),
        "/usr/lib/wsl/lib".into(),
    ]
}

/// Whether an `ldconfig -p` entry's `(libc6,ABI)` is this architecture's.
pub fn ldconfig_is_ours(entry: &str, arch: &tracer_common::arch::Arch) -> bool {
    entry.contains(&format!(",{})", arch.ldconfig_abi))
}

#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    #[error(
        "no {} found (searched the ldconfig cache, LD_LIBRARY_PATH and {}): {} or pass {} PATH",
        .0.library, usual_dirs().join(", "), .0.install_hint, .0.path_flag
    )]
    NotFound(&'static ProbeSet),
    #[error("{} {}: {}", .0.path_flag, .1.display(), .2)]
    Unreadable(&'static ProbeSet, PathBuf, std::io::Error),
    #[error("{0} is not an ELF shared library with dynamic symbols: {1}")]
    NotElf(PathBuf, object::Error),
    #[error("--lib {}: {}", .0.display(), .1)]
    LibUnreadable(PathBuf, std::io::Error),
    #[error(
        "--lib {}: not a library cudatrace probes: its name, soname and exports match none of {}",
        .0.display(), known_libraries()
    )]
    Unknown(PathBuf),
}

fn known_libraries() -> String {
    PROBE_SETS
        .iter()
        .filter(|set| !set.run_private)
        .map(|set| set.library)
        .collect::<Vec<_>>()
        .join(", ")
}

/// An exported function: its name and the file offset a uprobe attaches to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportedFn {
    pub name: String,
    pub file_offset: u64,
}

/// One library file: what the probes attach to, and what the trace header says of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LibraryFile {
    /// Canonical path (symlinks resolved): uprobes attach to this inode.
    pub path: PathBuf,
    /// The file's device and inode: the same library reached by two paths is one file.
    pub device: u64,
    pub inode: u64,
    /// Version from the file name (`libcuda.so.580.159.04`), if any.
    pub version: Option<String>,
    /// True for cudatrace's stand-in of the library.
    pub standin: bool,
}

/// A library file and its exported functions.
#[derive(Clone, Debug)]
pub struct Library {
    pub file: LibraryFile,
    /// Exported functions by name.
    pub functions: HashMap<String, ExportedFn>,
}

/// Finds `set`'s library: `explicit`, then the ldconfig cache, `LD_LIBRARY_PATH`, the
/// usual places.
pub fn find(set: &'static ProbeSet, explicit: Option<&Path>) -> Result<PathBuf, LibraryError> {
    if let Some(path) = explicit {
        return fs::canonicalize(path).map_err(|e| LibraryError::Unreadable(set, path.into(), e));
    }
    candidates(set)
        .into_iter()
        .find(|p| p.is_file())
        .and_then(|p| fs::canonicalize(p).ok())
        .ok_or(LibraryError::NotFound(set))
}

fn candidates(set: &ProbeSet) -> Vec<PathBuf> {
    let mut found = ldconfig_cache(set);
    let ld_path = env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
    let dirs = env::split_paths(&ld_path)
        .filter(|d| !d.as_os_str().is_empty())
        .chain(usual_dirs().into_iter().map(PathBuf::from));
    for dir in dirs {
        found.extend(set.file_names.iter().map(|name| dir.join(name)));
    }
    found
}

/// `ldconfig -p` lines like `libcuda.so.1 (libc6,x86-64) => /usr/lib/.../libcuda.so.1`.
fn ldconfig_cache(set: &ProbeSet) -> Vec<PathBuf> {
    let output = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|bin| Command::new(bin).arg("-p").output().ok())
        .filter(|out| out.status.success());
    let Some(output) = output else {
        return Vec::new();
    };
    parse_ldconfig(
        set,
        &String::from_utf8_lossy(&output.stdout),
        &tracer_common::arch::TARGET,
    )
}

fn parse_ldconfig(set: &ProbeSet, text: &str, arch: &tracer_common::arch::Arch) -> Vec<PathBuf> {
    let mut paths: Vec<(usize, PathBuf)> = text
        .lines()
        .filter_map(|line| {
            let (lib, path) = line.trim().split_once(" => ")?;
            let name = lib.split_whitespace().next()?;
            let rank = set.file_names.iter().position(|n| *n == name)?;
            if !ldconfig_is_ours(lib, arch) {
                return None;
            }
            Some((rank, PathBuf::from(path.trim())))
        })
        .collect();
    paths.sort_by_key(|(rank, _)| *rank);
    paths.into_iter().map(|(_, p)| p).collect()
}

/// Which probe set the library file `file` (shown as `path`) belongs to: by its file
/// name, then its soname, then its exports (`--lib` of a copy under another name).
pub fn identify(file: &fs::File, path: &Path) -> Result<&'static ProbeSet, LibraryError> {
    // cudatrace's own run-private libraries (the injection library) are not for `--lib`.
    let by_name = |name: &str| {
        PROBE_SETS
            .iter()
            .copied()
            .filter(|set| !set.run_private)
            .find(|set| set.matches_file_name(name))
    };
    if let Some(set) = path.file_name().and_then(|n| n.to_str()).and_then(by_name) {
        return Ok(set);
    }
    // SAFETY: read-only mapping of a library file that nothing here writes.
    let map = unsafe { memmap2::Mmap::map(file) }
        .map_err(|e| LibraryError::LibUnreadable(path.into(), e))?;
    let elf = object::File::parse(&*map).map_err(|e| LibraryError::NotElf(path.into(), e))?;
    if let Some(set) = soname(&map).as_deref().and_then(by_name) {
        return Ok(set);
    }
    let exported: std::collections::HashSet<&str> = elf
        .dynamic_symbols()
        .filter(|symbol| !symbol.is_undefined())
        .filter_map(|symbol| symbol.name().ok())
        .collect();
    PROBE_SETS
        .iter()
        .copied()
        .filter(|set| !set.run_private)
        .find(|set| set.identity.iter().all(|name| exported.contains(name)))
        .ok_or_else(|| LibraryError::Unknown(path.into()))
}

/// The `DT_SONAME` of a 64-bit little-endian ELF file, if it has one.
fn soname(data: &[u8]) -> Option<String> {
    use object::{
        LittleEndian,
        elf::{DT_SONAME, FileHeader64},
        read::elf::{Dyn, FileHeader},
    };
    let header = FileHeader64::<LittleEndian>::parse(data).ok()?;
    let endian = header.endian().ok()?;
    let sections = header.sections(endian, data).ok()?;
    let (dynamic, strings_index) = sections.dynamic(endian, data).ok()??;
    let strings = sections.strings(endian, data, strings_index).ok()?;
    dynamic
        .iter()
        .find(|entry| entry.tag32(endian) == Some(DT_SONAME))
        .and_then(|entry| entry.string(endian, strings).ok())
        .map(|name| String::from_utf8_lossy(name).into_owned())
}

impl Library {
    /// Reads the dynamic symbols of `set`'s library at `path`.
    pub fn open(set: &'static ProbeSet, path: &Path) -> Result<Self, LibraryError> {
        let file =
            fs::File::open(path).map_err(|e| LibraryError::Unreadable(set, path.into(), e))?;
        Self::read(set, &file, path)
    }

    /// Reads the dynamic symbols of `set`'s library from `file`, an open library file;
    /// `path` names it in messages and the trace (a file opened through `/proc/PID/fd` is
    /// named by the path the process used).
    pub fn read(
        set: &'static ProbeSet,
        file: &fs::File,
        path: &Path,
    ) -> Result<Self, LibraryError> {
        let unreadable = |e| LibraryError::Unreadable(set, path.into(), e);
        let metadata = file.metadata().map_err(unreadable)?;
        // SAFETY: read-only mapping of a library file that nothing here writes.
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(unreadable)?;
        let elf = object::File::parse(&*map).map_err(|e| LibraryError::NotElf(path.into(), e))?;
        let segments: Vec<(u64, u64, u64)> = elf
            .segments()
            .map(|seg| (seg.address(), seg.size(), seg.file_range().0))
            .collect();
        let mut functions = HashMap::new();
        let mut standin = false;
        for symbol in elf.dynamic_symbols() {
            let Ok(name) = symbol.name() else { continue };
            if !set.standin_marker.is_empty() && name == set.standin_marker {
                standin = true;
            }
            if symbol.kind() != SymbolKind::Text || symbol.is_undefined() {
                continue;
            }
            let address = symbol.address();
            let Some(file_offset) = segments
                .iter()
                .find(|(start, size, _)| address >= *start && address < start + size)
                .map(|(start, _, offset)| address - start + offset)
            else {
                continue;
            };
            functions.insert(
                name.to_owned(),
                ExportedFn {
                    name: name.to_owned(),
                    file_offset,
                },
            );
        }
        Ok(Self {
            file: LibraryFile {
                path: path.to_owned(),
                device: metadata.dev(),
                inode: metadata.ino(),
                version: path
                    .file_name()
                    .and_then(|name| name.to_str())
                    .and_then(|name| set.version_in(name)),
                standin,
            },
            functions,
        })
    }
}

impl LibraryFile {
    /// A short human label: path, version, and the stand-in warning where it applies.
    pub fn describe(&self) -> String {
        let version = self
            .version
            .as_deref()
            .map(|v| format!(" {v}"))
            .unwrap_or_default();
        let standin = if self.standin {
            " (cudatrace STAND-IN, not NVIDIA's driver)"
        } else {
            ""
        };
        format!("{}{version}{standin}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::probe_set::LIBCUDA;

    #[test]
    fn ldconfig_lines_give_paths_in_preference_order() {
        let text = "\t3 libs found in cache `/etc/ld.so.cache'\n\
            \tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1\n\
            \tlibcuda.so.1 (libc6) => /usr/lib32/libcuda.so.1\n\
            \tlibcudart.so.12 (libc6,x86-64) => /usr/lib/libcudart.so.12\n";
        assert_eq!(
            parse_ldconfig(&LIBCUDA, text, &tracer_common::arch::X86_64),
            vec![
                PathBuf::from("/usr/local/nvidia/lib64/libcuda.so.1"),
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so"),
            ]
        );
    }

    /// A GH200's cache names AArch64 libraries; an arm64 cudatrace takes those alone.
    #[test]
    fn arm64_takes_the_aarch64_entries() {
        let text = "\tlibcuda.so.1 (libc6,AArch64) => /usr/lib/aarch64-linux-gnu/libcuda.so.1\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n";
        assert_eq!(
            parse_ldconfig(&LIBCUDA, text, &tracer_common::arch::AARCH64),
            vec![PathBuf::from("/usr/lib/aarch64-linux-gnu/libcuda.so.1")]
        );
        assert_eq!(
            parse_ldconfig(&LIBCUDA, text, &tracer_common::arch::X86_64),
            vec![PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1")]
        );
    }

    #[test]
    fn explicit_missing_path_is_an_error_naming_it() {
        let err = find(&LIBCUDA, Some(Path::new("/nonexistent/libcuda.so.1"))).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--libcuda /nonexistent/libcuda.so.1: "),
            "{err}"
        );
    }
}
