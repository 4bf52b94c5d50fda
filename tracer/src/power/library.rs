//! Finding NVML and starting it: `--nvml PATH`; else the dynamic loader's own search for
//! `libnvidia-ml.so.1` (LD_LIBRARY_PATH, the ldconfig cache, the default directories);
//! else the usual places. Each candidate is loaded and `nvmlInit_v2`'d; the first that
//! starts is used. A file in a `stubs` directory is never taken: the CUDA toolkit ships a
//! link-time stub there that exports the names and fails at `nvmlInit`.
//!
//! Loading goes through `nvml-wrapper` (libloading underneath). It resolves every symbol
//! at load without failing on missing ones; a missing one fails only the call that needs
//! it (`FailedToLoadSymbol`), except `nvmlShutdown`, which its `Drop` calls unchecked:
//! a library must export it (NVIDIA's and the stand-in do).

use std::{
    ffi::{CStr, CString},
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use nvml_wrapper::{Nvml, error::NvmlError};

/// The library's name, as the loader looks it up.
pub const SONAME: &str = "libnvidia-ml.so.1";

/// Where to look when the loader's search finds nothing usable (this architecture's
/// multiarch folder among them).
pub fn directories() -> [String; 5] {
    [
        "/usr/local/nvidia/lib64".into(),
        format!("/usr/lib/{}", tracer_common::arch::TARGET.multiarch),
        "/usr/lib64".into(),
        "/usr/lib".into(),
        "/usr/lib/wsl/lib".into(),
    ]
}

/// The marker cudatrace's stand-in library exports.
const STANDIN_MARKER: &CStr = c"cudatrace_standin_nvml";

/// NVML, started.
pub struct Loaded {
    pub nvml: Nvml,
    /// The file loaded, symbolic links resolved.
    pub path: PathBuf,
    /// cudatrace's stand-in (tests), not NVIDIA's library.
    pub standin: bool,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NVML at {}", self.path.display())
    }
}

/// No NVML could be started; `attempts` says what was tried and why each failed.
#[derive(Debug, thiserror::Error)]
#[error("no usable NVML ({SONAME}): {}", attempts.join("; "))]
pub struct NotFound {
    pub attempts: Vec<String>,
}

/// Finds and starts NVML: `requested` only, when given.
pub fn load(requested: Option<&Path>) -> Result<Loaded, NotFound> {
    let mut attempts = Vec::new();
    if let Some(path) = requested {
        // A path, never a name for the loader to search (`--nvml libnvidia-ml.so.1`).
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        return start(&absolute).map_err(|why| NotFound {
            attempts: vec![format!("--nvml {}: {why}", path.display())],
        });
    }
    let mut tried: Vec<PathBuf> = Vec::new();
    match loader_search() {
        Ok(path) if in_stubs(&path) => attempts.push(format!(
            "the loader found {}, a link-time stub: skipped",
            path.display()
        )),
        Ok(path) => {
            tried.push(path.clone());
            match start(&path) {
                Ok(loaded) => return Ok(loaded),
                Err(why) => attempts.push(format!("{}: {why}", path.display())),
            }
        }
        Err(why) => attempts.push(format!("the loader's search: {why}")),
    }
    let directories = directories();
    for directory in &directories {
        let path = Path::new(directory).join(SONAME);
        let Ok(resolved) = path.canonicalize() else {
            continue;
        };
        if tried.contains(&resolved) || in_stubs(&resolved) {
            continue;
        }
        tried.push(resolved);
        match start(&path) {
            Ok(loaded) => return Ok(loaded),
            Err(why) => attempts.push(format!("{}: {why}", path.display())),
        }
    }
    if attempts.len() == 1 {
        attempts.push(format!("not in {}", directories.join(", ")));
    }
    Err(NotFound { attempts })
}

/// A path with a `stubs` directory in it.
fn in_stubs(path: &Path) -> bool {
    path.parent()
        .is_some_and(|dir| dir.components().any(|c| c.as_os_str() == "stubs"))
}

/// What the dynamic loader finds for [`SONAME`]: the file it maps.
fn loader_search() -> Result<PathBuf, String> {
    let name = CString::new(SONAME).expect("no NUL in the name");
    let handle = Handle::open(&name)?;
    handle.path()
}

/// Loads `path`, checks it is NVML and starts it.
fn start(path: &Path) -> Result<Loaded, String> {
    let name = CString::new(path.as_os_str().as_bytes()).map_err(|_| "a NUL in the path")?;
    let handle = Handle::open(&name)?;
    let resolved = handle.path()?;
    let standin = handle.has(STANDIN_MARKER);
    let nvml = Nvml::builder()
        .lib_path(resolved.as_os_str())
        .init()
        .map_err(|e| format!("nvmlInit_v2: {}", error_name(&e)))?;
    Ok(Loaded {
        nvml,
        path: resolved,
        standin,
    })
}

