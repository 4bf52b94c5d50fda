//! Files cudatrace writes (traces, exports, plots), opened so that root writes nothing it
//! should not:
//!
//! - **as the invoking user** under sudo: the open runs with their filesystem identity
//!   (`setfsuid`/`setfsgid` and their groups, on this thread alone), so their permissions
//!   decide where a file may be created or overwritten, and a file or folder created is
//!   theirs from the start (no `chown` by path afterwards);
//! - **never through a symbolic link** as the last component (a link planted in a sticky
//!   `/tmp` is refused, not followed), and never over what is not a regular file, but
//!   `/dev/null`;
//! - **never over an input** of the same command (`-o` naming `--libcuda`'s file, the
//!   trace being exported), compared by device and inode;
//! - **locked** (`flock`) before it is truncated: a second writer of the same file refuses.
//!
//! A reader's one output (an export, a profile, a plot, a merge) is an [`Output`]: `-` is
//! standard output, and a file is written under a temporary name beside it and renamed
//! into place only once whole, so a failed or interrupted run leaves what was there before.

use std::{
    ffi::CString,
    fs::File,
    io::{self, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{
            ffi::OsStrExt,
            fs::{FileTypeExt, MetadataExt, PermissionsExt},
        },
    },
    path::{Path, PathBuf},
};

use crate::privileges::TargetUser;

/// Why an output file was not opened.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(
        "{0} is a symbolic link: cudatrace does not write through one (pass the path it \
         points to)"
    )]
    Symlink(PathBuf),
    #[error("{0} is not a regular file: refusing to write over it")]
    NotRegular(PathBuf),
    #[error("{path} is {what}: refusing to overwrite an input")]
    IsInput { path: PathBuf, what: String },
    #[error(
        "{path} belongs to another user (uid {owner}): the trace does not go into a folder \
         someone else controls (pass -o)"
    )]
    ForeignFolder { path: PathBuf, owner: u32 },
    #[error(
        "{0} is being written by another process (another cudatrace with the same output?): \
         refusing to write it too"
    )]
    Locked(PathBuf),
    // The OS error is the source: `{:#}` prints it once, after this.
    #[error("cannot write {path}{who}")]
    Io {
        path: PathBuf,
        /// ` as USER` under sudo.
        who: String,
        source: io::Error,
    },
}

/// A file an output must not overwrite: what it is (for the message) and its identity.
#[derive(Clone, Debug)]
pub struct Input {
    pub what: String,
    device: u64,
    inode: u64,
}

impl Input {
    /// `path`'s file (through links), if it exists.
    pub fn of(what: impl Into<String>, path: &Path) -> Option<Input> {
        let metadata = std::fs::metadata(path).ok()?;
        Some(Input {
            what: what.into(),
            device: metadata.dev(),
            inode: metadata.ino(),
        })
    }

    /// An open file's identity.
    pub fn of_file(what: impl Into<String>, file: &File) -> Option<Input> {
        let metadata = file.metadata().ok()?;
        Some(Input {
            what: what.into(),
            device: metadata.dev(),
            inode: metadata.ino(),
        })
    }
}

/// Who writes: the invoking user under sudo (`None`: this process's own identity).
#[derive(Clone, Copy, Debug, Default)]
pub struct Writer<'a> {
    pub user: Option<&'a TargetUser>,
}

