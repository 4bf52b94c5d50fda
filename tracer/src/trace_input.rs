//! A trace to read once or more (`summary` of a `--gpu` trace and `plot` read it twice,
//! `view` looks at its first line before exporting it). A regular file is read where it
//! is, each pass from its start; a pipe or FIFO named on the command line (`/dev/stdin`,
//! `<(zcat t.jsonl.gz)`) can be read only once, so it is first copied into an unnamed
//! temporary file, at most [`MAX_SPOOL_BYTES`] of it (less where the temporary folder
//! has less room), and every pass reads that copy: never a second pass that finds the
//! input already consumed. Anything else (`/dev/zero`, a terminal, a folder) is refused.
//!
//! [`TraceInput::open_trace`] is every JSONL reader's way in: the first line must be a
//! cudatrace header of a version this cudatrace reads ([`check_header`]), checked before
//! anything else is read; an empty file is a trace with nothing in it.

use std::{
    ffi::CString,
    fs::File,
    io::{self, BufRead, BufReader, Read, Seek, Write},
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::{ffi::OsStrExt, fs::FileTypeExt},
    },
    path::{Path, PathBuf},
};

use crate::{
    exit::{ExitCode, Failure},
    reader::MAX_LINE_BYTES,
    schema::check_header,
};

/// The most of a pipe's trace copied to be read (a larger one is given as a file).
pub const MAX_SPOOL_BYTES: u64 = 16 << 30;
/// Left free in the temporary folder by a copy.
const SPOOL_RESERVE_BYTES: u64 = 1 << 30;

/// Why a trace cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot open the trace {label}: {error}")]
    Io { label: String, error: io::Error },
    /// A character or block device, a socket, a folder: no trace.
    #[error(
        "{label} is {kind}, not a trace: a trace is a regular file, or a pipe named on the \
         command line"
    )]
    NotAFile { label: String, kind: &'static str },
    /// A pipe whose copy would pass the limit.
    #[error(
        "{label}: a pipe's trace is copied to be read, and this one passed {limit} without \
         ending ({why}): give the trace as a file"
    )]
    SpoolFull {
        label: String,
        limit: String,
        why: String,
    },
    /// Its first line is not a header this cudatrace reads.
    #[error("{label}:1: not a trace this cudatrace reads: {message}")]
    NotATrace { label: String, message: String },
}

impl From<OpenError> for Failure {
    fn from(error: OpenError) -> Failure {
        let code = match error {
            OpenError::Io { .. } | OpenError::NotAFile { .. } | OpenError::SpoolFull { .. } => {
                ExitCode::InputUnreadable
            }
            OpenError::NotATrace { .. } => ExitCode::BadInput,
        };
        Failure::new(code, error)
    }
}

/// A trace opened for reading, seekable.
pub struct TraceInput {
    file: File,
    /// Where it was read from.
    path: PathBuf,
    /// It was copied from a pipe or FIFO.
    copied: bool,
    /// It holds no byte (a tracer that wrote nothing).
    empty: bool,
}

/// What a path opened is.
enum Kind {
    File,
    Stream,
}

/// A regular file, a stream (pipe, FIFO) or, as a refusal, what else it is.
fn kind(file: &File, label: &str) -> Result<Kind, OpenError> {
    let file_type = file
        .metadata()
        .map_err(|error| OpenError::Io {
            label: label.to_owned(),
            error,
        })?
        .file_type();
    let refused = |kind| {
        Err(OpenError::NotAFile {
            label: label.to_owned(),
            kind,
        })
    };
    match () {
        () if file_type.is_file() => Ok(Kind::File),
        () if file_type.is_fifo() => Ok(Kind::Stream),
        () if file_type.is_dir() => refused("a folder"),
        () if file_type.is_char_device() => refused("a character device"),
        () if file_type.is_block_device() => refused("a block device"),
        () if file_type.is_socket() => refused("a socket"),
        () => refused("no regular file"),
    }
}

