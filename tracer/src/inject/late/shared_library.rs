//! The injection library's file for attaching: unlike `run --gpu`'s (a private folder
//! removed at the end of the run), a process keeps the library it loaded for the rest of
//! its life, and a later attach must find the same file (its `dlopen` then returns the
//! library already there, and the uprobe sits on the same file). So the file stays, named
//! by its contents, in a folder of cudatrace's own that only its user can write: created
//! 0755, checked (not a link, owned by this user, no one else can write it) before use,
//! the file 0644, written under a temporary name and renamed into place.

use std::{
    fs::{self, OpenOptions},
    io::Write,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow};

use crate::inject::private_dir::INJECTION_LIBRARY;

/// Folders tried, in order.
const PLACES: [&str; 2] = ["/run/cudatrace", "/var/lib/cudatrace"];

/// The library's file, written if missing.
pub fn ensure() -> Result<PathBuf> {
    ensure_in(&PLACES.map(PathBuf::from), INJECTION_LIBRARY)
}

fn ensure_in(places: &[PathBuf], bytes: &[u8]) -> Result<PathBuf> {
    let mut refused = Vec::new();
    for place in places {
        match folder(place).and_then(|()| file_in(place, bytes)) {
            Ok(path) => return Ok(path),
            Err(e) => refused.push(format!("{}: {e:#}", place.display())),
        }
    }
    Err(anyhow!(
        "no place to keep the injection library: {}",
        refused.join("; ")
    ))
}

/// The file name: the contents' FNV-1a hash, so another build's library never takes its
/// place.
pub fn file_name(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("libcudatrace_inject-{hash:016x}.so")
}

/// Creates the folder (and its parent, if missing) and checks that only this user can
/// change it.
fn folder(place: &Path) -> Result<()> {
    if let Some(parent) = place.parent()
        && !parent.exists()
    {
        return Err(anyhow!("{} does not exist", parent.display()));
    }
    match fs::DirBuilder::new().mode(0o755).create(place) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).context("creating it"),
    }
    let meta = fs::symlink_metadata(place).context("reading it")?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() {
        return Err(anyhow!("not a directory (a link?)"));
    }
    if meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(anyhow!(
            "owned by uid {} with mode {:o}: another user could change it",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

fn file_in(place: &Path, bytes: &[u8]) -> Result<PathBuf> {
    let path = place.join(file_name(bytes));
    if let Ok(meta) = fs::symlink_metadata(&path) {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if meta.is_file()
            && meta.uid() == me
            && meta.mode() & 0o022 == 0
            && fs::read(&path).is_ok_and(|have| have == bytes)
        {
            return Ok(path);
        }
    }
    let temporary = place.join(format!(".{}.{}", file_name(bytes), std::process::id()));
    let _ = fs::remove_file(&temporary);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&temporary)
        .with_context(|| format!("creating {}", temporary.display()))?;
    file.set_permissions(fs::Permissions::from_mode(0o644))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", temporary.display()))?;
    fs::rename(&temporary, &path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_is_kept_once_by_its_contents_and_a_writable_folder_is_refused() {
        let base = std::env::temp_dir().join(format!("cudatrace-shared-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        let place = base.join("kept");
        let path = ensure_in(std::slice::from_ref(&place), b"one").unwrap();
        assert_eq!(path, place.join(file_name(b"one")));
        assert_eq!(fs::read(&path).unwrap(), b"one");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&place), mode(&path)), (0o755, 0o644));
        // The same contents: the same file, not written again.
        let inode = fs::metadata(&path).unwrap().ino();
        assert_eq!(
            ensure_in(std::slice::from_ref(&place), b"one").unwrap(),
            path
        );
        assert_eq!(fs::metadata(&path).unwrap().ino(), inode);
        assert_ne!(file_name(b"one"), file_name(b"two"));
        // A folder others can write, or a link, is refused.
        let open = base.join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let error = ensure_in(std::slice::from_ref(&open), b"one").unwrap_err();
        assert!(
            format!("{error:#}").contains("another user could change it"),
            "{error:#}"
        );
        let link = base.join("link");
        std::os::unix::fs::symlink(&place, &link).unwrap();
        let error = ensure_in(std::slice::from_ref(&link), b"one").unwrap_err();
        assert!(
            format!("{error:#}").contains("not a directory"),
            "{error:#}"
        );
        fs::remove_dir_all(&base).unwrap();
    }
}
