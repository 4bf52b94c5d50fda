//! A trace to read once or more (`summary` of a `--gpu` trace and `plot` read it twice,
//! `view` looks at its first line before exporting it). A regular file is read where it
//! is, each pass from its start; anything else (a pipe, a FIFO, `<(zcat t.jsonl.gz)`) can
//! be read only once, so it is first copied whole into an unnamed temporary file, and
//! every pass reads that copy: never a second pass that finds the input already consumed.

use std::{
    ffi::CString,
    fs::File,
    io::{self, Seek},
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::ffi::OsStrExt,
    },
    path::{Path, PathBuf},
};

/// A trace opened for reading, seekable.
pub struct TraceInput {
    file: File,
    /// Where it was read from.
    path: PathBuf,
    /// It was copied from a pipe or FIFO.
    copied: bool,
}

impl TraceInput {
    /// Opens `path`; what is not a regular file is copied first (its bytes, once).
    pub fn open(path: &Path) -> io::Result<TraceInput> {
        let mut file = File::open(path)?;
        if file.metadata()?.is_file() {
            return Ok(TraceInput {
                file,
                path: path.to_owned(),
                copied: false,
            });
        }
        let mut copy = unnamed_file()?;
        io::copy(&mut file, &mut copy)?;
        Ok(TraceInput {
            file: copy,
            path: path.to_owned(),
            copied: true,
        })
    }

    /// A path that opens the trace while this lives: the file's own, or the copy's
    /// (`/proc/self/fd/N`).
    pub fn path(&self) -> PathBuf {
        match self.copied {
            false => self.path.clone(),
            true => PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd())),
        }
    }

    /// The trace from its start, for one pass: a descriptor of its own (its own offset),
    /// so passes never share a position.
    pub fn pass(&self) -> io::Result<File> {
        let mut file = File::open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))?;
        file.rewind()?;
        Ok(file)
    }
}

/// Whether `path` is there but no regular file (a pipe, a FIFO): no name can be made
/// beside it for an output.
pub fn is_stream(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|metadata| !metadata.is_file())
}

/// A read-write file with no name: `O_TMPFILE` in the temporary folder, else a memfd. It
/// is gone when closed, and no path to it exists that anyone could redirect.
fn unnamed_file() -> io::Result<File> {
    let dir = CString::new(std::env::temp_dir().as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: open(2) on a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            dir.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: a fresh descriptor this function owns.
        return Ok(unsafe { File::from_raw_fd(fd) });
    }
    // A file system without O_TMPFILE: memory (swappable) instead.
    // SAFETY: memfd_create(2) with a NUL-terminated name.
    let fd = unsafe { libc::memfd_create(c"cudatrace-trace".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn a_pipe_is_read_whole_by_every_pass() {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills the array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors, each owned once.
        let (read, mut write) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let writer = std::thread::spawn(move || {
            write.write_all(b"one\ntwo\n").unwrap();
        });
        let input =
            TraceInput::open(Path::new(&format!("/proc/self/fd/{}", read.as_raw_fd()))).unwrap();
        writer.join().unwrap();
        assert!(input.copied);
        for _ in 0..2 {
            let mut text = String::new();
            input.pass().unwrap().read_to_string(&mut text).unwrap();
            assert_eq!(text, "one\ntwo\n");
        }
    }
}
