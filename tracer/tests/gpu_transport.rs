//! Root: the `gpu_records` uprobe on the injection library's `cudatrace_gpu_records`
//! copies every record the library sends into the ring buffer, byte for byte, with its
//! text (batches without text in one entry each); it skips processes that are not traced,
//! and counts each record a full ring loses.
//! (Also proves the kernel's verifier accepts the program.)

mod common;

use std::io::Write;
use std::process::Stdio;

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, PerCpuArray, RingBuf},
    programs::{UProbe, uprobe::UProbeScope},
};
use common::gpu::{DRIVER_GPU_RECORDS, INJECT_LIB, driver_command, read_records, u};
use serde_json::Value;
use tracer_common::{
    EventHeader, GPU_BATCH_MAX, GPU_RECORDS_SYMBOL, GPU_TEXT_LEN, GpuBatchEvent, GpuRecord,
    counter, flags, gpu_flags, gpu_record, kind,
};

const PROBES: &str = env!("CUDATRACE_PROBES_OBJ");

/// The probes object with a ring of `ring_bytes`, `gpu_records` attached to the library.
fn load(ring_bytes: u32) -> Ebpf {
    let object = std::fs::read(PROBES).unwrap();
    let mut bpf = EbpfLoader::new()
        .map_max_entries("EVENTS", ring_bytes)
        .load(&object)
        .expect("loading the probes object");
    let program: &mut UProbe = bpf
        .program_mut("gpu_records")
        .expect("a gpu_records program")
        .try_into()
        .unwrap();
    program.load().expect("the verifier accepts gpu_records");
    program
        .attach(GPU_RECORDS_SYMBOL, INJECT_LIB, UProbeScope::AllProcesses)
        .expect("attaching to cudatrace_gpu_records");
    bpf
}

