//! The contract between cudatrace's eBPF programs and its userspace loader.
//!
//! Everything here is `#[repr(C)]`, `Copy`, free of `bool` and implicit padding, and
//! size-checked at compile time, so a layout change on one side fails the build of both.
#![no_std]

use core::mem::size_of;

pub mod arch;
mod attach;
pub mod cbids;
mod gpu;
pub mod stacks;
pub use attach::*;
pub use gpu::*;

/// Event kinds. Numbers are stable and never reused.
pub mod kind {
    /// A driver call with its arguments, paired entry to return ([`super::CallEvent`]).
    pub const CALL: u32 = 1;
    /// A driver call plus the memory an argument points to ([`super::CallDataEvent`]).
    pub const CALL_DATA: u32 = 2;
    /// A traced process forked, exec'd or exited ([`super::ProcEvent`]).
    pub const PROC: u32 = 3;
    /// NVIDIA kernel-driver activity: ioctl, mmap, Xid, kprobe ([`super::DriverEvent`]).
    pub const DRIVER: u32 = 4;
    /// One record from the injection library's CUPTI activity ([`super::GpuEvent`]).
    pub const GPU: u32 = 5;
    /// A GPU record that carries text: a kernel name, an error message ([`super::GpuTextEvent`]).
    pub const GPU_TEXT: u32 = 6;
    /// A driver call plus a string an argument points to: a kernel name, a file path
    /// ([`super::CallStringEvent`]).
    pub const CALL_STRING: u32 = 7;
    /// A library opened, a fork or an exec the loader must act on ([`super::AttachEvent`]).
    pub const ATTACH: u32 = 8;
    /// `--stacks`: a call's Python stack ([`super::stacks::StackEvent`]).
    pub const STACK: u32 = 9;
    /// `--stacks`: a Python code object, read once ([`super::stacks::CodeEvent`]).
    pub const CODE: u32 = 10;
    /// Two or more GPU records without text, in one entry ([`super::GpuBatchEvent`]).
    pub const GPU_BATCH: u32 = 11;
    /// `--stacks`: a driver call whose Python stack the probes knew, its hash in the
    /// call's own record ([`super::stacks::CallStackEvent`]) instead of a stack record of
    /// its own.
    pub const CALL_STACK: u32 = 12;
    /// Self-test: entry of the probed test function ([`super::SelftestEvent`]).
    pub const SELFTEST_ENTRY: u32 = 100;
    /// Self-test: return of the probed test function ([`super::SelftestEvent`]).
    pub const SELFTEST_RETURN: u32 = 101;
}

/// Header flags.
pub mod flags {
    /// A captured string or text was longer than [`super::TEXT_LEN`] bytes and was cut there.
    pub const DATA_TRUNCATED: u32 = 1 << 0;
    /// Reading user memory (stack arguments, a string, a struct) failed.
    pub const ENTRY_READ_FAILED: u32 = 1 << 1;
    /// Reading an output parameter at return failed.
    pub const OUT_READ_FAILED: u32 = 1 << 2;
    /// Emitted at entry by an entry-only probe ([`super::cookie::ENTRY_ONLY`]): no return
    /// was seen, so the event's `ret` and `dur_ns` mean nothing (they are 0).
    pub const NO_RETURN: u32 = 1 << 3;
    /// `--stacks --stack-every N`: the thread's Python stack was not walked at this call
    /// (a call walks it with a chance of 1 in N): the call has no stack record, by design.
    pub const STACK_SAMPLED_OUT: u32 = 1 << 4;
    /// `--stacks --stack-rate HZ`: the thread had used its stacked calls of the moment (at
    /// most HZ a second): the call has no stack record, by design.
    pub const STACK_RATE_LIMITED: u32 = 1 << 5;
}

