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

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tracer_common::{GpuRecord, client, gpu_record, gpu_stage};

use crate::flush::{clock_ns, monotonic_ns};
use crate::session::{Mode, resume, session};
use crate::{ENV_CONTROL, Failure, report_now, sender};

/// This process's slot in cudatrace's control file.
static SLOT: OnceLock<&'static AtomicU32> = OnceLock::new();
/// The slot's value the library last acted on.
static SEEN: AtomicU32 = AtomicU32::new(0);
/// Another client holds the activity API: the library does not flush.
static YIELDED: AtomicBool = AtomicBool::new(false);
/// Taking CUPTI back failed: the library stays out for good.
static GAVE_UP: AtomicBool = AtomicBool::new(false);

/// Maps this process's slot of the control file, where cudatrace named one (single
/// subscriber only: with a subscriber of its own the library never yields).
pub fn open() {
    let Some(session) = session() else { return };
    if matches!(session.mode, Mode::Multi(_)) {
        return;
    }
    let Some(path) = std::env::var_os(ENV_CONTROL).filter(|p| !p.is_empty()) else {
        return;
    };
    match map_slot(&path) {
        Ok(slot) => {
            SEEN.store(slot.load(Ordering::Acquire), Ordering::Relaxed);
            let _ = SLOT.set(slot);
        }
        Err(e) => report_now(Failure {
            stage: gpu_stage::CONTROL,
            result: 0,
            detail: 0,
            fatal: false,
            message: format!(
                "cannot map cudatrace's control file {} ({e}): GPU recording cannot yield to \
                 another CUPTI client of the program",
                path.to_string_lossy()
            ),
        }),
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

/// At start: whether another client holds CUPTI already (it took it before `cuInit`);
/// then the library starts yielded.
pub fn start_yielded() -> bool {
    let Some(slot) = SLOT.get() else {
        return false;
    };
    let value = slot.load(Ordering::Acquire);
    if value & 1 == 0 {
        return false;
    }
    SEEN.store(value, Ordering::Relaxed);
    YIELDED.store(true, Ordering::Release);
    send(client::YIELDED);
    true
}

/// Whether the library is out of CUPTI's way (yielded, or gave up).
pub fn yielded() -> bool {
    YIELDED.load(Ordering::Acquire)
}

/// Whether cudatrace says another client holds the activity API now.
pub fn held_by_other() -> bool {
    SLOT.get()
        .is_some_and(|slot| slot.load(Ordering::Acquire) & 1 == 1)
}

/// Waits up to `timeout`, waking early when cudatrace changes the slot.
pub fn wait(timeout: Duration) {
    let Some(slot) = SLOT.get() else {
        std::thread::sleep(timeout);
        return;
    };
    let seen = SEEN.load(Ordering::Relaxed);
    if slot.load(Ordering::Acquire) != seen {
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

/// Acts on the slot's value: yields when another client took the activity API, resumes
/// when it let go. The flush thread's, under its lock.
pub fn follow() {
    let Some(slot) = SLOT.get() else { return };
    if GAVE_UP.load(Ordering::Relaxed) {
        return;
    }
    let value = slot.load(Ordering::Acquire);
    if value == SEEN.swap(value, Ordering::Relaxed) {
        return;
    }
    let held = value & 1 == 1;
    crate::session::verbose(format_args!(
        "control slot {value} (held {held}, yielded {})",
        yielded()
    ));
    if held && !yielded() {
        YIELDED.store(true, Ordering::Release);
        send(client::YIELDED);
    } else if !held {
        // Let go (perhaps taken and let go since the last look, unseen): CUPTI is taken back
        // either way, the other client may have replaced the callbacks and clock.
        let Some(session) = session() else { return };
        match resume(session) {
            Ok(()) => YIELDED.store(false, Ordering::Release),
            Err(failure) => {
                GAVE_UP.store(true, Ordering::Relaxed);
                report_now(failure);
            }
        }
    }
}

fn send(what: u32) {
    if let Some(sender) = sender().as_mut() {
        sender.push(GpuRecord {
            what: gpu_record::CLIENT,
            detail: what,
            start: monotonic_ns(),
            ..GpuRecord::default()
        });
        sender.flush();
    }
}

/// CUPTI's timestamp callback: CLOCK_MONOTONIC, the trace's clock; CLOCK_REALTIME while
/// another client holds the activity API (CUPTI's own clock, which that client expects
/// unless it registered a callback of its own).
pub unsafe extern "C" fn timestamp() -> u64 {
    if held_by_other() {
        clock_ns(libc::CLOCK_REALTIME)
    } else {
        monotonic_ns()
    }
}
