//! The one [`Sender`] every thread of the library sends through (the uprobed function at
//! its end), and failures: an ERROR record, and a line on the program's stderr.

use std::sync::{Mutex, MutexGuard};

use tracer_common::{GpuRecord, gpu_flags, gpu_record};

use crate::clock::monotonic_ns;
use crate::cudatrace_gpu_records;
use crate::cupti::CUptiResult;
use crate::env;
use crate::sender::{Sender, Sink};

/// The batches' destination: the uprobed function.
pub struct Uprobe;

impl Sink for Uprobe {
    fn send(&mut self, batch: &[GpuRecord]) {
        cudatrace_gpu_records(batch.as_ptr(), batch.len() as u32);
    }
}

/// The sender, once the library started; nothing is sent before.
pub struct Outbox(Mutex<Option<Sender<Uprobe>>>);

impl Outbox {
    pub const fn new() -> Self {
        Outbox(Mutex::new(None))
    }

    /// Sends through `sender` from now on.
    pub fn open(&self, sender: Sender<Uprobe>) {
        *self.lock() = Some(sender);
    }

    /// The sender, locked (`None` before [`Outbox::open`]).
    pub fn lock(&self) -> MutexGuard<'_, Option<Sender<Uprobe>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reports `failure` now (the sender is not locked by the caller).
    pub fn report(&self, failure: Failure) {
        if let Some(sender) = self.lock().as_mut() {
            report(sender, failure);
        }
    }

    /// A CLIENT record (`tracer_common::client`), sent at once.
    pub fn send_client(&self, what: u32) {
        if let Some(sender) = self.lock().as_mut() {
            sender.push(client_record(what));
            sender.flush();
        }
    }

    /// Sends what is queued.
    pub fn flush(&self) {
        if let Some(sender) = self.lock().as_mut() {
            sender.flush();
        }
    }
}

/// A CLIENT record stamped now.
pub fn client_record(what: u32) -> GpuRecord {
    GpuRecord {
        what: gpu_record::CLIENT,
        detail: what,
        start: monotonic_ns(),
        ..GpuRecord::default()
    }
}

/// A failure, reported as an ERROR record and on stderr.
pub struct Failure {
    pub stage: u32,
    pub result: CUptiResult,
    pub detail: u32,
    pub fatal: bool,
    pub message: String,
}

impl Failure {
    /// A failure that is not CUPTI's (no result code, no detail).
    pub fn plain(stage: u32, fatal: bool, message: String) -> Failure {
        Failure {
            stage,
            result: 0,
            detail: 0,
            fatal,
            message,
        }
    }
}

/// Reports `failure` through `sender`, which the caller holds.
pub fn report(sender: &mut Sender<Uprobe>, failure: Failure) {
    if env::errors_on_stderr() {
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
