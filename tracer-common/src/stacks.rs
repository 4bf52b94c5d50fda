//! Python stacks (`run --stacks`): the layout of a process's CPython interpreter that the
//! loader gives the probes ([`PyProcess`]), and the records the probes send back: a stack
//! at a call's entry ([`StackEvent`], followed by its frames when the stack is new) and,
//! once per code object, its names and line table ([`CodeEvent`]).
//!
//! The call programs tail-call the stack programs (`STACK_PROGS`, indexed by
//! [`stack_prog`]) for probes whose attach cookie has [`crate::cookie::STACKS`]; the stack
//! record of a call precedes its call record in the ring, and is paired with it by thread
//! and entry time.

use core::mem::size_of;

use crate::EventHeader;

/// The most frames one stack can keep (`--stack-depth`'s upper bound).
pub const MAX_STACK_FRAMES: usize = 256;
/// The frame budget when `--stack-depth` is not given: deeper than transformers' decoding
/// stacks.
pub const DEFAULT_STACK_DEPTH: u32 = 128;
/// `--stack-every`'s upper bound: one walk in a million calls is already no profile.
pub const MAX_STACK_EVERY: u32 = 1_000_000;
/// `--stack-rate`'s upper bound (stacked calls a second per thread).
pub const MAX_STACK_RATE: u32 = 1_000_000;
/// Frames one run of the walk program reads; a deeper stack continues in a tail call. 64:
/// GPT-2's 34 frames a call (3.12) take one run (32 took two: −3.7% of the call program at
/// 36 frames on the VM, BENCHMARKS.md), and the verifier of 5.10 still takes the program.
pub const FRAMES_PER_WALK: usize = 64;
/// Thread states the walk looks at, at most, to find the calling thread's.
pub const MAX_THREAD_STATES: usize = 256;
/// Bytes kept of a code object's file name and qualified name, and of its line table: a
/// longer one leaves the code object unresolved ([`code_flags`]), never cut.
pub const FILENAME_CAP: usize = 1024;
pub const QUALNAME_CAP: usize = 512;
pub const LINETABLE_CAP: usize = 16384;
/// [`CodeEvent::data`]'s size.
pub const CODE_DATA_LEN: usize = FILENAME_CAP + QUALNAME_CAP + LINETABLE_CAP;

/// Indexes of the stack programs in the `STACK_PROGS` program array.
pub mod stack_prog {
    /// Finds the thread state and walks the frames.
    pub const WALK: u32 = 0;
    /// Resolves each frame's code object (seen before, or to read).
    pub const CODES: u32 = 1;
    /// Reads new code objects, then sends the stack.
    pub const CAPTURE: u32 = 2;
    /// Finds the calling thread's thread state in the interpreter's list (when the
    /// per-thread cache cannot say), then goes back to WALK.
    pub const THREADS: u32 = 3;
    /// WALK where each frame's code identity is read (`py_flags::IDENT_PER_FRAME` without
    /// `FREE_PROBE`): WALK hands such a process's walks over to it. Apart, each of the two
    /// programs keeps within the verifier's limits with room to spare.
    pub const WALK_IDENT: u32 = 4;
    /// Entries of the array.
    pub const COUNT: u32 = 5;
}

/// An offset the layout does not have ([`PyProcess`]'s fields).
pub const NO_FIELD: u32 = u32::MAX;

/// Bytes the walk reads at once: the interpreter's fields (`next`, the thread list, its
/// epoch), a thread state's, a frame's, the start of a code object, a string's header.
pub const INTERP_READ: usize = 96;
pub const TSTATE_READ: usize = 240;
pub const FRAME_READ: usize = 80;
pub const CODE_READ: usize = 256;
pub const STR_READ: usize = 48;
/// Bytes of a code object a 3.10/3.11 identity fingerprint covers.
pub const FINGERPRINT_LEN: usize = 128;
/// Entries of the probes' `KNOWN_CODES` map: the code objects of stacks known by their hash.
pub const KNOWN_CODES_MAX: u32 = 65536;