impl Writer<'_> {
    fn who(&self) -> String {
        self.user
            .map_or_else(String::new, |user| format!(" as {}", user.name))
    }

    fn io(&self, path: &Path, source: io::Error) -> OutputError {
        OutputError::Io {
            path: path.to_owned(),
            who: self.who(),
            source,
        }
    }

    /// Opens `path` for writing (mode 0644 when created), by the rules above; an existing
    /// file is truncated once it is locked and known to be no input.
    pub fn create(&self, path: &Path, inputs: &[Input]) -> Result<File, OutputError> {
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| self.io(path, io::ErrorKind::InvalidInput.into()))?;
        let opened = as_user(self.user, || open_output(&c_path))
            .and_then(|opened| opened)
            .map_err(|e| self.io(path, e))?
            .map_err(|refusal| refusal.error(path))?;
        let Opened { file, created } = opened;
        let metadata = file.metadata().map_err(|e| self.io(path, e))?;
        if metadata.file_type().is_char_device() {
            // /dev/null: nothing to lock or truncate.
            return Ok(file);
        }
        if let Some(input) = inputs
            .iter()
            .find(|input| (input.device, input.inode) == (metadata.dev(), metadata.ino()))
        {
            return Err(OutputError::IsInput {
                path: path.to_owned(),
                what: input.what.clone(),
            });
        }
        // SAFETY: flock(2) on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            return Err(match error.raw_os_error() {
                Some(libc::EWOULDBLOCK) => OutputError::Locked(path.to_owned()),
                _ => self.io(path, error),
            });
        }
        if !created {
            file.set_len(0).map_err(|e| self.io(path, e))?;
        }
        Ok(file)
    }

    /// Holds `dir` (a folder) for this process alone until the result is dropped: a second
    /// writer of the same folder is refused, as for a file.
    pub fn lock_dir(&self, dir: &Path) -> Result<File, OutputError> {
        let folder = File::open(dir).map_err(|e| self.io(dir, e))?;
        // SAFETY: flock(2) on a descriptor this function owns.
        if unsafe { libc::flock(folder.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            return Err(match error.raw_os_error() {
                Some(libc::EWOULDBLOCK) => OutputError::Locked(dir.to_owned()),
                _ => self.io(dir, error),
            });
        }
        Ok(folder)
    }

    /// Creates the folder `path` (mode 0755) if it is not there; an existing one must be a
    /// folder, not a link to one.
    pub fn create_dir(&self, path: &Path) -> Result<(), OutputError> {
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| self.io(path, io::ErrorKind::InvalidInput.into()))?;
        let made = as_user(self.user, || {
            // SAFETY: mkdir(2) on a NUL-terminated path.
            if unsafe { libc::mkdir(c_path.as_ptr(), 0o755) } == 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EEXIST) {
                return Err(error);
            }
            Ok(())
        })
        .map_err(|e| self.io(path, e))?;
        made.map_err(|e| self.io(path, e))?;
        let metadata = std::fs::symlink_metadata(path).map_err(|e| self.io(path, e))?;
        if metadata.file_type().is_symlink() {
            return Err(OutputError::Symlink(path.to_owned()));
        }
        if !metadata.is_dir() {
            return Err(self.io(path, io::Error::from_raw_os_error(libc::ENOTDIR)));
        }
        // A folder someone else made where the user runs (a shared /tmp) is theirs to read
        // and empty: the trace does not go there.
        if let Some(user) = self.user
            && metadata.uid() != user.uid
            && metadata.uid() != 0
        {
            return Err(OutputError::ForeignFolder {
                path: path.to_owned(),
                owner: metadata.uid(),
            });
        }
        Ok(())
    }
}

/// A reader's one output: standard output, or a file written under a temporary name and
/// renamed into place by [`Output::commit`].
pub enum Output<'a> {
    Stdout(io::StdoutLock<'static>),
    File(Replacement<'a>),
}

impl Output<'_> {
    /// `path` as the user should read it in a message: `stdout` for `-`.
    pub fn describe(path: &Path) -> String {
        if is_stdout(path) {
            "stdout".to_owned()
        } else {
            path.display().to_string()
        }
    }

    /// Flushes what was written and puts the file in place.
    pub fn commit(self) -> Result<(), OutputError> {
        match self {
            Output::Stdout(mut out) => out.flush().map_err(|source| OutputError::Io {
                path: PathBuf::from("stdout"),
                who: String::new(),
                source,
            }),
            Output::File(replacement) => replacement.commit(),
        }
    }
}

impl Write for Output<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Output::Stdout(out) => out.write(buf),
            Output::File(replacement) => replacement.file.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Output::Stdout(out) => out.write_all(buf),
            Output::File(replacement) => replacement.file.write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::Stdout(out) => out.flush(),
            Output::File(replacement) => replacement.file.flush(),
        }
    }
}

/// `-`: standard output.
pub fn is_stdout(path: &Path) -> bool {
    path == Path::new("-")
}

/// A file being written under a temporary name beside `path` (`.NAME.cudatrace-PID.tmp`,
/// made as the writer), renamed over `path` by [`Replacement::commit`]; dropped before
/// that, the temporary file is removed and `path` is as it was. `/dev/null` is written
/// directly.
pub struct Replacement<'a> {
    file: File,
    /// `None` for /dev/null.
    temp: Option<PathBuf>,
    path: PathBuf,
    writer: Writer<'a>,
}

