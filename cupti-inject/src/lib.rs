//! cudatrace's CUDA injection library, `libcudatrace_inject.so`.
//!
//! `cudatrace run --gpu` names it in `CUDA_INJECTION64_PATH`; libcuda loads it and calls
//! [`InitializeInjection`] at `cuInit`. It loads libcupti at run time, enables kernel, copy
//! and memset activity (plus the API records of the driver calls that issue them, to link
//! each GPU record to its call), and hands every record, converted to
//! [`tracer_common::GpuRecord`], to [`cudatrace_gpu_records`]: a no-op that cudatrace's
//! uprobe reads. docs/gpu.md describes the records and the environment variables.

mod cbids;
mod convert;
mod cupti;
mod sender;

use std::alloc::{Layout, alloc, dealloc};
use std::ffi::c_int;
use std::fs::{File, OpenOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use tracer_common::{GpuRecord, gpu_flags, gpu_record, gpu_stage};

use crate::cupti::{
    Activity, CUPTI_ERROR_MAX_LIMIT_REACHED, CUPTI_SUCCESS, CUcontext, CUptiResult, Cupti,
    FLUSH_FORCED, LoadError, THREAD_ID_TYPE_SYSTEM, activity_kind,
};
use crate::sender::{Sender, Sink};

/// libcupti to load; unset: the loader's search for `libcupti.so.13`, then `libcupti.so`.
pub const ENV_CUPTI: &str = "CUDATRACE_CUPTI";
/// Also append every record sent, as a JSON line, to this file (tests, GPU smoke checks).
pub const ENV_DEBUG_FILE: &str = "CUDATRACE_INJECT_DEBUG_FILE";
/// Another injection library to start after this one (a user's own `CUDA_INJECTION64_PATH`).
pub const ENV_CHAIN: &str = "CUDATRACE_INJECT_CHAIN";
/// `0`: errors go only to cudatrace, not also to the program's stderr.
pub const ENV_STDERR: &str = "CUDATRACE_INJECT_STDERR";

/// How often CUPTI is asked for completed buffers.
const FLUSH_PERIOD: Duration = Duration::from_millis(200);
/// Bytes per activity buffer handed to CUPTI (about 19,000 kernel records).
const BUFFER_BYTES: usize = 4 << 20;
/// CUPTI wants buffers aligned to its record alignment.
const BUFFER_ALIGN: usize = 8;
/// The activity kinds enabled, in order; all or none.
const ACTIVITY_KINDS: [(u32, &str); 3] = [
    (activity_kind::CONCURRENT_KERNEL, "kernel"),
    (activity_kind::MEMCPY, "memcpy"),
    (activity_kind::MEMSET, "memset"),
];

/// cudatrace's uprobe sits on this function and copies `count` records from `records` into
/// its ring buffer. It does nothing itself; it must only exist and be called.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn cudatrace_gpu_records(records: *const GpuRecord, count: u32) {
    // An opaque use of both arguments: the call cannot be proven useless and dropped.
    std::hint::black_box((records, count));
}

/// Called by libcuda at `cuInit` when this library is named in `CUDA_INJECTION64_PATH`.
/// Always returns 1 (success, as NVIDIA's samples do): a failure here is reported to
/// cudatrace, never allowed to break the program.
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjection() -> c_int {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if !STARTED.swap(true, Ordering::SeqCst) && std::panic::catch_unwind(start).is_err() {
        eprintln!("cudatrace-inject: internal error: GPU activity is not recorded");
    }
    1
}

/// The batches' destination: the uprobed function.
struct Uprobe;

impl Sink for Uprobe {
    fn send(&mut self, batch: &[GpuRecord]) {
        cudatrace_gpu_records(batch.as_ptr(), batch.len() as u32);
    }
}

static SENDER: Mutex<Option<Sender<Uprobe>>> = Mutex::new(None);

/// CUPTI, once loaded and set up.
struct Session {
    cupti: Cupti,
    /// [`gpu_flags::CUPTI_CLOCK`] when records are on CUPTI's clock, else 0.
    clock_flags: u32,
    /// The process that started the session: a forked child must not touch CUPTI.
    pid: u32,
}

static SESSION: OnceLock<Session> = OnceLock::new();