/// Bits of [`PyProcess::flags`].
pub mod py_flags {
    /// 3.11+: a thread state must also have the thread's tid (`native_thread_id`); set
    /// only where the process's pid namespace is the loader's.
    pub const NATIVE_TID: u32 = 1 << 0;
    /// 3.10: the frame's instruction is `f_lasti`, an `int` in code units.
    pub const LASTI: u32 = 1 << 1;
    /// A code object's identity is read per frame while walking (3.10 to 3.12); otherwise
    /// the interpreter's code epoch stands for it, and the identity is read only for a
    /// stack not seen before.
    pub const IDENT_PER_FRAME: u32 = 1 << 2;
    /// The identity is a fingerprint of [`super::FINGERPRINT_LEN`] bytes (3.10, 3.11);
    /// otherwise `co_version` (a u32).
    pub const FINGERPRINT: u32 = 1 << 3;
    /// A probe on `PyCode_Type`'s deallocator counts this process's code objects freed
    /// ([`super::PyProcess::code_frees`]): while the count stands, every code pointer
    /// still names the object it named, so it stands for the identities as 3.14's own
    /// counter does. Set by the loader only once the probe is attached for this process;
    /// a fork child starts without it.
    pub const FREE_PROBE: u32 = 1 << 4;
    /// The loader links that probe at the process's first stack record with a stack:
    /// until [`FREE_PROBE`] is set, each such record wakes the loader at once (not at the
    /// ring's threshold or its quarter-second tick), so that few calls read identities per
    /// frame meanwhile. Cleared by the loader whether the link was made or not; a fork
    /// child starts without it.
    pub const FREE_PENDING: u32 = 1 << 5;
}

/// One process's interpreter as the probes walk it: addresses in the process, and the
/// offsets of each field the walk reads (bytes; [`NO_FIELD`] where the version has none).
/// Value of the `PYPROC` map, keyed by the process id (the loader's namespace).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcess {
    /// Unique in the run per process image: the kernel's caches of stacks and code objects
    /// are keyed by it. A fork child gets a new one from the kernel.
    pub generation: u64,
    /// `&_PyRuntime` in the process.
    pub runtime: u64,
    /// `&PyCode_Type` in the process: what a code object's `ob_type` must be.
    pub code_type: u64,
    /// Applied to a frame's code pointer (3.14's `_PyStackRef` tags its low bits).
    pub code_mask: u64,
    /// Code objects freed in this process since its layout was given ([`py_flags::FREE_PROBE`]),
    /// counted by the kernel.
    pub code_frees: u64,
    /// CPython's minor version (10 to 14).
    pub minor: u32,
    /// Bits of [`py_flags`].
    pub flags: u32,
    /// `_PyRuntime.interpreters.head`.
    pub runtime_interpreters: u32,
    /// Where the one read of the interpreter state starts ([`INTERP_READ`] bytes).
    pub interp_read: u32,
    /// The interpreter state's `next`, thread list head and thread-creation counter
    /// (`threads.next_unique_id`; read apart when outside the read).
    pub interp_next: u32,
    pub interp_threads: u32,
    pub interp_thread_epoch: u32,
    /// The code epoch (3.13: `func_state.next_version`, u32; 3.14:
    /// `_code_object_generation`, u64), or [`NO_FIELD`].
    pub interp_code_epoch: u32,
    pub code_epoch_size: u32,
    /// Where the one read of a thread state starts ([`TSTATE_READ`] bytes), and its fields.
    pub tstate_read: u32,
    pub tstate_next: u32,
    pub tstate_interp: u32,
    pub tstate_thread_id: u32,
    pub tstate_native_id: u32,
    /// The current frame (3.10: `frame`; 3.13+: `current_frame`), or on 3.11 and 3.12 the
    /// `cframe` pointer, whose `current_frame` is at [`PyProcess::cframe_frame`].
    pub tstate_frame: u32,
    pub cframe_frame: u32,
    /// 3.12+: the thread's data stack, `datastack_chunk` (its current chunk, where the
    /// chunk's memory starts) and `datastack_top` (the end of the frames in it): a
    /// data-stack window of a frame in that chunk may reach below the frame's page, down
    /// to the chunk's start. [`NO_FIELD`] where they lie outside the thread state's read
    /// (3.11) or the version has no data stack (3.10).
    pub tstate_datastack: u32,
    pub tstate_datastack_top: u32,
    /// Where the one read of a frame starts ([`FRAME_READ`] bytes), and its fields.
    pub frame_read: u32,
    pub frame_previous: u32,
    pub frame_code: u32,
    pub frame_instr: u32,
    pub frame_owner: u32,
    /// Frames owned by this value or above are the interpreter's own (3.12+: 3), skipped.
    pub owner_skip_from: u32,
    /// The code object's fields.
    pub code_ob_type: u32,
    pub code_adaptive: u32,
    pub code_ident: u32,
    pub code_filename: u32,
    /// `co_qualname` (3.11+) or `co_name` (3.10).
    pub code_qualname: u32,
    pub code_firstlineno: u32,
    pub code_firsttraceable: u32,
    pub code_linetable: u32,
    /// `bytes`: `ob_size` and the data.
    pub bytes_size: u32,
    pub bytes_data: u32,
    /// `str`: `length`, `state`, and the data of a compact ASCII and a compact string.
    pub str_length: u32,
    pub str_state: u32,
    pub str_ascii_data: u32,
    pub str_compact_data: u32,
    /// The fingerprint's words are the code object's from `code_ident`, each ANDed with
    /// its mask: 0 leaves out a word that changes as the code runs (3.10's
    /// `co_zombieframe`; 3.11's `co_warmup` in part).
    pub fingerprint_mask: [u64; FINGERPRINT_LEN / 8],
}
const _: () = assert!(size_of::<PyProcess>() == 40 + 38 * 4 + FINGERPRINT_LEN);