/// A `dlopen` handle, closed on drop (nvml-wrapper holds its own).
struct Handle(*mut libc::c_void);

impl Handle {
    fn open(name: &CStr) -> Result<Self, String> {
        // SAFETY: a NUL-terminated name; RTLD_LOCAL keeps its symbols to itself.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(dlerror());
        }
        Ok(Handle(handle))
    }

    fn symbol(&self, name: &CStr) -> *mut libc::c_void {
        // SAFETY: a live handle and a NUL-terminated name.
        unsafe { libc::dlsym(self.0, name.as_ptr()) }
    }

    fn has(&self, name: &CStr) -> bool {
        !self.symbol(name).is_null()
    }

    /// The file that defines `nvmlInit_v2` in this library.
    fn path(&self) -> Result<PathBuf, String> {
        let init = self.symbol(c"nvmlInit_v2");
        if init.is_null() {
            return Err("not NVML: no nvmlInit_v2".into());
        }
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: dladdr fills `info` for an address inside a loaded object.
        if unsafe { libc::dladdr(init, &mut info) } == 0 || info.dli_fname.is_null() {
            return Err("cannot tell which file defines nvmlInit_v2".into());
        }
        // SAFETY: dli_fname is the object's NUL-terminated path, valid while it is loaded.
        let file = unsafe { CStr::from_ptr(info.dli_fname) };
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(file.to_bytes()));
        Ok(path.canonicalize().unwrap_or(path))
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: a handle from dlopen, closed once.
        unsafe { libc::dlclose(self.0) };
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        return "cannot be loaded".into();
    }
    unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .into_owned()
}

/// NVML's name for an error (`NOT_SUPPORTED`, `GPU_IS_LOST`, ...), as nvml.h spells it
/// without `NVML_ERROR_`.
pub fn error_name(error: &NvmlError) -> String {
    let name = match error {
        NvmlError::Uninitialized => "UNINITIALIZED",
        NvmlError::InvalidArg => "INVALID_ARGUMENT",
        NvmlError::NotSupported => "NOT_SUPPORTED",
        NvmlError::NoPermission => "NO_PERMISSION",
        NvmlError::NotFound => "NOT_FOUND",
        NvmlError::InsufficientSize(_) => "INSUFFICIENT_SIZE",
        NvmlError::InsufficientPower => "INSUFFICIENT_POWER",
        NvmlError::DriverNotLoaded => "DRIVER_NOT_LOADED",
        NvmlError::Timeout => "TIMEOUT",
        NvmlError::IrqIssue => "IRQ_ISSUE",
        NvmlError::LibraryNotFound => "LIBRARY_NOT_FOUND",
        NvmlError::FunctionNotFound => "FUNCTION_NOT_FOUND",
        NvmlError::CorruptedInfoROM => "CORRUPTED_INFOROM",
        NvmlError::GpuLost => "GPU_IS_LOST",
        NvmlError::ResetRequired => "RESET_REQUIRED",
        NvmlError::OperatingSystem => "OPERATING_SYSTEM",
        NvmlError::LibRmVersionMismatch => "LIB_RM_VERSION_MISMATCH",
        NvmlError::InUse => "IN_USE",
        NvmlError::InsufficientMemory => "MEMORY",
        NvmlError::NoData => "NO_DATA",
        NvmlError::Unknown => "UNKNOWN",
        NvmlError::FailedToLoadSymbol(symbol) => return format!("MISSING_SYMBOL ({symbol})"),
        NvmlError::UnexpectedVariant(code) => return format!("error {code}"),
        other => return other.to_string(),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stubs_directories_are_recognised() {
        assert!(in_stubs(Path::new(
            "/usr/local/cuda-13.0/targets/x86_64-linux/lib/stubs/libnvidia-ml.so.1"
        )));
        assert!(!in_stubs(Path::new(
            "/usr/local/nvidia/lib64/libnvidia-ml.so.1"
        )));
        assert!(!in_stubs(Path::new("/opt/stubs-not/libnvidia-ml.so.1")));
    }

    #[test]
    fn a_missing_file_names_what_was_tried() {
        let error = load(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
        assert_eq!(error.attempts.len(), 1);
        assert!(
            error.attempts[0].starts_with("--nvml /nonexistent/libnvidia-ml.so.1: "),
            "{:?}",
            error.attempts
        );
        assert!(
            error
                .to_string()
                .starts_with("no usable NVML (libnvidia-ml.so.1): --nvml")
        );
    }

    #[test]
    fn a_library_without_nvml_is_refused() {
        let error = load(Some(Path::new("/lib/x86_64-linux-gnu/libc.so.6"))).unwrap_err();
        assert!(
            error.attempts[0].ends_with("not NVML: no nvmlInit_v2"),
            "{error}"
        );
    }
}
