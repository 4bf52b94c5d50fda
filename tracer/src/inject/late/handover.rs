//! Handing the library over, once the thread runs the trampoline: it makes two anonymous
//! files (`memfd_create`) and waits for cudatrace, which reads their numbers from the data
//! block, takes copies of them (`pidfd_open` + `pidfd_getfd`, Linux 5.6), writes the
//! library's bytes into the first and seals it, sizes the second (the control file), lets
//! the caller attach its probes to the library and take the control file, then writes the
//! path `dlopen` is given (`/proc/self/fd/N`) and the settings into the block and says go.
//! Nothing is written into any filesystem: a process in another mount namespace (a
//! container) gets the library the same way, provided its root has `/proc` mounted.
//!
//! After go, the trampoline says what `cudatrace_attach` returned; a thread of cudatrace's
//! waits for the library's thread to map the control file (by its `/proc/self/fd` path),
//! then tells the trampoline to close its descriptor. It is a thread, not the run's
//! own: the library loads libcupti meanwhile, and cudatrace's discovery stops the process
//! for that until the run serves the stop.
//!
//! The library's descriptor stays open once `dlopen` loaded it: the loader knows the
//! library as `/proc/self/fd/N` (its `link_map` name, what `dladdr` answers), and a closed
//! N would soon be the program's next file. The trampoline moved it out of the program's
//! way first (at or above the floor in the block, `target::library_fd_floor`,
//! close-on-exec).
//!
//! The trampoline waits [`data::WAIT_TICKS`] time-stamp-counter ticks (2 s or more) for go,
//! and as long for close; cudatrace writes into the block only within [`HANDOVER_BOUND`]
//! of letting the thread go (go) and of go (close), well inside those, so it never writes
//! into a stack the thread has gone back to using.

use std::{
    fs::File,
    io::Write,
    os::{
        fd::{FromRawFd, OwnedFd},
        unix::fs::FileExt,
    },
    time::{Duration, Instant},
};

use super::{
    injected::InjectError,
    ptrace::{read_memory, test_pause},
    trampoline::{data, go_strings},
};

/// How long after the thread was let go cudatrace may still write into its block.
pub const HANDOVER_BOUND: Duration = Duration::from_millis(1000);

/// The files the process made, as cudatrace holds them.
pub struct Files {
    /// The library: the anonymous file just written, or the one an earlier attach left
    /// mapped.
    pub library: File,
    /// The control file (one `u32` slot per pid, up to the process's own).
    pub control: File,
    /// The control file's path in the process.
    pub control_path: String,
}

/// Hands the library over to the trampoline whose block is at `block_at` in process
/// `pid`: `bytes` to write into its anonymous file, or `loaded`, the library an earlier
/// attach left there (then the file made for it is closed unused). `take` attaches the
/// probes and takes the control file, and returns the settings. On any failure the
/// trampoline is told to give up (or, past the bound, left to give up by itself).
pub fn hand_over(
    pid: u32,
    block_at: u64,
    library: Library,
    take: &mut dyn FnMut(Files) -> Result<Vec<u8>, String>,
) -> Result<(), InjectError> {
    let let_go = Instant::now();
    let memory = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| InjectError::Handover(format!("opening /proc/{pid}/mem: {e}")))?;
    let word = |value: u64| memory.write_all_at(&value.to_le_bytes(), block_at + data::WORD as u64);
    let give_up = |why: String| {
        if let_go.elapsed() < HANDOVER_BOUND {
            let _ = word(data::GIVE_UP);
        }
        InjectError::Handover(why)
    };
    let (library_fd, control_fd) = loop {
        let mut slots = [0u8; 16];
        if read_memory(pid, block_at + data::LIBRARY_FD as u64, &mut slots) == 16 {
            let library = i64::from_le_bytes(slots[..8].try_into().expect("8 bytes"));
            let control = i64::from_le_bytes(slots[8..].try_into().expect("8 bytes"));
            if library as u64 != data::NOT_YET && control as u64 != data::NOT_YET {
                break (library, control);
            }
        }
        if let_go.elapsed() >= HANDOVER_BOUND / 2 {
            return Err(give_up(format!(
                "the trampoline made no anonymous file within {:?}; it goes on without the \
                 library",
                HANDOVER_BOUND / 2
            )));
        }
        std::thread::sleep(Duration::from_micros(100));
    };
    for fd in [library_fd, control_fd] {
        if fd < 0 {
            return Err(give_up(format!(
                "memfd_create failed in process {pid}: {}",
                std::io::Error::from_raw_os_error(-fd as i32)
            )));
        }
    }
    test_pause("handover");
    let taken = take_copies(pid, library_fd as i32, control_fd as i32).map_err(&give_up)?;
    let (library_copy, control) = taken;
    let (library, path) = match library {
        Library::Write(bytes) => {
            write_sealed(&library_copy, bytes).map_err(&give_up)?;
            (library_copy, format!("/proc/self/fd/{library_fd}"))
        }
        Library::Loaded(file) => (file, String::new()),
    };
    // The library maps its own pid's slot.
    control
        .set_len((u64::from(pid) + 1) * 4)
        .map_err(|e| give_up(format!("sizing the control file: {e}")))?;
    let control_inode = {
        use std::os::unix::fs::MetadataExt;
        control
            .metadata()
            .map_err(|e| give_up(format!("reading the control file: {e}")))?
            .ino()
    };
    let settings = take(Files {
        library,
        control,
        control_path: format!("/proc/self/fd/{control_fd}"),
    })
    .map_err(&give_up)?;
    let (path, settings) = go_strings(path.as_bytes(), &settings)
        .map_err(|e| give_up(format!("the settings do not fit: {e:?}")))?;
    if let_go.elapsed() >= HANDOVER_BOUND {
        return Err(InjectError::Handover(format!(
            "cudatrace took over {HANDOVER_BOUND:?} to hand the library over; the trampoline \
             goes on without it ({} time-stamp-counter ticks after it began waiting)",
            data::WAIT_TICKS
        )));
    }
    memory
        .write_all_at(&path, block_at + data::PATH as u64)
        .and_then(|()| memory.write_all_at(&settings, block_at + data::SETTINGS as u64))
        .and_then(|()| word(data::GO))
        .map_err(|e| give_up(format!("writing into the trampoline's block: {e}")))?;
    // The rest waits on the process, whose library may be stopped meanwhile by this
    // cudatrace's discovery (it opens libcupti): a thread of its own, while the run goes on
    // and serves the stops.
    let dlopened = String::from_utf8_lossy(&path[..path.len() - 1]).into_owned();
    let closing = std::thread::Builder::new()
        .name("cudatrace-close".into())
        .spawn(move || {
            if let Err(why) = close_after_start(pid, block_at, &memory, control_inode, &dlopened) {
                eprintln!("cudatrace: warning: --gpu: process {pid}: {why}");
            }
        });
    if let Err(e) = closing {
        // The trampoline closes the control file after its wait all the same.
        eprintln!(
            "cudatrace: warning: --gpu: process {pid}: cannot start the thread that waits \
             for its library ({e}); the trampoline closes the control file after its own wait"
        );
    }
    Ok(())
}