/// What the walk found, in [`StackEvent::status`]. Numbers are stable.
pub mod stack_status {
    /// A stack: the event's frames (or, [`super::stack_flags::KNOWN`], its hash alone).
    pub const OK: u32 = 0;
    /// The process has no interpreter layout (not Python, or not readable).
    pub const NO_INTERPRETER: u32 = 1;
    /// `interpreters.head` is NULL: the interpreter is not initialised (or finalising).
    pub const NOT_INITIALIZED: u32 = 2;
    /// No thread state has the thread's `fs` base (and tid).
    pub const NO_THREAD_STATE: u32 = 3;
    /// Two thread states match, or the process runs sub-interpreters.
    pub const AMBIGUOUS: u32 = 4;
    /// The thread state has no Python frame.
    pub const NO_FRAMES: u32 = 5;
    /// A read of the process's memory failed.
    pub const READ_FAULT: u32 = 6;
    /// More thread states than the walk looks at, none of them the thread's.
    pub const TOO_MANY_THREADS: u32 = 7;
    /// The kernel's `fs` base offset is unknown (no BTF): no thread can be matched.
    pub const NO_FSBASE: u32 = 8;
    /// `--stack-every`: the draw left the call out, but whether its thread has a thread
    /// state was not known then; the walk found one, and stopped there.
    pub const SAMPLED_OUT: u32 = 9;
    /// `--stack-rate`: the thread had used its stacked calls of the moment, but whether it
    /// has a thread state was not known then; the walk found one, and stopped there.
    pub const RATE_LIMITED: u32 = 10;
}

/// `--stack-rate HZ`: a thread's token bucket (the value of the probes' per-thread map).
/// It holds up to HZ stacked calls and refills at HZ a second; a new thread's is full.
/// Counted in units of 1/10^9 of a call, so that any rate is exact in integers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateBucket {
    /// Calls available, times 10^9 (at most HZ times 10^9).
    pub credit: u64,
    /// When it was last refilled (`bpf_ktime_get_ns`).
    pub last_ns: u64,
}
const _: () = assert!(size_of::<RateBucket>() == 16);

impl RateBucket {
    /// One call's worth of credit.
    const CALL: u64 = 1_000_000_000;

    /// A new thread's bucket, at `now_ns`: full.
    pub const fn full(rate: u32, now_ns: u64) -> Self {
        RateBucket {
            credit: rate as u64 * Self::CALL,
            last_ns: now_ns,
        }
    }

    /// Refills the bucket to `now_ns` and takes a call from it if it has one: whether this
    /// call may walk its stack. A clock that goes back refills nothing.
    pub fn take(&mut self, rate: u32, now_ns: u64) -> bool {
        let capacity = rate as u64 * Self::CALL;
        // A second refills a bucket from empty: longer refills no more (and cannot
        // overflow: at most 10^9 ns times 10^6 a second).
        let elapsed = now_ns.saturating_sub(self.last_ns);
        let elapsed = if elapsed > Self::CALL {
            Self::CALL
        } else {
            elapsed
        };
        let credit = self.credit + elapsed * rate as u64;
        self.credit = if credit > capacity { capacity } else { credit };
        if now_ns > self.last_ns {
            self.last_ns = now_ns;
        }
        if self.credit >= Self::CALL {
            self.credit -= Self::CALL;
            true
        } else {
            false
        }
    }
}