impl Replacement<'_> {
    /// A second descriptor of the file being written, for a writer that wants a `File`.
    pub fn file(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// Puts the file in place (renamed over `path`).
    pub fn commit(mut self) -> Result<(), OutputError> {
        let Some(temp) = self.temp.take() else {
            return Ok(());
        };
        let renamed = as_user(self.writer.user, || std::fs::rename(&temp, &self.path))
            .and_then(|renamed| renamed);
        if let Err(e) = renamed {
            let _ = as_user(self.writer.user, || std::fs::remove_file(&temp));
            return Err(self.writer.io(&self.path, e));
        }
        Ok(())
    }
}

impl Drop for Replacement<'_> {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = as_user(self.writer.user, || std::fs::remove_file(&temp));
        }
    }
}

impl<'a> Writer<'a> {
    /// A reader's one output at `path` (`-`: standard output), by the rules above: a link,
    /// a FIFO, a device but /dev/null, or an input at `path` is refused and left alone.
    pub fn output(&self, path: &Path, inputs: &[Input]) -> Result<Output<'a>, OutputError> {
        if is_stdout(path) {
            return Ok(Output::Stdout(io::stdout().lock()));
        }
        self.replacement(path, inputs).map(Output::File)
    }

    /// Writes `bytes` as the whole output at `path`.
    pub fn write_output(
        &self,
        path: &Path,
        inputs: &[Input],
        bytes: &[u8],
    ) -> Result<(), OutputError> {
        let mut output = self.output(path, inputs)?;
        output.write_all(bytes).map_err(|e| self.io(path, e))?;
        output.commit()
    }

    /// A file at `path` written under a temporary name: refused as [`Writer::output`] is.
    pub fn replacement(
        &self,
        path: &Path,
        inputs: &[Input],
    ) -> Result<Replacement<'a>, OutputError> {
        let mut mode = None;
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(self.io(path, e)),
            Ok(metadata) if metadata.file_type().is_symlink() => {
                return Err(OutputError::Symlink(path.to_owned()));
            }
            Ok(metadata)
                if metadata.file_type().is_char_device()
                    && metadata.rdev() == libc::makedev(1, 3) =>
            {
                let file = self.create(path, inputs)?;
                return Ok(Replacement {
                    file,
                    temp: None,
                    path: path.to_owned(),
                    writer: *self,
                });
            }
            Ok(metadata) if !metadata.is_file() => {
                return Err(OutputError::NotRegular(path.to_owned()));
            }
            Ok(metadata) => {
                if let Some(input) = inputs
                    .iter()
                    .find(|input| (input.device, input.inode) == (metadata.dev(), metadata.ino()))
                {
                    return Err(OutputError::IsInput {
                        path: path.to_owned(),
                        what: input.what.clone(),
                    });
                }
                mode = Some(metadata.mode() & 0o7777);
            }
        }
        let name = path
            .file_name()
            .ok_or_else(|| self.io(path, io::ErrorKind::InvalidInput.into()))?;
        let temp = path.with_file_name(format!(
            ".{}.cudatrace-{}.tmp",
            name.to_string_lossy(),
            std::process::id()
        ));
        let c_temp = CString::new(temp.as_os_str().as_bytes())
            .map_err(|_| self.io(path, io::ErrorKind::InvalidInput.into()))?;
        let file = as_user(self.user, || {
            let mut opened = create_new(&c_temp);
            if opened
                .as_ref()
                .is_err_and(|e| e.kind() == io::ErrorKind::AlreadyExists)
            {
                // Left by a killed run that had this pid: ours to take over.
                std::fs::remove_file(&temp)?;
                opened = create_new(&c_temp);
            }
            let file = opened?;
            if let Some(mode) = mode {
                file.set_permissions(std::fs::Permissions::from_mode(mode))?;
            }
            Ok(file)
        })
        .and_then(|file| file)
        .map_err(|e| self.io(path, e))?;
        Ok(Replacement {
            file,
            temp: Some(temp),
            path: path.to_owned(),
            writer: *self,
        })
    }
}

