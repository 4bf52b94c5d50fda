//! Finding libcuda and reading its exported functions.

use std::{
    collections::HashMap,
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

/// The symbol that marks cudatrace's stand-in library (tests and the no-GPU demo).
pub const STANDIN_MARKER: &str = "cudatrace_standin_libcuda";

/// Directories searched after the ldconfig cache and `LD_LIBRARY_PATH`.
pub const USUAL_DIRS: &[&str] = &[
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/wsl/lib",
];

const NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

#[derive(Debug, thiserror::Error)]
pub enum LibcudaError {
    #[error(
        "no libcuda found (searched the ldconfig cache, LD_LIBRARY_PATH and {}): \
         install the NVIDIA driver or pass --libcuda PATH",
        USUAL_DIRS.join(", ")
    )]
    NotFound,
    #[error("--libcuda {0}: {1}")]
    Unreadable(PathBuf, std::io::Error),
    #[error("{0} is not an ELF shared library with dynamic symbols: {1}")]
    NotElf(PathBuf, object::Error),
}

/// An exported function: its name and the file offset a uprobe attaches to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportedFn {
    pub name: String,
    pub file_offset: u64,
}

/// What cudatrace knows about the library it attaches to.
#[derive(Clone, Debug)]
pub struct Libcuda {
    /// Canonical path (symlinks resolved): uprobes attach to this inode.
    pub path: PathBuf,
    /// Driver version from the file name (`libcuda.so.580.159.04`), if any.
    pub version: Option<String>,
    /// True for cudatrace's stand-in library.
    pub standin: bool,
    /// Exported functions by name.
    pub functions: HashMap<String, ExportedFn>,
}

/// Finds libcuda: `explicit`, then the ldconfig cache, `LD_LIBRARY_PATH`, the usual places.
pub fn find(explicit: Option<&Path>) -> Result<PathBuf, LibcudaError> {
    if let Some(path) = explicit {
        return fs::canonicalize(path).map_err(|e| LibcudaError::Unreadable(path.into(), e));
    }
    candidates()
        .into_iter()
        .find(|p| p.is_file())
        .and_then(|p| fs::canonicalize(p).ok())
        .ok_or(LibcudaError::NotFound)
}

fn candidates() -> Vec<PathBuf> {
    let mut found = ldconfig_cache();
    let ld_path = env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
    let dirs = env::split_paths(&ld_path)
        .filter(|d| !d.as_os_str().is_empty())
        .chain(USUAL_DIRS.iter().map(PathBuf::from));
    for dir in dirs {
        found.extend(NAMES.iter().map(|name| dir.join(name)));
    }
    found
}

/// `ldconfig -p` lines like `libcuda.so.1 (libc6,x86-64) => /usr/lib/.../libcuda.so.1`.
fn ldconfig_cache() -> Vec<PathBuf> {
    let output = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|bin| Command::new(bin).arg("-p").output().ok())
        .filter(|out| out.status.success());
    let Some(output) = output else {
        return Vec::new();
    };
    parse_ldconfig(&String::from_utf8_lossy(&output.stdout))
}

fn parse_ldconfig(text: &str) -> Vec<PathBuf> {
    let mut paths: Vec<(usize, PathBuf)> = text
        .lines()
        .filter_map(|line| {
            let (lib, path) = line.trim().split_once(" => ")?;
            let name = lib.split_whitespace().next()?;
            let rank = NAMES.iter().position(|n| *n == name)?;
            if !lib.contains("x86-64") {
                return None;
            }
            Some((rank, PathBuf::from(path.trim())))
        })
        .collect();
    paths.sort_by_key(|(rank, _)| *rank);
    paths.into_iter().map(|(_, p)| p).collect()
}

impl Libcuda {
    /// Reads the library's dynamic symbols.
    pub fn open(path: &Path) -> Result<Self, LibcudaError> {
        let file = fs::File::open(path).map_err(|e| LibcudaError::Unreadable(path.into(), e))?;
        // SAFETY: read-only mapping of a library file that nothing here writes.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| LibcudaError::Unreadable(path.into(), e))?;
        let elf = object::File::parse(&*map).map_err(|e| LibcudaError::NotElf(path.into(), e))?;
        let segments: Vec<(u64, u64, u64)> = elf
            .segments()
            .map(|seg| (seg.address(), seg.size(), seg.file_range().0))
            .collect();
        let mut functions = HashMap::new();
        let mut standin = false;
        for symbol in elf.dynamic_symbols() {
            let Ok(name) = symbol.name() else { continue };
            if name == STANDIN_MARKER {
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
            path: path.to_owned(),
            version: version_from_name(path),
            standin,
            functions,
        })
    }

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

/// `libcuda.so.580.159.04` gives `580.159.04`; `libcuda.so.1` gives nothing.
fn version_from_name(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let version = name.strip_prefix("libcuda.so.")?;
    version.contains('.').then(|| version.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldconfig_lines_give_paths_in_preference_order() {
        let text = "\t3 libs found in cache `/etc/ld.so.cache'\n\
            \tlibcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so\n\
            \tlibcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1\n\
            \tlibcuda.so.1 (libc6) => /usr/lib32/libcuda.so.1\n\
            \tlibcudart.so.12 (libc6,x86-64) => /usr/lib/libcudart.so.12\n";
        assert_eq!(
            parse_ldconfig(text),
            vec![
                PathBuf::from("/usr/local/nvidia/lib64/libcuda.so.1"),
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so"),
            ]
        );
    }

    #[test]
    fn version_comes_from_the_real_file_name() {
        assert_eq!(
            version_from_name(Path::new("/x/libcuda.so.580.159.04")).as_deref(),
            Some("580.159.04")
        );
        assert_eq!(version_from_name(Path::new("/x/libcuda.so.1")), None);
    }

    #[test]
    fn explicit_missing_path_is_an_error_naming_it() {
        let err = find(Some(Path::new("/nonexistent/libcuda.so.1"))).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("--libcuda /nonexistent/libcuda.so.1: "),
            "{err}"
        );
    }
}
