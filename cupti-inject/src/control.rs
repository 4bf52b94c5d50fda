//! Living beside another CUPTI client of the program (torch.profiler's Kineto, dynolog,
//! Nsight) where CUPTI allows one client at a time (before CUPTI 13.3 with driver r610).
//!
//! Such a client registers its own buffer callbacks (from then on every record is its own)
//! and, when it stops, disables the kinds it enabled and forces a flush. This library cannot
//! see those calls, but cudatrace's uprobes on libcupti do: cudatrace keeps a `u32` per pid
//! in a file of its own (`CUDATRACE_INJECT_CONTROL`, mapped read-only here), odd while
//! another client holds the activity API, and wakes the flush thread (a futex on the
//! shared page) when it changes. The flush thread then yields (stops flushing: the buffers
//! are the other client's) or resumes (takes CUPTI back: callbacks, clock, kinds), and says
//! so in a CLIENT record. Nothing in the program is changed or intercepted.
//!
//! After a late start (`cudatrace run -p PID --gpu`) the slot's [`DETACH`] bit asks the
//! library to stop recording: the window ended.
//!
//! This file reads the slot and keeps what the library did about it; the owner
//! (`injection.rs`) sends the records and takes CUPTI back.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::time::Duration;

use tracer_common::gpu_stage;

use crate::env::{self, verbose};
use crate::outbox::Failure;

/// The slot's bit that asks a library started late to stop recording (cudatrace's window
/// ended); the other bits count the other client's takes and releases.
pub const DETACH: u32 = 1 << 31;

/// This process's slot in cudatrace's control file, and where the library stands.
pub struct Control {
    /// The mapped slot; null: the library never yields. A late start maps the file of
    /// its run, in place of an earlier run's.
    slot: AtomicPtr<AtomicU32>,
    /// The slot's value the library last acted on.
    seen: AtomicU32,
    /// Another client holds the activity API: the library does not flush.
    yielded: AtomicBool,
    /// Taking CUPTI back failed: the library stays out for good.
    gave_up: AtomicBool,
}

/// What a change of the slot asks of the library.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Nothing to do.
    None,
    /// Another client took the activity API: the library yielded (a CLIENT record is due).
    Taken,
    /// The other client let go (perhaps taken and let go since the last look, unseen):
    /// CUPTI is to be taken back either way, the other client may have replaced the
    /// callbacks and clock.
    LetGo,
}

impl Control {
    pub const fn new() -> Self {
        Control {
            slot: AtomicPtr::new(std::ptr::null_mut()),
            seen: AtomicU32::new(0),
            yielded: AtomicBool::new(false),
            gave_up: AtomicBool::new(false),
        }
    }