/// Runs `cudatrace-driver gpu` under the injection library; when `traced`, its pid is in
/// `TRACED` before it execs (a shell waits on stdin, then execs the driver). Returns the
/// debug file's records.
fn run_driver(bpf: &mut Ebpf, name: &str, traced: bool) -> (u32, Vec<Value>) {
    let cupti = common::gpu::cupti_standin();
    let dir = common::scratch(name);
    let debug = dir.join("records.jsonl");
    let driver = driver_command(&cupti.lib, &debug);
    let mut command = std::process::Command::new("sh");
    command
        .args(["-c", "read go && exec \"$0\" gpu"])
        .arg(driver.get_program())
        .envs(driver.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let pid = child.id();
    if traced {
        let mut traced_map: BpfHashMap<_, u32, u32> =
            BpfHashMap::try_from(bpf.map_mut("TRACED").unwrap()).unwrap();
        traced_map.insert(pid, 1, 0).unwrap();
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(child.wait().unwrap().success());
    (pid, read_records(&debug))
}

/// A record's place in its batch and the batch's size, where it came in one.
type Batch = Option<(usize, usize)>;

/// A record as it came through the ring: the entry's header, the record, its text, and
/// where the entry was a batch, the record's place in it and the batch's size.
struct Event {
    header: EventHeader,
    record: GpuRecord,
    text: Option<Vec<u8>>,
    batch: Batch,
}

fn drain(bpf: &mut Ebpf) -> Vec<Event> {
    let mut ring = RingBuf::try_from(bpf.map_mut("EVENTS").unwrap()).unwrap();
    let mut events = Vec::new();
    while let Some(item) = ring.next() {
        let bytes: &[u8] = &item;
        // SAFETY: the ring holds whole events; both types are plain old data.
        let header = unsafe { bytes.as_ptr().cast::<EventHeader>().read_unaligned() };
        let record = unsafe { bytes[24..].as_ptr().cast::<GpuRecord>().read_unaligned() };
        let text = match header.kind {
            kind::GPU => {
                assert_eq!(bytes.len(), 24 + 168);
                None
            }
            kind::GPU_TEXT => {
                assert_eq!(bytes.len(), 24 + 168 + GPU_TEXT_LEN);
                Some(bytes[192..192 + record.text_len as usize].to_vec())
            }
            kind::GPU_BATCH => {
                assert_eq!(bytes.len(), size_of::<GpuBatchEvent>());
                // SAFETY: as above.
                let batch = unsafe { bytes.as_ptr().cast::<GpuBatchEvent>().read_unaligned() };
                let count = batch.count as usize;
                assert!((2..=GPU_BATCH_MAX).contains(&count), "a batch of {count}");
                for (index, record) in batch.records[..count].iter().enumerate() {
                    events.push(Event {
                        header,
                        record: *record,
                        text: None,
                        batch: Some((index, count)),
                    });
                }
                continue;
            }
            other => panic!("unexpected event kind {other}"),
        };
        events.push(Event {
            header,
            record,
            text,
            batch: None,
        });
    }
    events
}

fn texts(events: &[Event]) -> usize {
    events.iter().filter(|e| e.text.is_some()).count()
}

fn counter_sum(bpf: &Ebpf, index: u32) -> u64 {
    let counters: PerCpuArray<_, u64> =
        PerCpuArray::try_from(bpf.map("COUNTERS").unwrap()).unwrap();
    counters.get(&index, 0).unwrap().iter().sum()
}

/// The debug line's fields against the record that went through the ring.
fn assert_same(line: &Value, event: &Event) {
    let r = &event.record;
    let fields = [
        ("what", u64::from(r.what)),
        // The mark a batch's first record gets as the batch is sent.
        ("flags", (r.flags & !gpu_flags::BATCH_WITHOUT_TEXT).into()),
        ("start", r.start),
        ("end", r.end),
        ("correlation_id", r.correlation_id.into()),
        ("stream_id", r.stream_id.into()),
        ("bytes", r.bytes),
        ("dynamic_shared_mem", r.dynamic_shared_mem.into()),
        ("registers_per_thread", r.registers_per_thread.into()),
        ("name_id", r.name_id.into()),
        ("copy_kind", r.copy_kind.into()),
        ("memset_value", r.memset_value.into()),
        ("cbid", r.cbid.into()),
        ("result", r.result.into()),
        ("record_pid", r.pid.into()),
        ("tid", r.tid.into()),
        ("detail", r.detail.into()),
        ("text_full_len", r.text_full_len.into()),
    ];
    for (name, value) in fields {
        assert_eq!(u(&line[name]), value, "{name} of {line}");
    }
    assert_eq!(line["grid"], serde_json::json!(r.grid));
    assert_eq!(line["block"], serde_json::json!(r.block));
    match &event.text {
        None => assert_eq!(line["text"], Value::Null),
        Some(text) => assert_eq!(line["text"].as_str().unwrap().as_bytes(), &text[..]),
    }
}

#[test]
fn every_record_reaches_the_ring_exactly_and_only_from_traced_processes() {
    let Some(_guard) = common::root() else {
        return;
    };
    let mut bpf = load(1 << 22);

    let (_, untraced) = run_driver(&mut bpf, "gpu-transport-untraced", false);
    assert_eq!(untraced.len(), DRIVER_GPU_RECORDS, "the library did send");
    assert_eq!(drain(&mut bpf).len(), 0, "an untraced process's records");

    let (pid, lines) = run_driver(&mut bpf, "gpu-transport-traced", true);
    let events = drain(&mut bpf);
    assert_eq!(lines.len(), DRIVER_GPU_RECORDS);
    assert_eq!(events.len(), lines.len());
    for (line, event) in lines.iter().zip(&events) {
        assert_same(line, event);
        assert_eq!(event.header.pid, pid);
        let has_text = line["text"] != Value::Null;
        // A record with text comes alone; the others of a batch of two or more in one entry,
        // marked on its first record.
        let expected = match (has_text, event.batch) {
            (true, _) => kind::GPU_TEXT,
            (false, Some(_)) => kind::GPU_BATCH,
            (false, None) => kind::GPU,
        };
        assert_eq!(event.header.kind, expected);
        let marked = event.record.flags & gpu_flags::BATCH_WITHOUT_TEXT != 0;
        assert_eq!(marked, matches!(event.batch, Some((0, _))));
        let cut = u(&line["text_full_len"]) > u(&line["text_len"]);
        assert_eq!(
            event.header.flags,
            if cut { flags::DATA_TRUNCATED } else { 0 }
        );
    }
    // Between the texts (the INFO record, then each name before its first kernel), the
    // plain records came whole: batches of 3, 4, 2 and 8, none alone.
    let batches: Vec<usize> = events
        .iter()
        .filter_map(|e| {
            e.batch
                .filter(|&(index, _)| index == 0)
                .map(|(_, count)| count)
        })
        .collect();
    assert_eq!(batches, vec![3, 4, 2, 8]);
    assert_eq!(
        events.iter().filter(|e| e.header.kind == kind::GPU).count(),
        0
    );
    assert_eq!(texts(&events), 4);
    // The 5,000-byte kernel name arrived as its first 4 KiB, flagged as cut.
    let cut: Vec<&Event> = events
        .iter()
        .filter(|e| e.header.flags & flags::DATA_TRUNCATED != 0)
        .collect();
    assert_eq!(cut.len(), 1);
    assert_eq!(cut[0].record.what, gpu_record::NAME);
    assert_eq!(cut[0].text.as_ref().unwrap().len(), GPU_TEXT_LEN);
    assert_eq!(counter_sum(&bpf, counter::GPU_RING_FULL), 0);
    assert_eq!(counter_sum(&bpf, counter::GPU_READ_FAILED), 0);
}

#[test]
fn a_full_ring_loses_records_and_counts_every_one() {
    let Some(_guard) = common::root() else {
        return;
    };
    // One page, never read during the runs: a text event (8 + 4,280 bytes) never fits, and
    // two runs send more plain records than fit.
    let mut bpf = load(4096);
    let mut sent = 0;
    let mut texts = 0;
    for run in 0..2 {
        let (_, lines) = run_driver(&mut bpf, &format!("gpu-transport-full-{run}"), true);
        assert_eq!(lines.len(), DRIVER_GPU_RECORDS);
        sent += lines.len() as u64;
        texts += lines.iter().filter(|l| l["text"] != Value::Null).count() as u64;
    }
    let received = drain(&mut bpf);
    let lost = counter_sum(&bpf, counter::GPU_RING_FULL);
    assert!(received.iter().all(|e| e.header.kind == kind::GPU));
    // Each plain event takes 8 (ring header) + 192 bytes: 20 fit in 4096.
    assert_eq!(received.len(), 20);
    assert_eq!(lost, sent - 20);
    assert!(lost > texts, "plain records were lost too");
    assert_eq!(counter_sum(&bpf, counter::GPU_READ_FAILED), 0);
}

/// A batch whose first record is not marked (an earlier build's library, still loaded in a
/// process that a later cudatrace attaches to) comes record by record, text or not; a
/// marked one in one entry.
#[test]
fn an_unmarked_batch_comes_record_by_record() {
    let Some(_guard) = common::root() else {
        return;
    };
    let mut bpf = load(1 << 20);
    let me = std::process::id();
    let mut traced: BpfHashMap<_, u32, u32> =
        BpfHashMap::try_from(bpf.map_mut("TRACED").unwrap()).unwrap();
    traced.insert(me, 1, 0).unwrap();
    let path = std::ffi::CString::new(INJECT_LIB).unwrap();
    // SAFETY: the library has no constructor of its own; it stays loaded for the process.
    let library = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!library.is_null(), "dlopen {INJECT_LIB}");
    // SAFETY: the symbol is the library's exported no-op of this signature.
    let send: extern "C" fn(*const GpuRecord, u32) =
        unsafe { std::mem::transmute(libc::dlsym(library, c"cudatrace_gpu_records".as_ptr())) };
    let mut records: Vec<GpuRecord> = (0..3)
        .map(|i| GpuRecord {
            what: gpu_record::KERNEL,
            correlation_id: 10 + i,
            ..GpuRecord::default()
        })
        .collect();
    send(records.as_ptr(), 3);
    records[0].flags |= gpu_flags::BATCH_WITHOUT_TEXT;
    send(records.as_ptr(), 3);
    let events = drain(&mut bpf);
    let seen: Vec<(u32, u32, Batch)> = events
        .iter()
        .map(|e| (e.header.kind, e.record.correlation_id, e.batch))
        .collect();
    assert_eq!(
        seen,
        vec![
            (kind::GPU, 10, None),
            (kind::GPU, 11, None),
            (kind::GPU, 12, None),
            (kind::GPU_BATCH, 10, Some((0, 3))),
            (kind::GPU_BATCH, 11, Some((1, 3))),
            (kind::GPU_BATCH, 12, Some((2, 3))),
        ]
    );
    assert!(events.iter().all(|e| e.header.pid == me));
    assert_eq!(counter_sum(&bpf, counter::GPU_RING_FULL), 0);
}

/// Not GPU records, but the same way of loading the probes alone: a traced thread's exit
/// (`sched_process_exit`) removes its cached thread state and its `--stack-rate` bucket, so
/// a later thread given its tid starts afresh; a living thread's stay.
#[test]
fn a_traced_threads_exit_removes_its_stack_caches() {
    let Some(_guard) = common::root() else {
        return;
    };
    let object = std::fs::read(PROBES).unwrap();
    let mut bpf = EbpfLoader::new()
        .load(&object)
        .expect("loading the probes object");
    let program: &mut aya::programs::TracePoint = bpf
        .program_mut("sched_process_exit")
        .expect("a sched_process_exit program")
        .try_into()
        .unwrap();
    program
        .load()
        .expect("the verifier accepts sched_process_exit");
    program.attach("sched", "sched_process_exit").unwrap();
    let me = std::process::id();
    BpfHashMap::<_, u32, u32>::try_from(bpf.map_mut("TRACED").unwrap())
        .unwrap()
        .insert(me, 1, 0)
        .unwrap();
    // SAFETY: a plain system call.
    let main_tid = unsafe { libc::gettid() } as u32;
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        // SAFETY: as above.
        tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
        go_rx.recv().unwrap();
    });
    let tid = tid_rx.recv().unwrap();
    for who in [tid, main_tid] {
        // `ThreadSeen` (generation, epoch, thread state, the C stack's end, how far up
        // its walks reached) and `RateBucket` (credit, when).
        BpfHashMap::<_, u32, [u64; 5]>::try_from(bpf.map_mut("THREADS_SEEN").unwrap())
            .unwrap()
            .insert(who, [1, 2, 3, 6, 7], 0)
            .unwrap();
        BpfHashMap::<_, u32, [u64; 2]>::try_from(bpf.map_mut("STACK_RATES").unwrap())
            .unwrap()
            .insert(who, [4, 5], 0)
            .unwrap();
    }
    go_tx.send(()).unwrap();
    thread.join().unwrap();
    // `join` returns once the kernel clears the thread's tid (`exit_mm`), which comes
    // before `sched_process_exit` in `do_exit`. The thread leaves `/proc/self/task` only
    // when it is released (`exit_notify`), after the tracepoint: wait for that.
    let task = format!("/proc/self/task/{tid}");
    let released = (0..1000).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        !std::path::Path::new(&task).exists()
    });
    assert!(released, "{task} still there 10 s after join");
    let seen: BpfHashMap<_, u32, [u64; 5]> =
        BpfHashMap::try_from(bpf.map("THREADS_SEEN").unwrap()).unwrap();
    let rates: BpfHashMap<_, u32, [u64; 2]> =
        BpfHashMap::try_from(bpf.map("STACK_RATES").unwrap()).unwrap();
    assert!(
        seen.get(&tid, 0).is_err(),
        "the exited thread's state stayed"
    );
    assert!(
        rates.get(&tid, 0).is_err(),
        "the exited thread's bucket stayed"
    );
    assert_eq!(seen.get(&main_tid, 0).unwrap(), [1, 2, 3, 6, 7]);
    assert_eq!(rates.get(&main_tid, 0).unwrap(), [4, 5]);
}