/// Whether the periodic flush has stopped (set at exit); held while flushing.
static FLUSH_STOPPED: Mutex<bool> = Mutex::new(false);
static FLUSH_WAKE: Condvar = Condvar::new();

fn sender() -> MutexGuard<'static, Option<Sender<Uprobe>>> {
    SENDER.lock().unwrap_or_else(|e| e.into_inner())
}

/// A failure, reported as an ERROR record and on stderr.
struct Failure {
    stage: u32,
    result: CUptiResult,
    detail: u32,
    fatal: bool,
    message: String,
}

fn report(sender: &mut Sender<Uprobe>, failure: Failure) {
    if std::env::var_os(ENV_STDERR).is_none_or(|v| v != "0") {
        eprintln!("cudatrace-inject: {}", failure.message);
    }
    let record = GpuRecord {
        what: gpu_record::ERROR,
        flags: if failure.fatal { gpu_flags::FATAL } else { 0 },
        stage: failure.stage,
        result: failure.result,
        detail: failure.detail,
        ..GpuRecord::default()
    };
    sender.push_text(record, &failure.message);
}

fn report_now(failure: Failure) {
    if let Some(sender) = sender().as_mut() {
        report(sender, failure);
    }
}

fn start() {
    let debug = std::env::var_os(ENV_DEBUG_FILE).and_then(|path| {
        open_debug(&path)
            .map_err(|e| {
                eprintln!(
                    "cudatrace-inject: cannot open {}: {e}",
                    path.to_string_lossy()
                )
            })
            .ok()
    });
    *sender() = Some(Sender::new(Uprobe, debug));
    if let Err(failure) = start_cupti() {
        report_now(failure);
    }
    chain();
    if let Some(sender) = sender().as_mut() {
        sender.flush();
    }
}

fn open_debug(path: &std::ffi::OsStr) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Loads and sets up CUPTI; an error stops GPU recording in this process.
fn start_cupti() -> Result<(), Failure> {
    let path = std::env::var(ENV_CUPTI).ok().filter(|p| !p.is_empty());
    let cupti = Cupti::load(path.as_deref()).map_err(|error| match error {
        LoadError::NotLoadable(why) => Failure {
            stage: gpu_stage::LOAD_CUPTI,
            result: 0,
            detail: 0,
            fatal: true,
            message: format!("cannot load libcupti ({why}): GPU activity is not recorded"),
        },
        LoadError::MissingFunction { path, function } => Failure {
            stage: gpu_stage::MISSING_FUNCTION,
            result: 0,
            detail: 0,
            fatal: true,
            message: format!("{path} has no {function}: GPU activity is not recorded"),
        },
    })?;

    let mut version = 0;
    // SAFETY: CUPTI writes one u32.
    unsafe { (cupti.get_version)(&mut version) };
    // SAFETY: a plain setting.
    let rc = unsafe { (cupti.set_thread_id_type)(THREAD_ID_TYPE_SYSTEM) };
    if rc != CUPTI_SUCCESS {
        report_now(Failure {
            stage: gpu_stage::THREAD_ID_TYPE,
            result: rc,
            detail: THREAD_ID_TYPE_SYSTEM,
            fatal: false,
            message: format!(
                "cuptiSetThreadIdType(SYSTEM) failed: {}: GPU records cannot be linked to calls by thread",
                cupti.result_string(rc)
            ),
        });
    }
    let callback = match cupti.register_timestamp_callback {
        // SAFETY: the callback is a plain function, valid for the life of the process.
        Some(register) => match unsafe { register(monotonic_ns) } {
            CUPTI_SUCCESS => true,
            rc => {
                report_now(Failure {
                    stage: gpu_stage::TIMESTAMP_CALLBACK,
                    result: rc,
                    detail: 0,
                    fatal: false,
                    message: format!(
                        "cuptiActivityRegisterTimestampCallback failed: {}: timestamps are converted with clock pairs",
                        cupti.result_string(rc)
                    ),
                });
                false
            }
        },
        None => false,
    };
    let clock_flags = if callback { 0 } else { gpu_flags::CUPTI_CLOCK };
    if let Some(sender) = sender().as_mut() {
        let info = GpuRecord {
            what: gpu_record::INFO,
            flags: if callback {
                gpu_flags::TIMESTAMP_CALLBACK
            } else {
                0
            },
            detail: version,
            ..GpuRecord::default()
        };
        sender.push_text(info, &cupti.path);
        if !callback {
            send_clock_pair(&cupti, sender);
        }
    }
    let session = SESSION.get_or_init(|| Session {
        cupti,
        clock_flags,
        pid: std::process::id(),
    });
    let cupti = &session.cupti;

    // SAFETY: both callbacks are plain functions, valid for the life of the process.
    let rc = unsafe { (cupti.register_callbacks)(buffer_requested, buffer_completed) };
    if rc != CUPTI_SUCCESS {
        return Err(Failure {
            stage: gpu_stage::REGISTER_CALLBACKS,
            result: rc,
            detail: 0,
            fatal: true,
            message: format!(
                "cuptiActivityRegisterCallbacks failed: {}: GPU activity is not recorded",
                cupti.result_string(rc)
            ),
        });
    }
    for (index, (kind, what)) in ACTIVITY_KINDS.iter().enumerate() {
        // SAFETY: a plain setting.
        let rc = unsafe { (cupti.enable)(*kind) };
        if rc != CUPTI_SUCCESS {
            for (enabled, _) in &ACTIVITY_KINDS[..index] {
                // SAFETY: as above.
                unsafe { (cupti.disable)(*enabled) };
            }
            return Err(Failure {
                stage: gpu_stage::ENABLE_ACTIVITY,
                result: rc,
                detail: *kind,
                fatal: true,
                message: format!(
                    "CUPTI refused to record {what} activity: {}{}: GPU activity is not recorded",
                    cupti.result_string(rc),
                    remedy(rc)
                ),
            });
        }
    }
    enable_driver_api(cupti);

    // SAFETY: a plain function, run once at normal exit.
    unsafe { libc::atexit(at_exit) };
    if let Err(e) = std::thread::Builder::new()
        .name("cudatrace-flush".into())
        .spawn(flush_periodically)
    {
        report_now(Failure {
            stage: gpu_stage::FLUSH,
            result: 0,
            detail: 0,
            fatal: false,
            message: format!(
                "cannot start the flush thread ({e}): records arrive in 4 MiB buffers and at exit"
            ),
        });
    }
    Ok(())
}