/// After go: waits for the trampoline to say what `cudatrace_attach` returned and for the
/// library's thread to map the control file (by its inode in the maps), then lets the
/// trampoline close the control file's descriptor (and the library's, where it was not
/// loaded). Writes into the block only within [`HANDOVER_BOUND`] of
/// go, the trampoline waiting longer.
fn close_after_start(
    pid: u32,
    block_at: u64,
    memory: &File,
    control_inode: u64,
    dlopened: &str,
) -> Result<(), String> {
    let go_at = Instant::now();
    let in_time = || go_at.elapsed() < HANDOVER_BOUND;
    let status = loop {
        let mut status = [0u8; 8];
        if read_memory(pid, block_at + data::STATUS as u64, &mut status) == 8 {
            let status = u64::from_le_bytes(status);
            if status != data::NOT_YET {
                break status;
            }
        }
        if !in_time() {
            return Err(format!(
                "its library did not return from its start within {HANDOVER_BOUND:?}; the \
                 trampoline closes the control file by itself ({} time-stamp-counter ticks after \
                 the call)",
                data::WAIT_TICKS
            ));
        }
        std::thread::sleep(Duration::from_micros(100));
    };
    if status == 0 {
        // The library's thread opens the control file by its descriptor's path.
        while in_time() && !maps_inode(pid, control_inode) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    if in_time() {
        let _ = memory.write_all_at(&data::CLOSE.to_le_bytes(), block_at + data::WORD as u64);
    }
    match status {
        0 => Ok(()),
        data::NO_LIBRARY => Err(format!(
            "its dlopen of {dlopened} returned NULL: no GPU recording there"
        )),
        data::NO_SYMBOL => Err("the library it loaded has no cudatrace_attach".into()),
        other => Err(format!(
            "cudatrace_attach returned {}: {}",
            other as i64,
            match other {
                1 => "the library runs from the program's start (`run --gpu`)",
                2 => "another attach is starting it",
                _ => "not started",
            }
        )),
    }
}

/// Whether process `pid` maps the file with this inode.
fn maps_inode(pid: u32, inode: u64) -> bool {
    let inode = inode.to_string();
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|maps| {
        maps.lines()
            .any(|line| line.split_whitespace().nth(4) == Some(inode.as_str()))
    })
}

/// What goes into the process as the library.
pub enum Library<'a> {
    /// These bytes, into the anonymous file the trampoline made.
    Write(&'a [u8]),
    /// The library an earlier attach loaded, open here.
    Loaded(File),
}

/// Copies of descriptors `library` and `control` of process `pid`.
fn take_copies(pid: u32, library: i32, control: i32) -> Result<(File, File), String> {
    // SAFETY: pidfd_open(2) with no flags; the result is a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if pidfd < 0 {
        return Err(format!(
            "pidfd_open of process {pid}: {} (Linux 5.6 or later is needed)",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a descriptor just returned to us.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let copy = |fd: i32| -> Result<File, String> {
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_getfd(2) with no flags; the result is a new descriptor or -1.
        let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
        if copy < 0 {
            return Err(format!(
                "pidfd_getfd of descriptor {fd} of process {pid}: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: a descriptor just returned to us.
        Ok(unsafe { File::from_raw_fd(copy as i32) })
    };
    Ok((copy(library)?, copy(control)?))
}

/// Writes `bytes` into the anonymous file and seals it: no one changes the library once
/// it is there.
fn write_sealed(mut file: &File, bytes: &[u8]) -> Result<(), String> {
    file.write_all(bytes)
        .map_err(|e| format!("writing the library into its anonymous file: {e}"))?;
    use std::os::fd::AsRawFd;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: F_ADD_SEALS on a descriptor of ours.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(format!(
            "sealing the library's anonymous file: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}
