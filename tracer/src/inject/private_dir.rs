//! The injection library on disk for one run: written from the binary into a fresh private
//! directory that the traced user can read and map but not change, and removed when the
//! run ends, whichever way it ends (the guard's `Drop`; only SIGKILL leaves it behind).

use std::{
    ffi::CString,
    fs::{self, OpenOptions},
    io::Write,
    os::unix::{
        ffi::OsStrExt,
        fs::{OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow};

/// `libcudatrace_inject.so` (`cupti-inject/`), built by `tracer/build.rs`.
pub static INJECTION_LIBRARY: &[u8] = include_bytes!(env!("CUDATRACE_INJECT_LIB"));
/// Its file name in the private directory.
pub const FILE_NAME: &str = "libcudatrace_inject.so";

/// Folders tried for the private directory, after `$TMPDIR`.
const PLACES: [&str; 3] = ["/tmp", "/dev/shm", "/run"];

/// The written library; dropping it removes the directory.
#[derive(Debug)]
pub struct PrivateLibrary {
    dir: PathBuf,
    pub path: PathBuf,
}

impl Drop for PrivateLibrary {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Writes the injection library into a fresh directory (0755, the file 0644, both owned by
/// this process's user) on a filesystem that allows executable mappings, in a place every
/// user can reach when `others_must_reach` (the command runs as another user).
pub fn write(others_must_reach: bool) -> Result<PrivateLibrary> {
    let tmpdir = std::env::var_os("TMPDIR").map(PathBuf::from);
    let places = tmpdir.into_iter().chain(PLACES.iter().map(PathBuf::from));
    let mut refused = Vec::new();
    for place in places {
        match usable(&place, others_must_reach) {
            Ok(()) => return write_in(&place),
            Err(why) => refused.push(format!("{}: {why}", place.display())),
        }
    }
    Err(anyhow!(
        "no place to write the injection library: {}",
        refused.join("; ")
    ))
}

/// Why `place` will not do, if it will not.
fn usable(place: &Path, others_must_reach: bool) -> Result<(), String> {
    if !place.is_dir() {
        return Err("not a directory".into());
    }
    let c_path = CString::new(place.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: statvfs fills the struct for a NUL-terminated path.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    if stat.f_flag & libc::ST_NOEXEC != 0 {
        return Err("mounted noexec".into());
    }
    if others_must_reach {
        for dir in place.ancestors() {
            let mode = fs::metadata(dir)
                .map_err(|e| e.to_string())?
                .permissions()
                .mode();
            if mode & 0o001 == 0 {
                return Err(format!(
                    "{} is not searchable by other users",
                    dir.display()
                ));
            }
        }
    }
    Ok(())
}

fn write_in(place: &Path) -> Result<PrivateLibrary> {
    let template = place.join("cudatrace-gpu-XXXXXX");
    let mut bytes = CString::new(template.as_os_str().as_bytes())?.into_bytes_with_nul();
    // SAFETY: mkdtemp rewrites the Xs of a NUL-terminated template in place.
    let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
    if made.is_null() {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("creating a directory in {}", place.display()));
    }
    bytes.pop();
    let dir = PathBuf::from(std::ffi::OsStr::from_bytes(&bytes));
    // The guard exists from here: a failure below removes the directory too.
    let library = PrivateLibrary {
        path: dir.join(FILE_NAME),
        dir,
    };
    fs::set_permissions(&library.dir, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("opening {} to the traced user", library.dir.display()))?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&library.path)
        .with_context(|| format!("creating {}", library.path.display()))?;
    file.write_all(INJECTION_LIBRARY)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", library.path.display()))?;
    Ok(library)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_written_privately_and_removed_with_its_guard() {
        let library = write(true).unwrap();
        let dir = library.path.parent().unwrap().to_owned();
        assert_eq!(fs::read(&library.path).unwrap(), INJECTION_LIBRARY);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&dir), mode(&library.path)), (0o755, 0o644));
        assert!(
            dir.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("cudatrace-gpu-")
        );
        drop(library);
        assert!(!dir.exists());
    }

    #[test]
    fn unusable_places_are_said_why() {
        assert_eq!(
            usable(Path::new("/nonexistent-place"), false),
            Err("not a directory".into())
        );
        assert_eq!(usable(Path::new("/tmp"), true), Ok(()));
    }
}
