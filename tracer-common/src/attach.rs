//! Library discovery and per-process attaching: what the eBPF side reports when a traced
//! process opens a probe-set library, forks, or execs from a thread other than its leader,
//! and the file-name patterns it recognises those libraries by.
//!
//! The eBPF side stops a process (`SIGSTOP` from its own syscall exit, before it runs
//! another user instruction) when the loader must attach something before the process goes
//! on: the event then carries [`attach_flags::STOPPED`], and the loader sends `SIGCONT` once
//! the probes are in place.

use core::mem::size_of;

use crate::EventHeader;

/// Bytes of a file-name pattern ([`NamePattern::name`]).
pub const PATTERN_LEN: usize = 64;
/// Entries of the `NAME_PATTERNS` map.
pub const MAX_PATTERNS: u32 = 16;
/// Bytes of an opened path kept in an [`AttachEvent`] (a power of two: the eBPF side masks
/// indexes into it).
pub const PATH_LEN: usize = 256;
/// [`AttachEvent::set`] when the path was too long to match: the loader decides.
pub const SET_UNKNOWN: u32 = u32::MAX;

/// A file name a probe set's library answers to, set by the loader.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamePattern {
    /// Bytes of `name` in use; 0 ends the list.
    pub len: u32,
    /// Which probe set (the loader's index).
    pub set: u32,
    /// 1: the file name is exactly `name`; 0: `name`, or `name` followed by `.` and a
    /// version (`libcuda.so` matches `libcuda.so.1` and `libcuda.so.580.159.04`).
    pub exact: u32,
    pub _pad: u32,
    pub name: [u8; PATTERN_LEN],
}
const _: () = assert!(size_of::<NamePattern>() == 16 + PATTERN_LEN);

/// What an [`AttachEvent`] reports.
pub mod attach_event {
    /// A traced process opened a file whose name matches a probe set (`fd` is open in it).
    pub const LIBRARY_OPENED: u32 = 1;
    /// A traced process with per-process probes forked: the child (the event's pid) needs
    /// its own before it runs.
    pub const FORKED: u32 = 2;
    /// A traced process exec'd from a thread other than its leader: per-process probes
    /// held the old leader and must be made again.
    pub const NEW_LEADER: u32 = 3;
}

/// Bits of [`AttachEvent`]'s header flags.
pub mod attach_flags {
    /// The process was stopped and waits for the loader's `SIGCONT`.
    pub const STOPPED: u32 = 1 << 0;
    /// The path did not fit in [`super::PATH_LEN`] bytes: `set` is
    /// [`super::SET_UNKNOWN`] and the loader reads the name itself.
    pub const PATH_TRUNCATED: u32 = 1 << 1;
    /// `bpf_send_signal` failed: the process runs on (its first calls may be missed).
    pub const STOP_FAILED: u32 = 1 << 2;
}

/// A library opened, a fork, or an exec that needs the loader, in the trace's pid view.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachEvent {
    pub header: EventHeader,
    /// One of [`attach_event`].
    pub what: u32,
    /// LIBRARY_OPENED: the file descriptor, open in the process.
    pub fd: i32,
    /// FORKED: the parent process.
    pub parent: u32,
    /// LIBRARY_OPENED: the probe set whose pattern matched, or [`SET_UNKNOWN`].
    pub set: u32,
    /// Bytes of `path` in use.
    pub path_len: u32,
    pub _pad: u32,
    /// LIBRARY_OPENED: the path as the process passed it.
    pub path: [u8; PATH_LEN],
}
const _: () = assert!(size_of::<AttachEvent>() == 24 + 24 + PATH_LEN);

/// A child being created by a traced process, from `task_newtask` (in the parent) to the
/// child's own return from `clone`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingChild {
    pub parent_pid: u32,
    pub parent_tid: u32,
    pub ts_ns: u64,
    /// 1: register the child and report the fork from the child (the loader's pid
    /// namespace is not the kernel's root one, so only the child can name itself).
    pub register: u32,
    /// 1: stop the child for its per-process probes.
    pub stop: u32,
    /// The parent's `comm`.
    pub comm: [u8; 16],
}
const _: () = assert!(size_of::<PendingChild>() == 40);