/// What a user can do about a CUPTI refusal, if anything.
fn remedy(rc: CUptiResult) -> &'static str {
    match rc {
        35 => {
            " (GPU profiling is restricted to admin users: run as root, or load the nvidia \
             module with NVreg_RestrictProfilingToAdminUsers=0)"
        }
        39 => " (another CUPTI client, such as Nsight Systems or torch.profiler, is active)",
        _ => "",
    }
}

/// Enables the API records of the driver calls that issue GPU work.
fn enable_driver_api(cupti: &Cupti) {
    let Some(enable) = cupti.enable_driver_api else {
        report_now(Failure {
            stage: gpu_stage::MISSING_FUNCTION,
            result: 0,
            detail: 0,
            fatal: false,
            message: format!(
                "{} has no cuptiActivityEnableDriverApi: GPU records cannot be linked to their calls",
                cupti.path
            ),
        });
        return;
    };
    let mut refused = Vec::new();
    let mut first_rc = CUPTI_SUCCESS;
    for &(function, cbid) in cbids::LINKED_DRIVER_FUNCTIONS {
        // SAFETY: a plain setting.
        let rc = unsafe { enable(cbid, 1) };
        if rc != CUPTI_SUCCESS {
            if refused.is_empty() {
                first_rc = rc;
            }
            refused.push((function, cbid));
        }
    }
    if let Some(&(_, first_cbid)) = refused.first() {
        let names: Vec<&str> = refused.iter().map(|(name, _)| *name).collect();
        report_now(Failure {
            stage: gpu_stage::ENABLE_DRIVER_API,
            result: first_rc,
            detail: first_cbid,
            fatal: false,
            message: format!(
                "cuptiActivityEnableDriverApi failed for {} of {} functions ({}): {}: their GPU records cannot be linked to their calls",
                refused.len(),
                cbids::LINKED_DRIVER_FUNCTIONS.len(),
                names.join(", "),
                cupti.result_string(first_rc)
            ),
        });
    }
}