/// Registers plus stack slots captured per call: `cuLaunchKernel` needs ten.
pub const MAX_ARGS: usize = 10;
/// How many of [`MAX_ARGS`] live in registers on the architecture this is built for (x86-64
/// SysV: 6; AAPCS64: 8).
pub const REGISTER_ARGS: usize = arch::TARGET.register_args();
/// Stack words read at entry when a function has more than [`REGISTER_ARGS`] arguments.
pub const STACK_ARGS: usize = MAX_ARGS - REGISTER_ARGS;
/// Output parameters read back at return (e.g. `*dptr`, `*pitch`).
pub const MAX_OUTS: usize = 2;
/// Bytes of a struct or array captured ([`CallDataEvent`]): a `CUlaunchConfig`, a
/// `CUDA_MEMCPY3D`, an IPC handle, a batch's sizes.
pub const DATA_LEN: usize = 256;
/// The longest text kept whole, in bytes: a kernel name or path of a call
/// ([`CallStringEvent`]), a GPU record's text ([`GpuTextEvent`]). Longer ones are cut to
/// this and flagged [`flags::DATA_TRUNCATED`].
pub const TEXT_LEN: usize = 4096;
/// Bytes the kernel reads for a string: [`TEXT_LEN`], one more to tell a longer string
/// from one of exactly [`TEXT_LEN`], and the NUL.
pub const STRING_READ_LEN: usize = TEXT_LEN + 2;
/// [`CallStringEvent::data`]'s size: [`STRING_READ_LEN`] rounded up to 8 bytes.
pub const STRING_BUF_LEN: usize = STRING_READ_LEN.next_multiple_of(8);
/// Bits of a call probe's attach cookie above its probe id (the low 32 bits, the index in
/// `SPECS`): what the entry program would otherwise look up on every call.
pub mod cookie {
    /// The probe id: the low 32 bits (its library, then its slot in `SPECS`:
    /// [`super::SLOT_BITS`]).
    pub const PROBE_ID: u64 = 0xffff_ffff;
    /// The link is the traced process's own (uprobe_multi with a pid): the kernel runs the
    /// program for that process only, so the traced-process lookup is skipped.
    pub const PER_PROCESS: u64 = 1 << 32;
    /// The function has arguments on the stack: the entry reads them with the return
    /// address, in one read.
    pub const STACK_ARGS: u64 = 1 << 33;
    /// No return probe (`--launch-entry-only`): the entry emits the whole event itself,
    /// flagged [`super::flags::NO_RETURN`], and keeps no frame.
    pub const ENTRY_ONLY: u64 = 1 << 34;
    /// `--stacks`: the entry hands the call to the stack programs, which send the calling
    /// thread's Python stack first ([`super::stacks`]).
    pub const STACKS: u64 = 1 << 35;
}
/// Nesting depth of probed calls kept per thread; deeper calls are counted as lost.
pub const MAX_DEPTH: usize = 4;
/// Bits of a probe id that are its slot in the `SPECS` map; the bits above are its
/// library's id. A symbol has one slot however many copies of its library are attached
/// (its spec is its function's, whatever the file), so the map bounds the distinct
/// symbols of a run, not the libraries: `--functions all` on NVIDIA's 580 driver plans 682.
pub const SLOT_BITS: u32 = 12;
/// A probe id's slot: `probe_id & SLOT_MASK`.
pub const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;
/// Entries of the `SPECS` map: distinct symbols one run can attach.
pub const MAX_PROBES: u32 = 1 << SLOT_BITS;
/// Libraries one run can attach (library ids fill the probe id's other bits).
pub const MAX_LIBRARIES: u32 = 1 << (32 - SLOT_BITS);

/// Per-CPU counters in the `COUNTERS` map (indexes).
pub mod counter {
    /// Ring-buffer reserve failed for a call event: the event is lost.
    pub const RING_FULL: u32 = 0;
    /// Call nested deeper than `MAX_DEPTH`: the event is lost.
    pub const TOO_DEEP: u32 = 1;
    /// The per-thread frame map was full at entry: the event is lost.
    pub const FRAMES_FULL: u32 = 2;
    /// A return arrived with no matching entry (attached mid-call): nothing to emit.
    pub const UNMATCHED_RETURN: u32 = 3;
    /// Calls seen at entry from traced processes.
    pub const ENTRIES: u32 = 4;
    /// Ring-buffer reserve failed for a process (fork/exec/exit) event.
    pub const PROC_RING_FULL: u32 = 5;
    /// Ring-buffer reserve failed for a driver (ioctl/mmap/xid/kprobe) event.
    pub const DRIVER_RING_FULL: u32 = 6;
    /// Ring-buffer reserve failed for a GPU record: the record is lost.
    pub const GPU_RING_FULL: u32 = 7;
    /// A GPU record could not be read from the traced process, or its batch held more than
    /// [`super::GPU_BATCH_MAX`] records: each such record is lost.
    pub const GPU_READ_FAILED: u32 = 8;
    /// A new child of a traced process could not be added to the traced-process map, or to
    /// the map of children being created: the child and its descendants are not traced, or
    /// it runs without its own probes.
    pub const TRACED_FULL: u32 = 9;
    /// `--kernel`: an NVIDIA device fd could not be added to the fd map: its ioctls and
    /// mmaps are not seen.
    pub const FDS_FULL: u32 = 10;
    /// An open could not be remembered until its return: the file it opens is not checked
    /// for being a probe-set library (discovery) or, with `--kernel`, an NVIDIA device
    /// (whose ioctls and mmaps are then not seen).
    pub const OPENS_FULL: u32 = 11;
    /// `--kernel`: an ioctl or mmap on an NVIDIA fd could not be remembered until its
    /// return: its event is lost.
    pub const SYSCALLS_FULL: u32 = 12;
    /// `--kernel` with kprobes: a kernel function call could not be remembered until its
    /// return: its event is lost.
    pub const KFUNCS_FULL: u32 = 13;
    /// Pending calls dropped because they can no longer be running: a later entry found
    /// the stack below them unwound (`longjmp`, an exception through the library), or an
    /// outer call returned first. Their events are never written.
    pub const ABANDONED_FRAMES: u32 = 14;
    /// Ring-buffer reserve failed for an attach event: a library opened or a fork that
    /// the loader never heard of (its calls may be missed).
    pub const ATTACH_RING_FULL: u32 = 15;
    /// Kernels without attach cookies (before 5.15): a probe fired in a traced process at
    /// an address no recorded mapping of a planned library explains (mapped before tracing
    /// and not found, or the mapping table was full): its call is lost.
    pub const UNIDENTIFIED_PROBE: u32 = 16;
    /// A child of a traced process that needed to be seen in its own context before its
    /// first user instruction (to be stopped for its own probes, or named in the loader's
    /// pid namespace) and ended without having been seen there: its calls may be missing.
    pub const CHILD_UNSEEN: u32 = 17;
    /// Number of counters.
    pub const COUNT: u32 = 18;
}