/// Bits of [`StackEvent::flags`].
pub mod stack_flags {
    /// The stack was seen before in this process image: the event carries its hash alone.
    pub const KNOWN: u32 = 1 << 0;
    /// A frame the walk would keep lies beyond the frame budget: the frames are the
    /// innermost ones.
    pub const CUT: u32 = 1 << 1;
    /// A tail call failed (the kernel's limit per probe hit): frames were left unread
    /// (with `CUT`) or code objects unresolved.
    pub const TAIL_CALL_FAILED: u32 = 1 << 2;
}

/// A call's Python stack, sent at the call's entry: `header.ts_ns`, `pid` and `tid` are
/// the call's. `nframes` [`RawPyFrame`]s follow unless [`stack_flags::KNOWN`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackEvent {
    pub header: EventHeader,
    /// The process image's [`PyProcess::generation`].
    pub generation: u64,
    /// A 128-bit hash of the frames as walked (code pointers, identities, instructions,
    /// owners): the stack's name in this process image.
    pub hash: [u64; 2],
    /// One of [`stack_status`].
    pub status: u32,
    /// Bits of [`stack_flags`].
    pub flags: u32,
    pub nframes: u32,
    /// The call's probe id.
    pub probe_id: u32,
}
const _: () = assert!(size_of::<StackEvent>() == 24 + 40);

/// A stack the probes knew, by its name: what a [`StackEvent`] with
/// [`stack_flags::KNOWN`] says, carried in its call's own record
/// ([`CallStackEvent`]), so that the call costs one ring record, not two.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackRef {
    /// [`StackEvent::generation`].
    pub generation: u64,
    /// [`StackEvent::hash`].
    pub hash: [u64; 2],
    /// [`StackEvent::flags`], [`stack_flags::KNOWN`] among them; 0: no stack here (the
    /// call's stack record, if it has one, came on its own).
    pub flags: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<StackRef>() == 32);

/// A call ([`crate::kind::CALL_STACK`]) whose stack the probes knew: the call, then its
/// stack's name. Stands for a [`StackEvent`] (status OK, the call's time, pid, tid and
/// probe id, no frames) followed by the call as a [`crate::kind::CALL`] record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallStackEvent {
    pub call: crate::CallEvent,
    pub stack: StackRef,
}
const _: () = assert!(size_of::<CallStackEvent>() == 136 + 32);

impl CallStackEvent {
    /// The stack record this stands for, as the probes would have sent it on its own.
    pub fn stack_event(&self) -> StackEvent {
        StackEvent {
            header: EventHeader {
                kind: crate::kind::STACK,
                flags: 0,
                ..self.call.header
            },
            generation: self.stack.generation,
            hash: self.stack.hash,
            status: stack_status::OK,
            flags: self.stack.flags,
            nframes: 0,
            probe_id: self.call.probe_id,
        }
    }
}

/// One frame as walked: its code object (pointer, identity, and the id of the record that
/// read it, 0 when unresolved), its instruction in code units, and its owner.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawPyFrame {
    pub code: u64,
    pub ident: u64,
    pub capture: u64,
    /// Code units from the code's first instruction (3.10: `f_lasti`, -1 before the
    /// first); negative while the frame has not started.
    pub unit: i32,
    pub owner: u32,
}
const _: () = assert!(size_of::<RawPyFrame>() == 32);

/// Bits of [`CodeHead::flags`]: why the code object cannot name a frame (or, for
/// [`code_flags::LINETABLE_TOO_LONG`] alone, why its line table is not in the record).
pub mod code_flags {
    /// Its `ob_type` is not `PyCode_Type`.
    pub const NOT_CODE: u32 = 1 << 0;
    /// A read failed (a page not resident): not remembered as read, so the next call
    /// reads the code object again.
    pub const READ_FAULT: u32 = 1 << 1;
    /// The file name or qualified name is not a compact string, or longer than kept.
    pub const BAD_NAME: u32 = 1 << 2;
    /// The line table is longer than [`super::LINETABLE_CAP`]: not sent (its address is
    /// in [`super::CodeHead::objects`]); the code object still names its frames.
    pub const LINETABLE_TOO_LONG: u32 = 1 << 3;
}