/// A new file (mode 0644 less the umask), never through a link, never an existing one.
fn create_new(path: &CString) -> io::Result<File> {
    // SAFETY: open(2) on a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o644 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// An output opened, and whether this open created it.
struct Opened {
    file: File,
    created: bool,
}

/// What [`open_output`] refused.
enum Refusal {
    Symlink,
    NotRegular,
}

impl Refusal {
    fn error(self, path: &Path) -> OutputError {
        match self {
            Refusal::Symlink => OutputError::Symlink(path.to_owned()),
            Refusal::NotRegular => OutputError::NotRegular(path.to_owned()),
        }
    }
}

/// /dev/null's device number (major 1, minor 3).
fn is_dev_null(metadata: &libc::stat) -> bool {
    metadata.st_mode & libc::S_IFMT == libc::S_IFCHR && metadata.st_rdev == libc::makedev(1, 3)
}

/// Creates `path`, or opens the regular file (or /dev/null) already there, never
/// following a link as its last component. An existing file is looked at through an
/// `O_PATH` descriptor first, so no device or FIFO is ever opened for writing.
fn open_output(path: &CString) -> io::Result<Result<Opened, Refusal>> {
    let write = libc::O_WRONLY | libc::O_CLOEXEC;
    // SAFETY: open(2) on a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            write | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o644 as libc::c_uint,
        )
    };
    if fd >= 0 {
        // SAFETY: a fresh descriptor this function owns.
        let file = unsafe { File::from_raw_fd(fd) };
        return Ok(Ok(Opened {
            file,
            created: true,
        }));
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() != Some(libc::EEXIST) {
        return Err(error);
    }
    // SAFETY: as above.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    let handle = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fstat(2) fills the struct.
    let mut metadata: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(handle.as_raw_fd(), &mut metadata) } != 0 {
        return Err(io::Error::last_os_error());
    }
    match metadata.st_mode & libc::S_IFMT {
        libc::S_IFLNK => return Ok(Err(Refusal::Symlink)),
        libc::S_IFREG => {}
        _ if is_dev_null(&metadata) => {}
        _ => return Ok(Err(Refusal::NotRegular)),
    }
    // The same file reopened for writing: permissions are checked again, for this identity.
    let reopen =
        CString::new(format!("/proc/self/fd/{}", handle.as_raw_fd())).expect("no NUL in a number");
    // SAFETY: as above.
    let fd = unsafe { libc::open(reopen.as_ptr(), write) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor this function owns.
    let file = unsafe { File::from_raw_fd(fd) };
    Ok(Ok(Opened {
        file,
        created: false,
    }))
}

/// Runs `f` with `user`'s filesystem identity (uid, gid, groups) on this thread alone, then
/// goes back to this process's own. The raw system calls change this thread only (glibc's
/// `setgroups` would change every thread). `None`: `f` runs as is.
pub fn as_user<T>(user: Option<&TargetUser>, f: impl FnOnce() -> T) -> io::Result<T> {
    let Some(user) = user else { return Ok(f()) };
    // SAFETY: getgroups(2) with room for what it reports; geteuid/getegid cannot fail.
    let (own_uid, own_gid, own_groups) = unsafe {
        let count = libc::getgroups(0, std::ptr::null_mut());
        let mut groups = vec![0 as libc::gid_t; count.max(0) as usize];
        let count = libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr());
        if count < 0 {
            return Err(io::Error::last_os_error());
        }
        groups.truncate(count as usize);
        (libc::geteuid(), libc::getegid(), groups)
    };
    set_groups(&user.groups)?;
    // SAFETY: setfsgid/setfsuid(2) change this thread's filesystem ids; they return the
    // previous id whatever happens, so success is checked by asking again.
    unsafe {
        libc::setfsgid(user.gid);
        libc::setfsuid(user.uid);
    }
    let switched = fs_ids() == (user.uid, user.gid);
    let result = switched.then(f);
    // SAFETY: as above; back to this process's own ids (which restores root's filesystem
    // capabilities, cleared while the filesystem uid was not 0).
    unsafe {
        libc::setfsuid(own_uid);
        libc::setfsgid(own_gid);
    }
    let restored = set_groups(&own_groups).is_ok() && fs_ids() == (own_uid, own_gid);
    // Going on with another identity than our own would be worse than stopping.
    assert!(
        restored,
        "cannot restore cudatrace's own filesystem identity"
    );
    result.ok_or_else(|| io::Error::other(format!("cannot take the identity of {}", user.name)))
}

/// This thread's filesystem uid and gid (an invalid id changes nothing and returns them).
fn fs_ids() -> (u32, u32) {
    // SAFETY: setfsuid/setfsgid(2) with -1 only report the current ids.
    unsafe {
        (
            libc::setfsuid(u32::MAX) as u32,
            libc::setfsgid(u32::MAX) as u32,
        )
    }
}