/// Which memory a probe captures (at return): into [`CallStringEvent::data`] for strings,
/// [`CallDataEvent::data`] otherwise.
pub mod capture {
    pub const NONE: u32 = 0;
    /// A NUL-terminated string pointed to by an argument (kernel names, paths), up to
    /// [`super::TEXT_LEN`] bytes.
    pub const CSTR: u32 = 1;
    /// `capture_len` bytes pointed to by an argument (`CUlaunchConfig`, `CUDA_MEMCPY2D`...),
    /// or with `capture_count_arg`, that argument's value times 8 (an array of 64-bit
    /// words), at most [`super::DATA_LEN`].
    pub const STRUCT: u32 = 2;
}

/// Driver event subtypes ([`DriverEvent::what`]).
pub mod driver_event {
    /// An ioctl on an NVIDIA device file (syscall tracepoints).
    pub const IOCTL: u32 = 1;
    /// An mmap of an NVIDIA device file (syscall tracepoints).
    pub const MMAP: u32 = 2;
    /// An Xid error (`nvidia:nvidia_dev_xid`).
    pub const XID: u32 = 3;
    /// A kernel function call (kprobe + kretprobe).
    pub const KFUNC: u32 = 4;
}

/// Which NVIDIA device file an fd refers to ([`DriverEvent::device`]).
pub mod device_kind {
    pub const OTHER: u32 = 0;
    /// `nvidiactl`
    pub const CTL: u32 = 1;
    /// `nvidia-uvm`, `nvidia-uvm-tools`
    pub const UVM: u32 = 2;
    /// `nvidiaN` (the index is in [`super::DriverEvent::device_index`])
    pub const GPU: u32 = 3;
}

/// Bytes of an ioctl's parameter block kept (RM: control command at 8, class at 12).
pub const IOCTL_PARAMS_LEN: usize = 32;
/// Bytes of the device path prefix the loader can set (`/dev/nvidia` by default).
pub const DEVICE_PREFIX_LEN: usize = 64;

/// Process event subtypes ([`ProcEvent::what`]).
pub mod proc_event {
    pub const FORK: u32 = 1;
    pub const EXEC: u32 = 2;
    pub const EXIT: u32 = 3;
}

/// How the generic uprobe handles one attached symbol. Indexed by the attach cookie.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeSpec {
    /// Arguments to capture, registers first then stack (at most [`MAX_ARGS`]).
    pub nargs: u32,
    /// One of [`capture`].
    pub capture: u32,
    /// Argument index holding the pointer to capture from.
    pub capture_arg: u32,
    /// Bytes to capture for [`capture::STRUCT`] (at most [`DATA_LEN`]).
    pub capture_len: u32,
    /// Argument indexes + 1 of output pointers read as u64 at return; 0 means none.
    pub out_args: [u32; MAX_OUTS],
    /// For [`capture::STRUCT`]: argument index + 1 of an element count; the capture is then
    /// that many 64-bit words (at most `DATA_LEN / 8`) instead of `capture_len` bytes.
    pub capture_count_arg: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<ProbeSpec>() == 32);