/// Whether `path` is a regular file (following links), else what it is: a `--job`
/// folder's traces are regular files only (a FIFO there would wait for a writer).
pub fn regular_file(path: &Path) -> Result<(), OpenError> {
    let label = path.display().to_string();
    let file_type = std::fs::metadata(path)
        .map_err(|error| OpenError::Io {
            label: label.clone(),
            error,
        })?
        .file_type();
    let kind = match () {
        () if file_type.is_file() => return Ok(()),
        () if file_type.is_fifo() => "a FIFO",
        () if file_type.is_dir() => "a folder",
        () if file_type.is_char_device() => "a character device",
        () if file_type.is_block_device() => "a block device",
        () if file_type.is_socket() => "a socket",
        () => "no regular file",
    };
    Err(OpenError::NotAFile { label, kind })
}

impl TraceInput {
    /// Opens `path`: a regular file where it is, a pipe or FIFO copied first (its bytes,
    /// once, up to the limit); anything else is refused.
    pub fn open(path: &Path) -> Result<TraceInput, OpenError> {
        TraceInput::opened(path, false)
    }

    /// As [`open`](TraceInput::open), a JSONL trace: its first line is checked
    /// ([`check_header`]) before the rest is read (or copied).
    pub fn open_trace(path: &Path) -> Result<TraceInput, OpenError> {
        TraceInput::opened(path, true)
    }

    fn opened(path: &Path, check: bool) -> Result<TraceInput, OpenError> {
        let label = path.display().to_string();
        let io = |error| OpenError::Io {
            label: label.clone(),
            error,
        };
        let file = File::open(path).map_err(io)?;
        match kind(&file, &label)? {
            Kind::File => {
                let mut reader = BufReader::new(&file);
                let first = match check {
                    true => first_line(&mut reader, &label)?,
                    false => None,
                };
                let empty = match check {
                    true => first.is_none(),
                    false => file.metadata().map_err(io)?.len() == 0,
                };
                Ok(TraceInput {
                    file,
                    path: path.to_owned(),
                    copied: false,
                    empty,
                })
            }
            Kind::Stream => {
                let mut reader = BufReader::new(file);
                let mut copy = unnamed_file().map_err(io)?;
                let limit = spool_limit();
                let first = match check {
                    true => first_line(&mut reader, &label)?,
                    false => None,
                };
                let written = match &first {
                    Some(line) => {
                        copy.write_all(line).map_err(io)?;
                        line.len() as u64
                    }
                    None => 0,
                };
                spool(&mut reader, &mut copy, limit.bytes.saturating_sub(written))
                    .map_err(io)?
                    .ok_or_else(|| OpenError::SpoolFull {
                        label: label.clone(),
                        limit: format!("{} MiB", limit.bytes >> 20),
                        why: limit.why.clone(),
                    })?;
                let empty = match check {
                    true => first.is_none(),
                    false => copy.metadata().map_err(io)?.len() == 0,
                };
                Ok(TraceInput {
                    file: copy,
                    path: path.to_owned(),
                    copied: true,
                    empty,
                })
            }
        }
    }

    /// Whether the trace holds nothing: no byte, or a header cut short (the tracer wrote
    /// nothing, or was killed first). [`empty_note`] says so.
    pub fn is_empty(&self) -> bool {
        self.empty
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

/// The first line of a trace, checked, with its newline (if it has one); `None` for an
/// empty trace or one cut while its header was written (nothing else in it).
fn first_line(reader: &mut impl BufRead, label: &str) -> Result<Option<Vec<u8>>, OpenError> {
    let not_a_trace = |message: String| OpenError::NotATrace {
        label: label.to_owned(),
        message,
    };
    let mut line = Vec::new();
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                return Err(OpenError::Io {
                    label: label.to_owned(),
                    error,
                });
            }
        };
        if available.is_empty() {
            break;
        }
        // Not even the start of a JSON object (`/dev/zero` behind a pipe): at once.
        if line.is_empty() && available[0] != b'{' {
            return Err(not_a_trace(
                "its first line is not a cudatrace header (it does not start with `{`)".into(),
            ));
        }
        let (chunk, done) = match memchr::memchr(b'\n', available) {
            Some(at) => (&available[..=at], true),
            None => (available, false),
        };
        if line.len() + chunk.len() > MAX_LINE_BYTES {
            return Err(not_a_trace(format!(
                "its first line is longer than {} MiB: no header",
                MAX_LINE_BYTES >> 20
            )));
        }
        line.extend_from_slice(chunk);
        let used = chunk.len();
        reader.consume(used);
        if done {
            break;
        }
    }
    if line.is_empty() {
        return Ok(None);
    }
    let ended = line.last() == Some(&b'\n');
    match check_header(line.trim_ascii_end()) {
        Ok(_) => Ok(Some(line)),
        // Killed while writing its header: a trace with nothing.
        Err(_) if !ended && line.starts_with(br#"{"type":"header""#) => Ok(None),
        Err(message) => Err(not_a_trace(message)),
    }
}

