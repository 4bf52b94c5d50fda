//! CUPTI's activity buffers: handed out on request, read back when complete, every record
//! converted and sent, the buffer freed.

use std::alloc::{Layout, alloc, dealloc};
use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard, OnceLock};

use tracer_common::{GpuRecord, gpu_record, gpu_stage};

use crate::convert::{self, Converted};
use crate::cupti::{Activity, CUPTI_ERROR_MAX_LIMIT_REACHED, CUPTI_SUCCESS, CUcontext};
use crate::env;
use crate::outbox::{Failure, Outbox, Uprobe, report};
use crate::sender::Sender;
use crate::session::Session;

/// Bytes per buffer by default (about 19,000 kernel records).
const DEFAULT_BUFFER_BYTES: usize = 4 << 20;
/// CUPTI wants buffers aligned to its record alignment.
const BUFFER_ALIGN: usize = 8;

/// The buffers handed to CUPTI and those it handed back.
pub struct Buffers {
    /// The buffers' layout, fixed at the first request ([`env::BUFFER_KIB`], 64 KiB at
    /// least).
    layout: OnceLock<Layout>,
    /// The buffers this library handed to CUPTI and has not had back: only these are freed.
    /// A buffer another client of the program handed out can come back through this
    /// library's callback (CUPTI keeps one callback per process): its records are read, its
    /// memory is left to its owner.
    ours: Mutex<Option<HashSet<usize>>>,
    /// Completed buffers not read yet: CUPTI's callback only queues them, so that reading,
    /// converting and sending (about a record per launch) is never done while CUPTI may
    /// hold its own locks against the program's launches.
    completed: Mutex<Vec<Completed>>,
}

/// A completed buffer, waiting to be read outside CUPTI's callback.
pub struct Completed {
    context: usize,
    stream_id: u32,
    buffer: usize,
    valid: usize,
}

impl Buffers {
    pub const fn new() -> Self {
        Buffers {
            layout: OnceLock::new(),
            ours: Mutex::new(None),
            completed: Mutex::new(Vec::new()),
        }
    }

    fn layout(&self) -> Layout {
        *self.layout.get_or_init(|| {
            let bytes = env::number(env::BUFFER_KIB)
                .map_or(DEFAULT_BUFFER_BYTES, |kib| (kib as usize).max(64) << 10);
            Layout::from_size_align(bytes, BUFFER_ALIGN).expect("a valid layout")
        })
    }

    fn ours(&self) -> MutexGuard<'_, Option<HashSet<usize>>> {
        self.ours.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// CUPTI asks for an empty buffer: its address and size; null and 0 when none could be
    /// allocated (CUPTI then drops records, which it counts).
    pub fn request(&self) -> (*mut u8, usize) {
        let layout = self.layout();
        // SAFETY: a non-zero size.
        let memory = unsafe { alloc(layout) };
        if memory.is_null() {
            return (memory, 0);
        }
        self.ours()
            .get_or_insert_with(HashSet::new)
            .insert(memory as usize);
        (memory, layout.size())
    }

    /// CUPTI hands back a buffer of records: queued for [`Buffers::read_completed`].
    ///
    /// # Safety
    /// `buffer` is not null and holds `valid` bytes of CUPTI activity records, left to this
    /// library until read.
    pub unsafe fn complete(
        &self,
        context: CUcontext,
        stream_id: u32,
        buffer: *mut u8,
        valid: usize,
    ) {
        self.completed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Completed {
                context: context as usize,
                stream_id,
                buffer: buffer as usize,
                valid,
            });
    }

    /// Reads, converts, sends and frees every completed buffer (the flush thread's, and the
    /// exit flush's, after CUPTI returned).
    pub fn read_completed(&self, session: &Session, outbox: &Outbox) {
        self.drain(|completed, ours| {
            // SAFETY: handed over by CUPTI through `complete`.
            unsafe { completed.deliver(session, outbox, ours) }
        });
    }

    /// Hands every completed buffer to `read` (with whether it is the library's own), then
    /// frees the library's own.
    fn drain(&self, mut read: impl FnMut(&Completed, bool)) {
        let completed =
            std::mem::take(&mut *self.completed.lock().unwrap_or_else(|e| e.into_inner()));
        for buffer in completed {
            let ours = self
                .ours()
                .as_mut()
                .is_some_and(|set| set.remove(&buffer.buffer));
            if catch_unwind(AssertUnwindSafe(|| read(&buffer, ours))).is_err() {
                eprintln!("cudatrace-inject: internal error while reading a CUPTI buffer");
            }
            if ours {
                // SAFETY: allocated by `request` with this layout.
                unsafe { dealloc(buffer.buffer as *mut u8, self.layout()) };
            }
        }
    }
}