/// Common prefix of every event in the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventHeader {
    /// One of [`kind`].
    pub kind: u32,
    /// Bits of [`flags`].
    pub flags: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the event (call entry for calls).
    pub ts_ns: u64,
    /// Thread group id (the process id users see).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
}
const _: () = assert!(size_of::<EventHeader>() == 24);

/// One driver call, emitted at return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallEvent {
    pub header: EventHeader,
    /// Attach cookie: index into the loader's table of attached symbols.
    pub probe_id: u32,
    /// The CUresult returned (low 32 bits of rax).
    pub ret: u32,
    /// Entry to return.
    pub dur_ns: u64,
    /// Raw argument words, registers then stack.
    pub args: [u64; MAX_ARGS],
    /// Values read through the spec's output pointers at return.
    pub outs: [u64; MAX_OUTS],
}
const _: () = assert!(size_of::<CallEvent>() == 136);

/// A driver call plus the memory its pointer argument referred to, read at return: by
/// then the driver has touched it, so the pages are resident (a uprobe cannot fault them
/// in, and names in a library's not-yet-read pages fail to read at entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDataEvent {
    pub call: CallEvent,
    /// Bytes of `data` that are valid.
    pub data_len: u32,
    pub _pad: u32,
    pub data: [u8; DATA_LEN],
}
const _: () = assert!(size_of::<CallDataEvent>() == 136 + 8 + DATA_LEN);

/// A driver call plus the string its pointer argument referred to, read at return like
/// [`CallDataEvent`]'s memory. Reserved in the ring only by probes that capture a string
/// (name lookups, file loads), so other calls stay small. `data_len` bytes of `data` are
/// the string, without its NUL, at most [`TEXT_LEN`]; longer strings are cut to
/// [`TEXT_LEN`] and flagged [`flags::DATA_TRUNCATED`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallStringEvent {
    pub call: CallEvent,
    pub data_len: u32,
    pub _pad: u32,
    pub data: [u8; STRING_BUF_LEN],
}
const _: () = assert!(size_of::<CallStringEvent>() == 136 + 8 + STRING_BUF_LEN);
const _: () = assert!(STRING_BUF_LEN >= STRING_READ_LEN);

/// Bytes of [`ProcEvent::name`]: an exec's file name is kept up to 255 bytes (the comm of a
/// fork or exit needs 16).
pub const PROC_NAME_LEN: usize = 256;

/// A traced process forked a child, exec'd, or exited.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcEvent {
    pub header: EventHeader,
    /// One of [`proc_event`].
    pub what: u32,
    /// Child pid for FORK; 0 otherwise.
    pub child_pid: u32,
    /// `comm` for FORK/EXIT, the file name for EXEC (its first 255 bytes).
    pub name: [u8; PROC_NAME_LEN],
}
const _: () = assert!(size_of::<ProcEvent>() == 24 + 8 + PROC_NAME_LEN);

/// Activity of the NVIDIA kernel driver for a traced process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverEvent {
    /// `ts_ns` is the entry time.
    pub header: EventHeader,
    /// One of [`driver_event`].
    pub what: u32,
    /// One of [`device_kind`] (ioctl, mmap).
    pub device: u32,
    /// The N of `nvidiaN`.
    pub device_index: u32,
    /// The file descriptor (ioctl, mmap).
    pub fd: i32,
    pub dur_ns: u64,
    /// Syscall or function return value.
    pub ret: i64,
    /// ioctl: cmd; mmap: length; xid: error code; kfunc: function address.
    pub a: u64,
    /// ioctl: arg pointer; mmap: file offset; xid: device; kfunc: first argument.
    pub b: u64,
    /// mmap: prot; kfunc: second argument.
    pub c: u64,
    /// mmap: flags; kfunc: third argument.
    pub d: u64,
    /// ioctl: the parameter block (read at exit); xid: the message.
    pub params: [u8; IOCTL_PARAMS_LEN],
}
const _: () = assert!(size_of::<DriverEvent>() == 24 + 16 + 48 + IOCTL_PARAMS_LEN);

/// A driver syscall or function in flight on a thread, from entry to exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyscallFrame {
    pub ts_ns: u64,
    pub what: u32,
    pub device: u32,
    pub device_index: u32,
    pub fd: i32,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
}
const _: () = assert!(size_of::<SyscallFrame>() == 56);