    /// The mapped slot, if any.
    fn slot(&self) -> Option<&'static AtomicU32> {
        // SAFETY: null, or a slot in a mapping that is never unmapped.
        unsafe { self.slot.load(Ordering::Acquire).as_ref() }
    }

    /// Maps this process's slot of the control file, where cudatrace named one ([`env::CONTROL`]).
    /// At a late start, again for each run: the library starts out of no one's way.
    pub fn open(&self) -> Result<(), Failure> {
        let Some(path) = env::path(env::CONTROL) else {
            return Ok(());
        };
        match map_slot(&path) {
            Ok(slot) => {
                self.seen
                    .store(slot.load(Ordering::Acquire), Ordering::Relaxed);
                self.yielded.store(false, Ordering::Release);
                self.gave_up.store(false, Ordering::Relaxed);
                self.slot
                    .store(std::ptr::from_ref(slot).cast_mut(), Ordering::Release);
                Ok(())
            }
            Err(e) => Err(Failure::plain(
                gpu_stage::CONTROL,
                false,
                format!(
                    "cannot map cudatrace's control file {} ({e}): GPU recording cannot yield to \
                     another CUPTI client of the program",
                    path.to_string_lossy()
                ),
            )),
        }
    }

    /// At start: whether another client holds CUPTI already (it took it before `cuInit`);
    /// then the library starts yielded (a CLIENT record is due).
    pub fn start_yielded(&self) -> bool {
        let Some(slot) = self.slot() else {
            return false;
        };
        let value = slot.load(Ordering::Acquire) & !DETACH;
        if value & 1 == 0 {
            return false;
        }
        self.seen.store(value, Ordering::Relaxed);
        self.yielded.store(true, Ordering::Release);
        true
    }

    /// A late start found another client holding CUPTI: the library starts out of its way,
    /// as if cudatrace had said so (cudatrace marks the slot held when it hears).
    pub fn start_held(&self) {
        self.yielded.store(true, Ordering::Release);
    }

    /// Whether the library is out of CUPTI's way (yielded, or gave up).
    pub fn yielded(&self) -> bool {
        self.yielded.load(Ordering::Acquire)
    }

    /// Whether cudatrace says another client holds the activity API now.
    pub fn held_by_other(&self) -> bool {
        self.slot()
            .is_some_and(|slot| slot.load(Ordering::Acquire) & 1 == 1)
    }

    /// Whether cudatrace asks a library started late to stop recording.
    pub fn detach_asked(&self) -> bool {
        self.slot()
            .is_some_and(|slot| slot.load(Ordering::Acquire) & DETACH != 0)
    }

    /// Waits up to `timeout`, waking early when cudatrace changes the slot.
    pub fn wait(&self, timeout: Duration) {
        let Some(slot) = self.slot() else {
            std::thread::sleep(timeout);
            return;
        };
        let seen = self.seen.load(Ordering::Relaxed);
        let value = slot.load(Ordering::Acquire);
        if value != seen {
            if value & DETACH == 0 {
                return;
            }
            // Asked to stop: the owner acts on it; never a busy loop here.
            std::thread::sleep(timeout.min(Duration::from_millis(10)));
            return;
        }
        let time = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a shared (not private) futex wait on the mapped slot: cudatrace's
        // FUTEX_WAKE on its own mapping of the same file page wakes it.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                slot.as_ptr(),
                libc::FUTEX_WAIT,
                seen,
                &time as *const libc::timespec,
                std::ptr::null::<u32>(),
                0,
            )
        };
    }

    /// Reads the slot: yields when another client took the activity API, and says what
    /// is due. The flush thread's, under its lock.
    pub fn follow(&self) -> Change {
        let Some(slot) = self.slot() else {
            return Change::None;
        };
        if self.gave_up.load(Ordering::Relaxed) {
            return Change::None;
        }
        let value = slot.load(Ordering::Acquire) & !DETACH;
        if value == self.seen.swap(value, Ordering::Relaxed) & !DETACH {
            return Change::None;
        }
        let held = value & 1 == 1;
        verbose(format_args!(
            "control slot {value} (held {held}, yielded {})",
            self.yielded()
        ));
        if held && !self.yielded() {
            self.yielded.store(true, Ordering::Release);
            Change::Taken
        } else if !held {
            Change::LetGo
        } else {
            Change::None
        }
    }

    /// CUPTI was taken back after [`Change::LetGo`]: `false`, it failed, and the library
    /// stays out for good.
    pub fn resumed(&self, taken: bool) {
        if taken {
            self.yielded.store(false, Ordering::Release);
        } else {
            self.gave_up.store(true, Ordering::Relaxed);
        }
    }
}

fn map_slot(path: &std::ffi::OsStr) -> std::io::Result<&'static AtomicU32> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)?;
    let size = file.metadata()?.len() as usize;
    let offset = std::process::id() as usize * size_of::<u32>();
    if offset + size_of::<u32>() > size {
        return Err(std::io::Error::other("the pid is beyond the file's slots"));
    }
    // SAFETY: a read-only shared mapping of a regular file, kept for the life of the process.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: in the mapping, aligned (offset is a multiple of 4 in a page-aligned mapping);
    // cudatrace writes it with atomic stores.
    Ok(unsafe { &*(base.cast::<u8>().add(offset).cast::<AtomicU32>()) })
}
