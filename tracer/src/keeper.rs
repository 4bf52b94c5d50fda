//! The keeper: a small process of its own that outlives cudatrace to continue what its
//! probes stopped. The eBPF side stops a process that opens a library until its probes are
//! attached, and records it in the `STOPPED` map before it sends the stop; cudatrace
//! continues it, and every way it ends (errors, signals, panics) continues the rest. Only a
//! SIGKILLed cudatrace cannot: the keeper can.
//!
//! `cudatrace run` starts it (`cudatrace keeper`, hidden) with two descriptors: the
//! `STOPPED` map, and the read end of a pipe whose write end only cudatrace holds. The
//! keeper waits for the pipe to close, which happens when cudatrace exits however it
//! exits, then sends SIGCONT to every process still in the map and exits. After a normal
//! end the map is empty: cudatrace continued and forgot them all. It runs in a session of
//! its own (the terminal's Ctrl-C is not for it) and holds nothing else: no link, no
//! program, so no probe stays attached because of it.

use std::{
    io::Read,
    os::{
        fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::process::CommandExt,
    },
    process::{Child, Command, Stdio},
};

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use clap::Args;

use crate::exit::{ExitCode, Failure};

/// Where the keeper finds its two descriptors.
const MAP_FD: i32 = 3;
const WATCH_FD: i32 = 4;

#[derive(Debug, Args)]
pub struct KeeperArgs {}

/// The keeper, from cudatrace's side: dropping it closes the pipe and reaps the keeper,
/// which by then has nothing left to continue.
#[derive(Debug)]
pub struct Keeper {
    child: Child,
    /// The write end: closed when cudatrace exits, however it exits.
    watch: Option<OwnedFd>,
}

impl Keeper {
    /// Starts the keeper over `stopped` (the `STOPPED` map's descriptor).
    pub fn spawn(stopped: BorrowedFd<'_>) -> std::io::Result<Keeper> {
        let mut ends = [0; 2];
        // SAFETY: pipe2 fills the two-element array.
        if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fresh descriptors, each owned once.
        let (read, write) =
            unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        let (map_fd, read_fd) = (stopped.as_raw_fd(), read.as_raw_fd());
        let mut command = Command::new("/proc/self/exe");
        command
            .arg("keeper")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: between fork and exec only async-signal-safe calls: setsid, fcntl, dup2
        // (whose copies lose close-on-exec: only they reach the keeper).
        unsafe {
            command.pre_exec(move || {
                libc::setsid();
                // Copied above the targets first: either may be 3 or 4 already.
                let map = libc::fcntl(map_fd, libc::F_DUPFD_CLOEXEC, 16);
                let read = libc::fcntl(read_fd, libc::F_DUPFD_CLOEXEC, 16);
                if map < 0
                    || read < 0
                    || libc::dup2(map, MAP_FD) < 0
                    || libc::dup2(read, WATCH_FD) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        drop(read);
        Ok(Keeper {
            child,
            watch: Some(write),
        })
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // cudatrace's own end: the keeper sweeps the (empty) map and exits.
        drop(self.watch.take());
        let _ = self.child.wait();
    }
}

/// `cudatrace keeper`: waits for cudatrace to exit, then continues what is still stopped.
pub fn run(_args: KeeperArgs) -> Result<i32, Failure> {
    // SAFETY: the descriptors cudatrace placed before exec; owned here alone.
    let (map, mut watch) = unsafe {
        (
            OwnedFd::from_raw_fd(MAP_FD),
            std::fs::File::from_raw_fd(WATCH_FD),
        )
    };
    let mut byte = [0u8; 1];
    // Nothing is ever written: this returns at EOF, when cudatrace has exited.
    while matches!(watch.read(&mut byte), Ok(n) if n > 0) {}
    let internal = |e: aya::maps::MapError| Failure::new(ExitCode::Internal, e);
    let map = Map::HashMap(MapData::from_fd(map).map_err(internal)?);
    let stopped: BpfHashMap<MapData, u32, u64> = BpfHashMap::try_from(map).map_err(internal)?;
    let pids: Vec<u32> = stopped.keys().filter_map(Result::ok).collect();
    for pid in pids {
        // SAFETY: kill(2) of a process cudatrace's probes stopped (ESRCH if it is gone).
        if unsafe { libc::kill(pid as i32, libc::SIGCONT) } == 0 {
            eprintln!(
                "cudatrace: keeper: continued pid {pid}, which cudatrace had stopped to attach \
                 its probes and could not continue itself (it was killed)"
            );
        }
    }
    Ok(0)
}