/// Self-test event: the probed test function's arguments or its return value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SelftestEvent {
    pub header: EventHeader,
    pub arg0: u64,
    pub arg1: u64,
    pub ret: u64,
}
const _: () = assert!(size_of::<SelftestEvent>() == 48);

/// One pending call, saved at entry until its return.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Frame {
    pub probe_id: u32,
    pub flags: u32,
    pub ts_ns: u64,
    /// The stack pointer at entry (pointing at the return address): a later entry with a
    /// higher one means this call's frame is gone.
    pub sp: u64,
    /// The return address at entry, before the return probe replaces it.
    pub ret_addr: u64,
    pub args: [u64; MAX_ARGS],
    /// `--stacks`: the call's stack, when the walk at its entry found one the probes knew
    /// (`stack.flags` not 0): sent with the call at its return, in one record.
    pub stack: stacks::StackRef,
}
const _: () = assert!(size_of::<Frame>() == 8 + 8 + 16 + 80 + 32);

/// A thread's stack of pending calls, the value of the per-thread `FRAMES` map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FrameStack {
    /// Current nesting depth, counting calls too deep to keep.
    pub depth: u32,
    pub _pad: u32,
    pub frames: [Frame; MAX_DEPTH],
}
const _: () = assert!(size_of::<FrameStack>() == 8 + MAX_DEPTH * size_of::<Frame>());

/// Kernels without attach cookies: a probe is told by the file offset it fired at, within
/// the library file mapped there (`PROBES_AT`'s key).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProbeAt {
    /// The library's id (its plan's), as in the probe id's high bits.
    pub library: u32,
    pub _pad: u32,
    pub file_offset: u64,
}
const _: () = assert!(size_of::<ProbeAt>() == 16);

/// One mapping of a planned library file in a process: `[start, end)` maps the file from
/// `file_offset`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LibraryMapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub library: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<LibraryMapping>() == 32);

/// Mappings of planned libraries kept per process (a ring: the newest replace the oldest).
/// The loader maps a library in about four pieces (its span, then each segment).
pub const MAX_MAPPINGS: usize = 16;

/// A process's mappings of planned library files (kernels without attach cookies), the
/// value of `MAPPINGS`: entry `(next - 1) % MAX_MAPPINGS` is the newest.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessMappings {
    pub next: u32,
    pub _pad: u32,
    pub mappings: [LibraryMapping; MAX_MAPPINGS],
}
const _: () = assert!(size_of::<ProcessMappings>() == 8 + MAX_MAPPINGS * 32);
const _: () = assert!(MAX_MAPPINGS.is_power_of_two());

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all are repr(C), Copy, with explicit padding and no invalid bit patterns.
    unsafe impl aya::Pod for ProbeSpec {}
    unsafe impl aya::Pod for ProbeAt {}
    unsafe impl aya::Pod for ProcessMappings {}
    unsafe impl aya::Pod for EventHeader {}
    unsafe impl aya::Pod for CallEvent {}
    unsafe impl aya::Pod for NamePattern {}
    unsafe impl aya::Pod for stacks::PyProcess {}
    unsafe impl aya::Pod for attach::PendingChild {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kind and counter numbers are a contract with the loader and recorded traces. Each
    /// is listed here in order, so a number given twice (as two branches written in
    /// parallel once did) or a gap fails.
    #[test]
    fn kinds_and_counters_are_numbered_once_each() {
        let kinds = [
            kind::CALL,
            kind::CALL_DATA,
            kind::PROC,
            kind::DRIVER,
            kind::GPU,
            kind::GPU_TEXT,
            kind::CALL_STRING,
            kind::ATTACH,
            kind::STACK,
            kind::CODE,
            kind::GPU_BATCH,
            kind::CALL_STACK,
        ];
        assert_eq!(kinds, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        let counters = [
            counter::RING_FULL,
            counter::TOO_DEEP,
            counter::FRAMES_FULL,
            counter::UNMATCHED_RETURN,
            counter::ENTRIES,
            counter::PROC_RING_FULL,
            counter::DRIVER_RING_FULL,
            counter::GPU_RING_FULL,
            counter::GPU_READ_FAILED,
            counter::TRACED_FULL,
            counter::FDS_FULL,
            counter::OPENS_FULL,
            counter::SYSCALLS_FULL,
            counter::KFUNCS_FULL,
            counter::ABANDONED_FRAMES,
            counter::ATTACH_RING_FULL,
            counter::UNIDENTIFIED_PROBE,
            counter::CHILD_UNSEEN,
        ];
        assert_eq!(counters, core::array::from_fn::<u32, 18, _>(|i| i as u32));
        assert_eq!(counter::COUNT as usize, counters.len());
    }
}
