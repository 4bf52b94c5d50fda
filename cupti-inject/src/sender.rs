//! Batches of [`GpuRecord`]s to cudatrace: kernel names interned once, texts kept alive
//! until their batch is sent, and, for tests, every record also written as a JSON line.

use std::collections::HashMap;
use std::ffi::{CStr, c_char};
use std::fs::File;
use std::io::Write;

use tracer_common::{GPU_BATCH_MAX, GPU_TEXT_LEN, GpuRecord, gpu_flags, gpu_record};

/// Where full batches go: `cudatrace_gpu_records` in the library, a recorder in tests.
pub trait Sink {
    fn send(&mut self, batch: &[GpuRecord]);
}

pub struct Sender<S: Sink> {
    sink: S,
    batch: Vec<GpuRecord>,
    /// Kernel name -> id. The boxed bytes never move or die: NAME records point at them.
    names: HashMap<Box<[u8]>, u32>,
    /// Texts of records in the pending batch (error messages), freed once it is sent.
    texts: Vec<Box<[u8]>>,
    debug: Option<File>,
    /// Batches without text are marked ([`gpu_flags::BATCH_WITHOUT_TEXT`]); off only for
    /// measuring the record-by-record copy ([`crate::env::UNMARKED`]).
    mark: bool,
}

impl<S: Sink> Sender<S> {
    pub fn new(sink: S, debug: Option<File>) -> Self {
        Sender {
            sink,
            batch: Vec::with_capacity(GPU_BATCH_MAX),
            names: HashMap::new(),
            texts: Vec::new(),
            debug,
            mark: true,
        }
    }

    /// For measuring: batches go unmarked, so the probe copies them record by record.
    pub fn unmarked(mut self) -> Self {
        self.mark = false;
        self
    }

    /// Queues a record without text.
    pub fn push(&mut self, record: GpuRecord) {
        self.debug_line(&record, None);
        self.batch.push(record);
        if self.batch.len() == GPU_BATCH_MAX {
            self.flush();
        }
    }

    /// Sends a record carrying `text` (an error message, the libcupti path) in a batch of
    /// its own, after what is queued: the probe copies a batch without text in one piece,
    /// and one with text record by record.
    pub fn push_text(&mut self, mut record: GpuRecord, text: &str) {
        let text: Box<[u8]> = text.as_bytes().into();
        attach_text(&mut record, &text);
        self.debug_line(&record, Some(&text));
        self.flush();
        self.texts.push(text);
        self.batch.push(record);
        self.flush();
    }

    /// Queues a kernel record with its name id, preceded by a NAME record the first time
    /// the name is seen. A null name gets id 0.
    ///
    /// # Safety
    /// `name` is null or a NUL-terminated string.
    pub unsafe fn push_kernel(&mut self, mut record: GpuRecord, name: *const c_char) {
        if !name.is_null() {
            // SAFETY: the caller's promise.
            let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
            record.name_id = self.name_id(bytes);
        }
        self.push(record);
    }

    fn name_id(&mut self, name: &[u8]) -> u32 {
        if let Some(&id) = self.names.get(name) {
            return id;
        }
        let id = self.names.len() as u32 + 1;
        let owned: Box<[u8]> = name.into();
        let mut record = GpuRecord {
            what: gpu_record::NAME,
            name_id: id,
            ..GpuRecord::default()
        };
        attach_text(&mut record, &owned);
        self.debug_line(&record, Some(&owned));
        // In a batch of its own, as [`Sender::push_text`]'s.
        self.flush();
        self.batch.push(record);
        self.flush();
        self.names.insert(owned, id);
        id
    }

    /// A new reader (a later attach's cudatrace) knows no name yet: each is sent again, with
    /// its NAME record, the next time a kernel carries it. What is queued goes out first.
    pub fn forget_names(&mut self) {
        self.flush();
        self.names.clear();
    }

    /// Writes `record` to the debug file only (diagnostics: records cudatrace does not read).
    pub fn debug_only(&mut self, record: &GpuRecord) {
        self.debug_line(record, None);
    }

    /// Sends what is queued. A batch of two or more records has none with text (those go
    /// alone): its first record says so, and the probe copies it whole.
    pub fn flush(&mut self) {
        if self.mark && self.batch.len() >= 2 {
            self.batch[0].flags |= gpu_flags::BATCH_WITHOUT_TEXT;
        }
        if !self.batch.is_empty() {
            self.sink.send(&self.batch);
            self.batch.clear();
        }
        self.texts.clear();
    }

    fn debug_line(&mut self, record: &GpuRecord, text: Option<&[u8]>) {
        let Some(file) = self.debug.as_mut() else {
            return;
        };
        let mut line = debug_json(record, text).to_string();
        line.push('\n');
        // One write per line: lines of several processes appending to one file stay whole.
        let _ = file.write_all(line.as_bytes());
    }

    #[cfg(test)]
    pub fn sink(&self) -> &S {
        &self.sink
    }
}

