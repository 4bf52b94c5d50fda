//! cudatrace's CUDA injection library, `libcudatrace_inject.so`.
//!
//! `cudatrace run --gpu` names it in `CUDA_INJECTION64_PATH`; libcuda loads it and calls
//! [`InitializeInjection`] at `cuInit`. It loads libcupti at run time, enables kernel, copy
//! and memset activity (plus the API records of the driver calls that issue them, to link
//! each GPU record to its call), and hands every record, converted to
//! [`tracer_common::GpuRecord`], to [`cudatrace_gpu_records`]: a no-op that cudatrace's
//! uprobe reads. docs/gpu.md describes the records and the environment variables.
//!
//! | file | |
//! |---|---|
//! | `session.rs` | loading CUPTI, the single- or multi-subscriber set-up, taking CUPTI (again) |
//! | `buffers.rs` | CUPTI's buffers: handed out, read back, converted, sent |
//! | `flush.rs` | the flush thread, the exit flush, the clocks |
//! | `control.rs` | living beside another CUPTI client: yielding and resuming as cudatrace says |
//! | `convert.rs`, `cupti.rs`, `cbids.rs`, `sender.rs` | records, CUPTI's declarations, the driver functions, batches |

mod buffers;
mod cbids;
mod control;
mod convert;
mod cupti;
mod flush;
mod sender;
mod session;

use std::ffi::c_int;
use std::fs::{File, OpenOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use tracer_common::{GpuRecord, gpu_flags, gpu_record, gpu_stage};

use crate::cupti::CUptiResult;
use crate::sender::{Sender, Sink};

/// libcupti to load; unset: the loader's search for `libcupti.so.13`, then `libcupti.so`.
pub const ENV_CUPTI: &str = "CUDATRACE_CUPTI";
/// Also append every record sent, as a JSON line, to this file (tests, GPU smoke checks).
pub const ENV_DEBUG_FILE: &str = "CUDATRACE_INJECT_DEBUG_FILE";
/// Another injection library to start after this one (a user's own `CUDA_INJECTION64_PATH`).
pub const ENV_CHAIN: &str = "CUDATRACE_INJECT_CHAIN";
/// `0`: errors go only to cudatrace, not also to the program's stderr.
pub const ENV_STDERR: &str = "CUDATRACE_INJECT_STDERR";
/// cudatrace's control file: a `u32` per pid saying whether another CUPTI client of the
/// process holds the activity API (`control.rs`). Unset: the library never yields.
pub const ENV_CONTROL: &str = "CUDATRACE_INJECT_CONTROL";
/// How often CUPTI is asked for completed buffers, in ms (default 200).
pub const ENV_FLUSH_MS: &str = "CUDATRACE_INJECT_FLUSH_MS";
/// Bytes per activity buffer handed to CUPTI, in KiB (default 4096).
pub const ENV_BUFFER_KIB: &str = "CUDATRACE_INJECT_BUFFER_KIB";
/// `1`: say on stderr what each buffer held and how CUPTI was taken back (diagnostics).
pub const ENV_VERBOSE: &str = "CUDATRACE_INJECT_VERBOSE";

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

/// A whole number from the environment, where set and valid.
fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
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
    if let Err(failure) = session::start_cupti() {
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