/// CLOCK_MONOTONIC in ns: the trace's clock, and CUPTI's once registered.
unsafe extern "C" fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// Pairs read for one CLOCK record: the tightest is kept.
const CLOCK_PAIR_TRIES: usize = 4;

/// Queues a CLOCK record: CUPTI's timestamp and CLOCK_MONOTONIC (the midpoint of two reads
/// around it), the tightest of [`CLOCK_PAIR_TRIES`] reads. A midpoint is off by up to half
/// the time between its two reads, and one read can be slow (the first touches pages for
/// the first time; the thread can be preempted): 16 µs off at `cuInit` under QEMU's TCG,
/// enough to put a call's CUPTI record before the call.
fn send_clock_pair(cupti: &Cupti, sender: &mut Sender<Uprobe>) {
    let mut tightest: Option<(u64, u64, u64)> = None;
    for _ in 0..CLOCK_PAIR_TRIES {
        let mut cupti_ns = 0;
        // SAFETY: reads the clocks only.
        let (before, rc, after) = unsafe {
            let before = monotonic_ns();
            let rc = (cupti.get_timestamp)(&mut cupti_ns);
            (before, rc, monotonic_ns())
        };
        if rc != CUPTI_SUCCESS {
            report(
                sender,
                Failure {
                    stage: gpu_stage::TIMESTAMP,
                    result: rc,
                    detail: 0,
                    fatal: false,
                    message: format!("cuptiGetTimestamp failed: {}", cupti.result_string(rc)),
                },
            );
            return;
        }
        let gap = after.saturating_sub(before);
        if tightest.is_none_or(|(best, _, _)| gap < best) {
            tightest = Some((gap, cupti_ns, before + gap / 2));
        }
    }
    if let Some((_, cupti_ns, monotonic)) = tightest {
        sender.push(GpuRecord {
            what: gpu_record::CLOCK,
            start: cupti_ns,
            end: monotonic,
            ..GpuRecord::default()
        });
    }
}

/// CUPTI asks for an empty buffer.
unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let layout = Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN).expect("a valid layout");
    // SAFETY: a non-zero size. A null result makes CUPTI drop records, which it counts.
    let memory = unsafe { alloc(layout) };
    // SAFETY: CUPTI passes valid out-pointers.
    unsafe {
        *buffer = memory;
        *size = if memory.is_null() { 0 } else { BUFFER_BYTES };
        *max = 0;
    }
}

/// CUPTI hands back a buffer of records: convert, send, free.
unsafe extern "C" fn buffer_completed(
    context: CUcontext,
    stream_id: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    let result = std::panic::catch_unwind(|| {
        // SAFETY: CUPTI's buffer with `valid` bytes of records.
        unsafe { deliver(context, stream_id, buffer, valid) }
    });
    if result.is_err() {
        eprintln!("cudatrace-inject: internal error while reading a CUPTI buffer");
    }
    let layout = Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN).expect("a valid layout");
    // SAFETY: allocated by buffer_requested with this layout.
    unsafe { dealloc(buffer, layout) };
}

/// # Safety
/// `buffer` holds `valid` bytes of CUPTI activity records.
unsafe fn deliver(context: CUcontext, stream_id: u32, buffer: *mut u8, valid: usize) {
    let Some(session) = SESSION.get() else {
        return;
    };
    let cupti = &session.cupti;
    let mut guard = sender();
    let Some(sender) = guard.as_mut() else {
        return;
    };
    let mut activity: *mut Activity = std::ptr::null_mut();
    loop {
        // SAFETY: CUPTI walks its own buffer.
        let rc = unsafe { (cupti.get_next_record)(buffer, valid, &mut activity) };
        if rc == CUPTI_ERROR_MAX_LIMIT_REACHED {
            break;
        }
        if rc != CUPTI_SUCCESS {
            report(
                sender,
                Failure {
                    stage: gpu_stage::READ_BUFFER,
                    result: rc,
                    detail: 0,
                    fatal: false,
                    message: format!(
                        "cuptiActivityGetNextRecord failed: {}: the rest of a buffer is lost",
                        cupti.result_string(rc)
                    ),
                },
            );
            break;
        }
        // SAFETY: a complete record, as CUPTI returned it.
        match unsafe { convert::convert(activity.cast(), session.clock_flags) } {
            convert::Converted::Record(record) => sender.push(record),
            // SAFETY: CUPTI's name is null or NUL-terminated.
            convert::Converted::Kernel { record, name } => unsafe {
                sender.push_kernel(record, name)
            },
            convert::Converted::Other(_) => {}
        }
    }
    let mut dropped = 0usize;
    // SAFETY: CUPTI writes one count.
    let rc = unsafe { (cupti.get_num_dropped_records)(context, stream_id, &mut dropped) };
    if rc != CUPTI_SUCCESS {
        report(
            sender,
            Failure {
                stage: gpu_stage::DROPPED_COUNT,
                result: rc,
                detail: 0,
                fatal: false,
                message: format!(
                    "cuptiActivityGetNumDroppedRecords failed: {}: CUPTI's losses are unknown",
                    cupti.result_string(rc)
                ),
            },
        );
    } else if dropped > 0 {
        sender.push(GpuRecord {
            what: gpu_record::DROPPED,
            dropped: dropped as u64,
            ..GpuRecord::default()
        });
    }
    sender.flush();
}