/// Points `record` at `text`, cut to [`GPU_TEXT_LEN`] bytes.
fn attach_text(record: &mut GpuRecord, text: &[u8]) {
    record.text = text.as_ptr() as u64;
    record.text_len = text.len().min(GPU_TEXT_LEN) as u32;
    record.text_full_len = text.len().min(u32::MAX as usize) as u32;
}

/// A record as the debug file shows it: every field, and the text as sent (cut).
pub fn debug_json(record: &GpuRecord, text: Option<&[u8]>) -> serde_json::Value {
    let text = text.map(|t| String::from_utf8_lossy(&t[..record.text_len as usize]).into_owned());
    serde_json::json!({
        "pid": std::process::id(),
        "what": record.what,
        "flags": record.flags,
        "start": record.start,
        "end": record.end,
        "correlation_id": record.correlation_id,
        "device_id": record.device_id,
        "context_id": record.context_id,
        "stream_id": record.stream_id,
        "bytes": record.bytes,
        "grid": record.grid,
        "block": record.block,
        "static_shared_mem": record.static_shared_mem,
        "dynamic_shared_mem": record.dynamic_shared_mem,
        "registers_per_thread": record.registers_per_thread,
        "name_id": record.name_id,
        "copy_kind": record.copy_kind,
        "src_kind": record.src_kind,
        "dst_kind": record.dst_kind,
        "memset_value": record.memset_value,
        "graph_id": record.graph_id,
        "copy_count": record.copy_count,
        "cbid": record.cbid,
        "result": record.result,
        "record_pid": record.pid,
        "tid": record.tid,
        "stage": record.stage,
        "detail": record.detail,
        "dropped": record.dropped,
        "text_len": record.text_len,
        "text_full_len": record.text_full_len,
        "text": text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records every batch, and the texts its records point at (read at send time, as the
    /// uprobe does).
    #[derive(Default)]
    struct Recorder {
        batches: Vec<Vec<(GpuRecord, Option<Vec<u8>>)>>,
    }

    impl Sink for Recorder {
        fn send(&mut self, batch: &[GpuRecord]) {
            self.batches.push(
                batch
                    .iter()
                    .map(|r| {
                        let text = (r.text_len > 0).then(|| unsafe {
                            std::slice::from_raw_parts(r.text as *const u8, r.text_len as usize)
                                .to_vec()
                        });
                        (*r, text)
                    })
                    .collect(),
            );
        }
    }

    fn kernel(correlation_id: u32) -> GpuRecord {
        GpuRecord {
            what: gpu_record::KERNEL,
            correlation_id,
            ..GpuRecord::default()
        }
    }

    /// Every record sent, in order: what, name id, correlation id, text.
    type Sent = Vec<(u32, u32, u32, Option<Vec<u8>>)>;

    fn sent(sender: &Sender<Recorder>) -> Sent {
        sender
            .sink()
            .batches
            .iter()
            .flatten()
            .map(|(r, t)| (r.what, r.name_id, r.correlation_id, t.clone()))
            .collect()
    }

    /// The sizes of the batches sent; a record with text is always alone in its batch (the
    /// probe copies a batch without text in one piece).
    fn sizes(sender: &Sender<Recorder>) -> Vec<usize> {
        for batch in &sender.sink().batches {
            if batch.iter().any(|(r, _)| r.text_len != 0) {
                assert_eq!(batch.len(), 1, "a record with text shared its batch");
            }
            let marked = batch[0].0.flags & gpu_flags::BATCH_WITHOUT_TEXT != 0;
            assert_eq!(marked, batch.len() >= 2);
        }
        sender.sink().batches.iter().map(Vec::len).collect()
    }

    fn name(id: u32, text: &[u8]) -> (u32, u32, u32, Option<Vec<u8>>) {
        (gpu_record::NAME, id, 0, Some(text.to_vec()))
    }

    fn kernel_sent(name_id: u32, correlation_id: u32) -> (u32, u32, u32, Option<Vec<u8>>) {
        (gpu_record::KERNEL, name_id, correlation_id, None)
    }

    /// A later attach's reader knows no name: after `forget_names` each goes again before
    /// its first kernel, ids from 1.
    #[test]
    fn names_go_again_to_a_new_reader() {
        let mut sender = Sender::new(Recorder::default(), None);
        let (a, b) = (c"kernel_a", c"kernel_b");
        unsafe {
            sender.push_kernel(kernel(1), a.as_ptr());
            sender.push_kernel(kernel(2), b.as_ptr());
            sender.forget_names();
            sender.push_kernel(kernel(3), b.as_ptr());
            sender.push_kernel(kernel(4), a.as_ptr());
        }
        sender.flush();
        assert_eq!(
            sent(&sender),
            vec![
                name(1, b"kernel_a"),
                kernel_sent(1, 1),
                name(2, b"kernel_b"),
                kernel_sent(2, 2),
                name(1, b"kernel_b"),
                kernel_sent(1, 3),
                name(2, b"kernel_a"),
                kernel_sent(2, 4),
            ]
        );
        assert_eq!(sizes(&sender), vec![1, 1, 1, 1, 1, 1, 1, 1]);
    }

    #[test]
    fn names_go_once_and_before_their_first_kernel() {
        let mut sender = Sender::new(Recorder::default(), None);
        let a = c"kernel_a";
        let b = c"kernel_b";
        // A second copy of a's name at another address: interned by content, not pointer.
        let a_again = std::ffi::CString::new("kernel_a").unwrap();
        unsafe {
            sender.push_kernel(kernel(1), a.as_ptr());
            sender.push_kernel(kernel(2), b.as_ptr());
            sender.push_kernel(kernel(3), a_again.as_ptr());
            sender.push_kernel(kernel(4), std::ptr::null());
        }
        sender.flush();
        assert_eq!(
            sent(&sender),
            vec![
                name(1, b"kernel_a"),
                kernel_sent(1, 1),
                name(2, b"kernel_b"),
                kernel_sent(2, 2),
                kernel_sent(1, 3),
                kernel_sent(0, 4),
            ]
        );
        // Known names' kernels share a batch.
        assert_eq!(sizes(&sender), vec![1, 1, 1, 3]);
    }

    #[test]
    fn batches_hold_at_most_the_uprobe_limit() {
        let mut sender = Sender::new(Recorder::default(), None);
        for i in 0..(2 * GPU_BATCH_MAX + 3) as u32 {
            sender.push(kernel(i));
        }
        // Full batches went at once; the rest waits for flush.
        assert_eq!(sender.sink().batches.len(), 2);
        sender.flush();
        sender.flush();
        let sizes: Vec<usize> = sender.sink().batches.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![GPU_BATCH_MAX, GPU_BATCH_MAX, 3]);
        // Each batch's first record, and no other, says the batch has no text.
        let marked: Vec<Vec<bool>> = sender
            .sink()
            .batches
            .iter()
            .map(|b| {
                b.iter()
                    .map(|(r, _)| r.flags & gpu_flags::BATCH_WITHOUT_TEXT != 0)
                    .collect()
            })
            .collect();
        for batch in &marked {
            assert!(batch[0]);
            assert!(batch[1..].iter().all(|m| !m));
        }
        let ids: Vec<u32> = sender
            .sink()
            .batches
            .iter()
            .flatten()
            .map(|(r, _)| r.correlation_id)
            .collect();
        assert_eq!(ids, (0..(2 * GPU_BATCH_MAX + 3) as u32).collect::<Vec<_>>());
    }

    /// For measuring the record-by-record copy: nothing is marked.
    #[test]
    fn an_unmarked_sender_marks_no_batch() {
        let mut sender = Sender::new(Recorder::default(), None).unmarked();
        for i in 0..(GPU_BATCH_MAX + 2) as u32 {
            sender.push(kernel(i));
        }
        sender.flush();
        let batches = &sender.sink().batches;
        assert_eq!(batches.len(), 2);
        assert!(
            batches
                .iter()
                .flatten()
                .all(|(r, _)| r.flags & gpu_flags::BATCH_WITHOUT_TEXT == 0)
        );
    }

    #[test]
    fn long_text_is_cut_to_the_limit_and_says_its_length() {
        let mut sender = Sender::new(Recorder::default(), None);
        let long = "x".repeat(5000);
        let name = std::ffi::CString::new(long.clone()).unwrap();
        unsafe { sender.push_kernel(kernel(1), name.as_ptr()) };
        sender.push_text(
            GpuRecord {
                what: gpu_record::ERROR,
                ..GpuRecord::default()
            },
            "no libcupti",
        );
        sender.flush();
        assert_eq!(sizes(&sender), vec![1, 1, 1]);
        let batches = &sender.sink().batches;
        let (name_record, name_text) = &batches[0][0];
        assert_eq!(name_record.text_len as usize, GPU_TEXT_LEN);
        assert_eq!(name_record.text_full_len, 5000);
        assert_eq!(name_text.as_deref(), Some(&long.as_bytes()[..GPU_TEXT_LEN]));
        let (error, error_text) = &batches[2][0];
        assert_eq!((error.text_len, error.text_full_len), (11, 11));
        assert_eq!(error_text.as_deref(), Some(&b"no libcupti"[..]));
    }

    #[test]
    fn the_debug_file_has_one_line_per_record_with_its_text() {
        let dir = std::env::temp_dir().join(format!("cudatrace-inject-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("debug.jsonl");
        let file = File::create(&path).unwrap();
        let mut sender = Sender::new(Recorder::default(), Some(file));
        unsafe { sender.push_kernel(kernel(9), c"k".as_ptr()) };
        sender.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["what"], gpu_record::NAME);
        assert_eq!(lines[0]["text"], "k");
        assert_eq!(lines[1]["what"], gpu_record::KERNEL);
        assert_eq!(lines[1]["correlation_id"], 9);
        assert_eq!(lines[1]["name_id"], 1);
        assert_eq!(lines[1]["text"], serde_json::Value::Null);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