/// A code object, read once and named by its `capture` id in stack frames: the record's
/// head; `filename_len` bytes of the file name, `qualname_len` of the qualified name (each
/// in its string kind: 1, 2 or 4 bytes a character) and `linetable_len` of the line table
/// follow it ([`CodeEvent::data`]), and only those bytes are sent. `header.flags` is the
/// interpreter's minor version (its line-table format).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeHead {
    pub header: EventHeader,
    pub capture: u64,
    pub code: u64,
    pub ident: u64,
    pub first_line: i32,
    /// `_co_firsttraceable` (3.11+): frames before it have not started; -1 on 3.10.
    pub first_traceable: i32,
    /// Bits of [`code_flags`].
    pub flags: u32,
    pub filename_len: u32,
    pub qualname_len: u32,
    pub linetable_len: u32,
    pub filename_kind: u32,
    pub qualname_kind: u32,
    /// The file name, qualified name and line table objects: where a read failed
    /// ([`code_flags::READ_FAULT`], a page not resident), userspace reads them through
    /// `/proc/PID/mem`, which faults the pages in, and the next call reads the code object
    /// whole.
    pub objects: [u64; 3],
}
const _: () = assert!(size_of::<CodeHead>() == 24 + 24 + 32 + 24);

/// A [`CodeHead`] and the bytes it describes, as the probe fills it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeEvent {
    pub head: CodeHead,
    pub data: [u8; CODE_DATA_LEN],
}
const _: () = assert!(size_of::<CodeEvent>() == size_of::<CodeHead>() + CODE_DATA_LEN);

/// Per-CPU counters of the stack programs (`STACK_COUNTERS`).
pub mod stack_counter {
    /// A stack record found the ring buffer full.
    pub const RING_FULL: u32 = 0;
    /// A code record found the ring buffer full.
    pub const CODE_RING_FULL: u32 = 1;
    /// The per-CPU scratch held another call's walk (a preempted program): dropped.
    pub const CLOBBERED: u32 = 2;
    /// Code objects read.
    pub const CAPTURES: u32 = 3;
    /// Frames walked.
    pub const FRAMES: u32 = 4;
    /// Reads of the traced process's memory (`bpf_probe_read_user`), each window read one.
    pub const MEMORY_READS: u32 = 5;
    /// Of those, reads that failed: a page not mapped (or not resident). Each costs about
    /// as much as ten reads that succeed, in the kernel's fault handling.
    pub const READ_FAULTS: u32 = 6;
    /// Bytes those reads asked for (a window's whole length, 8 or 4 for one field).
    pub const MEMORY_READ_BYTES: u32 = 7;
    pub const COUNT: u32 = 8;
}

#[cfg(test)]
mod tests {
    use super::RateBucket;

    /// Calls admitted of `calls` made `gap_ns` apart from `start_ns`, by a new bucket.
    fn admitted(rate: u32, start_ns: u64, gap_ns: u64, calls: u64) -> u64 {
        let mut bucket = RateBucket::full(rate, start_ns);
        (0..calls)
            .filter(|call| bucket.take(rate, start_ns + call * gap_ns))
            .count() as u64
    }

    #[test]
    fn a_burst_gets_the_bucket_and_what_refilled_meanwhile() {
        // 1,000 calls 10 µs apart (10 ms): 10 at 10 a second, none refilled yet.
        assert_eq!(admitted(10, 5_000, 10_000, 1_000), 10);
        // 1,000 calls 1 ms apart (1 s): 10, then one each 100 ms: 9 more by 999 ms.
        assert_eq!(admitted(10, 5_000, 1_000_000, 1_000), 19);
        // A rate that does not divide a second: 3 a second, calls each 100 ms for 2 s:
        // 3, then one each 333.3 ms (at 400, 700, 1000, 1400, 1700 ms).
        assert_eq!(admitted(3, 0, 100_000_000, 20), 8);
        // The top rate, calls each µs for 2 s: the million, then one per µs.
        assert_eq!(admitted(1_000_000, 0, 1_000, 2_000_000), 2_000_000);
    }

    #[test]
    fn a_long_pause_refills_the_bucket_and_no_more() {
        let mut bucket = RateBucket::full(2, 0);
        assert!(bucket.take(2, 0) && bucket.take(2, 0) && !bucket.take(2, 0));
        // An hour later: full again (2), not 7,200.
        let hour = 3_600 * 1_000_000_000;
        assert_eq!((0..5).filter(|_| bucket.take(2, hour)).count(), 2);
        // The clock going back refills nothing and keeps the latest time.
        assert!(!bucket.take(2, hour - 1_000_000_000));
        assert_eq!(bucket.last_ns, hour);
    }
}