/// Asks CUPTI for completed buffers every [`FLUSH_PERIOD`] until exit.
fn flush_periodically() {
    let mut stopped = FLUSH_STOPPED.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        stopped = FLUSH_WAKE
            .wait_timeout(stopped, FLUSH_PERIOD)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        if *stopped {
            return;
        }
        flush(0);
    }
}

/// One flush; the caller holds [`FLUSH_STOPPED`], so exit waits for it.
fn flush(flag: u32) {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    let Some(session) = SESSION.get() else {
        return;
    };
    // SAFETY: callbacks were registered; CUPTI calls buffer_completed before returning.
    let rc = unsafe { (session.cupti.flush_all)(flag) };
    if rc != CUPTI_SUCCESS && !REPORTED.swap(true, Ordering::Relaxed) {
        report_now(Failure {
            stage: gpu_stage::FLUSH,
            result: rc,
            detail: flag,
            fatal: false,
            message: format!(
                "cuptiActivityFlushAll failed: {}",
                session.cupti.result_string(rc)
            ),
        });
    }
    if let Some(sender) = sender().as_mut() {
        if session.clock_flags != 0 {
            send_clock_pair(&session.cupti, sender);
        }
        sender.flush();
    }
}

/// At normal exit: stop the periodic flush, then force out every buffer, incomplete
/// records included, so a short program loses nothing. Registered after libcupti was
/// loaded, so it runs before libcupti's own teardown.
extern "C" fn at_exit() {
    let Some(session) = SESSION.get() else {
        return;
    };
    if session.pid != std::process::id() {
        // A forked child: CUPTI is not set up here, and the lock may be held forever.
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        let mut stopped = FLUSH_STOPPED.lock().unwrap_or_else(|e| e.into_inner());
        *stopped = true;
        FLUSH_WAKE.notify_all();
        flush(FLUSH_FORCED);
    });
}

/// Starts the injection library named in [`ENV_CHAIN`], as libcuda would have.
fn chain() {
    let Some(path) = std::env::var_os(ENV_CHAIN).filter(|p| !p.is_empty()) else {
        return;
    };
    let shown = path.to_string_lossy().into_owned();
    // SAFETY: loading runs the library's initialisers, as libcuda's loading would.
    let library = match unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_LOCAL) } {
        Ok(library) => library,
        Err(e) => {
            report_now(Failure {
                stage: gpu_stage::CHAIN,
                result: 0,
                detail: 0,
                fatal: false,
                message: format!("cannot load the chained injection library {shown}: {e}"),
            });
            return;
        }
    };
    // SAFETY: the injection entry point's signature, `int InitializeInjection(void)`.
    match unsafe { library.get::<unsafe extern "C" fn() -> c_int>(b"InitializeInjection\0") } {
        Ok(initialize) => {
            // SAFETY: as libcuda calls it.
            unsafe { initialize() };
        }
        Err(e) => report_now(Failure {
            stage: gpu_stage::CHAIN,
            result: 0,
            detail: 0,
            fatal: false,
            message: format!(
                "the chained injection library {shown} has no InitializeInjection: {e}"
            ),
        }),
    }
    // It stays loaded for the life of the process, as libcuda would keep it.
    std::mem::forget(library);
}