/// What the readers say of a trace that [`is_empty`](TraceInput::is_empty).
pub fn empty_note(label: &str) -> String {
    format!(
        "{label} is empty (its tracer wrote nothing, or was killed before its header was whole)"
    )
}

/// How much of a pipe may be copied, and why that much.
struct SpoolLimit {
    bytes: u64,
    why: String,
}

/// [`MAX_SPOOL_BYTES`], or the temporary folder's room less [`SPOOL_RESERVE_BYTES`]
/// where that is less: never a full disk.
fn spool_limit() -> SpoolLimit {
    let dir = std::env::temp_dir();
    let room = CString::new(dir.as_os_str().as_bytes())
        .ok()
        .and_then(|path| {
            let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: statvfs(3) on a NUL-terminated path, into a struct of its own.
            (unsafe { libc::statvfs(path.as_ptr(), &mut stats) } == 0)
                .then(|| stats.f_bavail.saturating_mul(stats.f_frsize))
        });
    match room.map(|room| room.saturating_sub(SPOOL_RESERVE_BYTES)) {
        Some(left) if left < MAX_SPOOL_BYTES => SpoolLimit {
            bytes: left,
            why: format!(
                "the room left in the temporary folder {}, less 1 GiB; TMPDIR names another",
                dir.display()
            ),
        },
        _ => SpoolLimit {
            bytes: MAX_SPOOL_BYTES,
            why: format!(
                "cudatrace copies {} GiB of a pipe at most",
                MAX_SPOOL_BYTES >> 30
            ),
        },
    }
}

/// Copies `reader` into `copy`, `max` bytes at most: `None` when more was left.
fn spool(reader: &mut impl BufRead, copy: &mut File, max: u64) -> io::Result<Option<u64>> {
    let copied = io::copy(&mut reader.by_ref().take(max), copy)?;
    if copied == max && !reader.fill_buf()?.is_empty() {
        return Ok(None);
    }
    Ok(Some(copied))
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

    #[test]
    fn a_copy_stops_at_its_limit() {
        let mut copy = unnamed_file().unwrap();
        assert_eq!(
            spool(&mut &b"0123456789"[..], &mut copy, 10).unwrap(),
            Some(10)
        );
        assert_eq!(
            spool(&mut &b"0123456789"[..], &mut copy, 20).unwrap(),
            Some(10)
        );
        assert_eq!(spool(&mut &b"0123456789"[..], &mut copy, 9).unwrap(), None);
        assert!(spool_limit().bytes <= MAX_SPOOL_BYTES);
    }

    #[test]
    fn the_first_line_is_a_header_or_nothing() {
        let header = b"{\"type\":\"header\",\"format\":\"cudatrace\",\"version\":4}\n";
        let mut text = &[&header[..], b"rest"].concat()[..];
        assert_eq!(first_line(&mut text, "t").unwrap().unwrap(), header);
        assert_eq!(text, b"rest");
        assert_eq!(first_line(&mut &b""[..], "t").unwrap(), None);
        // Killed while writing the header: nothing in it.
        assert_eq!(first_line(&mut &header[..20], "t").unwrap(), None);
        let refused = |text: &[u8]| first_line(&mut &text[..], "t").unwrap_err().to_string();
        assert_eq!(
            refused(&[0; 4096]),
            "t:1: not a trace this cudatrace reads: its first line is not a cudatrace header \
             (it does not start with `{`)"
        );
        assert_eq!(
            refused(b"{\"type\":\"call\"}\n"),
            "t:1: not a trace this cudatrace reads: its first line is not a cudatrace header"
        );
    }
}