impl Completed {
    /// Converts and sends every record, then CUPTI's count of records it dropped.
    ///
    /// # Safety
    /// The buffer holds `valid` bytes of CUPTI activity records.
    unsafe fn deliver(&self, session: &Session, outbox: &Outbox, ours: bool) {
        let mut guard = outbox.lock();
        let Some(sender) = guard.as_mut() else {
            return;
        };
        // SAFETY: the caller's promise.
        let kinds = unsafe { self.send_records(session, sender) };
        let dropped = self.dropped(session, sender);
        if env::is_verbose() {
            let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k}:{n}")).collect();
            eprintln!(
                "cudatrace-inject: {} buffer {:p}, {} bytes, records by kind {{{}}}, dropped {}",
                if ours { "own" } else { "foreign" },
                self.buffer as *const u8,
                self.valid,
                kinds.join(" "),
                dropped.unwrap_or(0)
            );
        }
        if let Some(dropped) = dropped.filter(|&n| n > 0) {
            sender.push(GpuRecord {
                what: gpu_record::DROPPED,
                dropped: dropped as u64,
                ..GpuRecord::default()
            });
        }
        sender.flush();
    }

    /// Converts and queues every record; how many of each kind there were.
    ///
    /// # Safety
    /// As [`Completed::deliver`].
    unsafe fn send_records(
        &self,
        session: &Session,
        sender: &mut Sender<Uprobe>,
    ) -> Vec<(u32, u64)> {
        let cupti = &session.cupti;
        let per_subscriber = session.per_subscriber();
        let buffer = self.buffer as *mut u8;
        let mut activity: *mut Activity = std::ptr::null_mut();
        let mut kinds: Vec<(u32, u64)> = Vec::new();
        loop {
            // SAFETY: CUPTI walks its own buffer.
            let rc = unsafe {
                match per_subscriber {
                    Some((subscriber, api)) => {
                        (api.get_next_record)(subscriber, buffer, self.valid, &mut activity)
                    }
                    None => (cupti.get_next_record)(buffer, self.valid, &mut activity),
                }
            };
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
            // SAFETY: every record starts with its kind.
            let kind = unsafe { activity.cast::<u32>().read_unaligned() };
            match kinds.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((kind, 1)),
            }
            // SAFETY: a complete record, as CUPTI returned it.
            match unsafe { convert::convert(activity.cast(), session.clock_flags) } {
                Converted::Record(record) => sender.push(record),
                // SAFETY: CUPTI's name is null or NUL-terminated.
                Converted::Kernel { record, name } => unsafe { sender.push_kernel(record, name) },
                // Enabled for diagnostics alone (`CUDATRACE_INJECT_LATE_RUNTIME`): written to
                // the debug file, marked `detail` 5, never sent.
                Converted::Other(crate::cupti::activity_kind::RUNTIME) => {
                    // SAFETY: a RUNTIME record has the API record's layout.
                    let mut record = unsafe { convert::api_record(activity.cast(), 0) };
                    record.detail = crate::cupti::activity_kind::RUNTIME;
                    sender.debug_only(&record);
                }
                Converted::Other(_) => {}
            }
        }
        kinds
    }

    /// CUPTI's count of records it dropped for this buffer's context and stream; `None`
    /// (reported) where it could not say.
    fn dropped(&self, session: &Session, sender: &mut Sender<Uprobe>) -> Option<usize> {
        let cupti = &session.cupti;
        let context = self.context as CUcontext;
        let mut dropped = 0usize;
        // SAFETY: CUPTI writes one count.
        let rc = unsafe {
            match session.per_subscriber() {
                Some((subscriber, api)) => {
                    (api.get_num_dropped_records)(subscriber, context, self.stream_id, &mut dropped)
                }
                None => (cupti.get_num_dropped_records)(context, self.stream_id, &mut dropped),
            }
        };
        if rc == CUPTI_SUCCESS {
            return Some(dropped);
        }
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
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_ours(buffers: &Buffers, buffer: *mut u8) -> bool {
        buffers
            .ours()
            .as_ref()
            .is_some_and(|set| set.contains(&(buffer as usize)))
    }

    #[test]
    fn only_the_librarys_own_buffers_are_freed() {
        let buffers = Buffers::new();
        let (buffer, size) = buffers.request();
        assert!(!buffer.is_null() && size == buffers.layout().size() && is_ours(&buffers, buffer));
        // Another client's buffer, handed to this library's callback.
        let foreign = Box::into_raw(Box::new([7u8; 64])).cast::<u8>();
        // SAFETY: both are buffers with no records.
        unsafe {
            buffers.complete(std::ptr::null_mut(), 0, buffer, 0);
            buffers.complete(std::ptr::null_mut(), 0, foreign, 0);
        }
        let mut read = Vec::new();
        buffers.drain(|completed, ours| read.push((completed.buffer, ours)));
        assert_eq!(read, [(buffer as usize, true), (foreign as usize, false)]);
        assert!(!is_ours(&buffers, buffer), "freed, and forgotten");
        // Still its owner's: reading and dropping it is sound (freed here, once).
        // SAFETY: the Box's own pointer, not freed by drain.
        let foreign = unsafe { Box::from_raw(foreign.cast::<[u8; 64]>()) };
        assert_eq!(foreign[63], 7);
    }
}