/// setgroups(2) for this thread alone.
fn set_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: the raw system call with a valid array and its length.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cudatrace-out-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_new_file_is_created_and_an_old_one_truncated() {
        let dir = scratch("new");
        let path = dir.join("t.jsonl");
        let writer = Writer::default();
        std::io::Write::write_all(&mut writer.create(&path, &[]).unwrap(), b"first").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        drop(writer.create(&path, &[]).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn links_fifos_and_inputs_are_refused_and_left_as_they_were() {
        let dir = scratch("refused");
        let target = dir.join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.join("link.jsonl");
        symlink(&target, &link).unwrap();
        let writer = Writer::default();
        assert!(matches!(
            writer.create(&link, &[]),
            Err(OutputError::Symlink(_))
        ));
        let dangling = dir.join("dangling.jsonl");
        symlink(dir.join("nothing"), &dangling).unwrap();
        assert!(matches!(
            writer.create(&dangling, &[]),
            Err(OutputError::Symlink(_))
        ));
        assert!(!dir.join("nothing").exists());
        let fifo = dir.join("fifo");
        let c_fifo = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            writer.create(&fifo, &[]),
            Err(OutputError::NotRegular(_))
        ));
        let input = Input::of("the --libcuda library", &target).unwrap();
        match writer.create(&target, &[input]) {
            Err(OutputError::IsInput { what, .. }) => assert_eq!(what, "the --libcuda library"),
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        // /dev/null is taken as it is.
        writer.create(Path::new("/dev/null"), &[]).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_output_replaces_the_old_file_only_when_committed() {
        let dir = scratch("replace");
        let path = dir.join("t.json");
        std::fs::write(&path, b"old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let writer = Writer::default();
        let mut failed = writer.output(&path, &[]).unwrap();
        failed.write_all(b"half").unwrap();
        drop(failed);
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        let names = |dir: &Path| -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        };
        assert_eq!(names(&dir), ["t.json"], "no temporary file is left");
        let mut done = writer.output(&path, &[]).unwrap();
        done.write_all(b"new").unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"old",
            "in place only at commit"
        );
        done.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o600, "the replaced file's mode is kept");
        assert_eq!(names(&dir), ["t.json"]);
        let fresh = dir.join("fresh.json");
        let mut created = writer.output(&fresh, &[]).unwrap();
        created.write_all(b"x").unwrap();
        created.commit().unwrap();
        assert_eq!(std::fs::read(&fresh).unwrap(), b"x");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_output_refuses_links_fifos_and_inputs_and_takes_dev_null() {
        let dir = scratch("output-refused");
        let target = dir.join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.join("link.json");
        symlink(&target, &link).unwrap();
        let writer = Writer::default();
        assert!(matches!(
            writer.output(&link, &[]),
            Err(OutputError::Symlink(_))
        ));
        let fifo = dir.join("fifo");
        let c_fifo = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo(3) on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
        assert!(matches!(
            writer.output(&fifo, &[]),
            Err(OutputError::NotRegular(_))
        ));
        let input = Input::of("the trace being exported", &target).unwrap();
        assert!(matches!(
            writer.output(&target, &[input]),
            Err(OutputError::IsInput { .. })
        ));
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let mut null = writer.output(Path::new("/dev/null"), &[]).unwrap();
        null.write_all(b"gone").unwrap();
        null.commit().unwrap();
        assert!(matches!(
            writer.output(Path::new("-"), &[]),
            Ok(Output::Stdout(_))
        ));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_os_error_is_said_once() {
        let error = Writer::default()
            .output(Path::new("/nonexistent-cudatrace/t.json"), &[])
            .err()
            .unwrap();
        assert_eq!(
            format!("{:#}", anyhow::Error::from(error)),
            "cannot write /nonexistent-cudatrace/t.json: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_second_writer_of_one_file_is_refused() {
        let dir = scratch("locked");
        let path = dir.join("t.jsonl");
        let writer = Writer::default();
        let mut first = writer.create(&path, &[]).unwrap();
        std::io::Write::write_all(&mut first, b"first").unwrap();
        assert!(matches!(
            writer.create(&path, &[]),
            Err(OutputError::Locked(_))
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        drop(first);
        drop(writer.create(&path, &[]).unwrap());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
