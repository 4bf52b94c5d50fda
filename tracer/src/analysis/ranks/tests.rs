//! The cross-rank analysis on written traces: matching, waits, stragglers, clocks,
//! bandwidth and overlap, exactly.

use std::io::Cursor;

use serde_json::{Value, json};

use super::{notes::TraceProcess, *};
use crate::reader::TraceLines;

/// A trace's lines as `run` writes them (times in ns on its own clock).
struct Lines(Vec<Value>);

impl Lines {
    fn new(host: &str, start_wall_ns: u64, start_mono: u64, gpu: bool) -> Self {
        let mut header = json!({"type": "header", "format": "cudatrace", "version": 3,
            "host": host, "start_wall_ns": start_wall_ns, "start_monotonic_ns": start_mono,
            "command": ["train.py"], "pids": [10]});
        if gpu {
            header["gpu"] = json!({"library": "x", "libcupti": "y", "libcupti_from": "z"});
        }
        Lines(vec![header])
    }

    fn call(&mut self, pid: u32, name: &str, ts: u64, dur: u64, fields: Value) {
        let mut line = json!({"type": "call", "name": name, "pid": pid, "tid": pid,
            "ts_ns": ts, "dur_ns": dur, "ret": 0});
        line.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        self.0.push(line);
    }

    fn init(&mut self, pid: u32, comm: &str, rank: i32, nranks: i32) {
        let id = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";
        self.call(
            pid,
            "ncclCommInitRank",
            100,
            10,
            json!({"comm": comm, "unique_id": id, "rank": rank, "nranks": nranks}),
        );
    }

    /// An all-reduce called at `ts` whose NCCL kernel runs `[start, end)` (with `--gpu`).
    fn all_reduce(&mut self, pid: u32, comm: &str, ts: u64, kernel: Option<(u64, u64)>) {
        if let Some((start, end)) = kernel {
            self.call(
                pid,
                "cuLaunchKernel",
                ts + 2,
                3,
                json!({"function": "0x99", "kernel": "ncclDevKernel_AllReduce_Sum_f32_RING_LL"}),
            );
            self.0.push(
                json!({"type": "gpu_kernel", "pid": pid, "device": 0, "stream": 7,
                "ts_ns": start, "dur_ns": end - start,
                "kernel": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                "call_tid": pid, "call_ts_ns": ts + 2}),
            );
        }
        self.call(
            pid,
            "ncclAllReduce",
            ts,
            10,
            json!({"comm": comm, "count": 1_000_000, "datatype": "float32",
                   "datatype_size": 4, "bytes": 4_000_000, "op": "sum"}),
        );
    }

    fn compute(&mut self, pid: u32, start: u64, end: u64) {
        self.0.push(
            json!({"type": "gpu_kernel", "pid": pid, "device": 0, "stream": 7,
            "ts_ns": start, "dur_ns": end - start, "kernel": "gemm"}),
        );
    }

    fn read(mut self, label: &str, footer: bool) -> JobTrace {
        if footer {
            self.0.push(json!({"type": "footer", "events": {}}));
        }
        let text: String = self.0.iter().map(|l| format!("{l}\n")).collect();
        let header = JobHeader::parse(text.lines().next().unwrap().as_bytes()).unwrap();
        collect(TraceLines::new(Cursor::new(text), label, false), header).unwrap()
    }
}

#[test]
fn the_last_rank_is_named_with_the_wait_it_caused_on_a_clock_fitted_from_kernel_ends() {
    // Host b's wall clock is 3 ms ahead (NTP) and its monotonic clock elsewhere.
    let (skew, b_mono) = (3_000_000u64, 50_000_000_000u64);
    let mut a = Lines::new("a", 1_000_000_000_000, 0, true);
    let mut b = Lines::new("b", 1_000_000_000_000 + skew, b_mono, true);
    a.init(10, "0x2000", 0, 2);
    b.init(20, "0x3000", 1, 2);
    // Three all-reduces on the true clock (ns after the start): rank 1 late by 50 ms to
    // the second. Kernels start 1 µs after the call and end together 40 µs after the
    // last start.
    for (k, (call_a, call_b)) in [
        (1_000_000, 1_000_500),
        (2_000_000, 52_000_000),
        (60_000_000, 60_000_100),
    ]
    .into_iter()
    .enumerate()
    {
        let end = call_a.max(call_b) + 1_000 + 40_000;
        a.all_reduce(10, "0x2000", call_a, Some((call_a + 1_000, end)));
        b.all_reduce(
            20,
            "0x3000",
            b_mono + call_b,
            Some((b_mono + call_b + 1_000, b_mono + end)),
        );
        // Rank 0 computes through half of its third all-reduce.
        if k == 2 {
            a.compute(10, call_a + 1_000, call_a + 21_000);
        }
    }
    let report = analyse(&[a.read("a.jsonl", true), b.read("b.jsonl", true)]);
    assert_eq!(report.notes, []);
    let clock = &report.traces[1].clock;
    assert_eq!(
        (
            clock.method,
            clock.offset_ns,
            clock.uncertainty_ns,
            clock.collectives_used
        ),
        ("collectives", -(skew as i64), Some(0), 3)
    );
    assert_eq!(report.traces[0].clock.method, "reference");
    let comm = &report.communicators[0];
    assert_eq!(
        (
            comm.comm_id.as_str(),
            comm.nranks,
            comm.ready_from,
            comm.matched
        ),
        ("0a1b2c3d4e5f6071", Some(2), "gpu", 3)
    );
    let waits: Vec<(i32, u64, u64)> = comm
        .collectives
        .iter()
        .map(|c| (c.last_rank, c.max_wait_ns, c.transfer_ns.unwrap()))
        .collect();
    assert_eq!(
        waits,
        [(1, 500, 40_000), (1, 50_000_000, 40_000), (1, 100, 40_000)]
    );
    // 2(n-1)/n x 4 MB over 40 µs: 100 GB/s algorithm, 100 GB/s bus bandwidth.
    assert_eq!(comm.collectives[0].algbw_gb_s, Some(100.0));
    assert_eq!(comm.collectives[0].busbw_gb_s, Some(100.0));
    assert_eq!(comm.stragglers, [1]);
    let (r0, r1) = (&comm.ranks[0], &comm.ranks[1]);
    assert_eq!(
        (r1.last, r1.caused_wait_ns, r1.waited_ns),
        (3, 50_000_600, 0)
    );
    assert_eq!(
        (r0.last, r0.caused_wait_ns, r0.waited_ns),
        (0, 0, 50_000_600)
    );
    // Rank 0's collectives: 40.5 µs + 50.04 ms + 40.1 µs of GPU time, 20 µs overlapped.
    assert_eq!(r0.collective_gpu_ns, Some(40_500 + 50_040_000 + 40_100));
    assert_eq!(r0.overlapped_ns, Some(20_000));
    assert_eq!((r0.host.as_str(), r0.pid, r0.device), ("a", 10, Some(0)));
    // The times are on rank 0's clock: rank 1's call of the second one 52 ms in.
    let second = &comm.collectives[1].ranks[1];
    assert_eq!(second.call_ns, 1_000_000_000_000 + 52_000_000);
    assert_eq!(second.wait_ns, 0);
    assert_eq!(comm.collectives[1].ranks[0].wait_ns, 50_000_000);
}

#[test]
fn without_a_shared_communicator_or_a_footer_the_report_says_so() {
    let mut a = Lines::new("a", 1_000, 0, false);
    a.init(10, "0x2000", 0, 2);
    a.all_reduce(10, "0x2000", 1_000, None);
    let mut other = Lines::new("b", 1_000, 0, false);
    other.call(
        20,
        "ncclCommInitRank",
        100,
        10,
        json!({"comm": "0x2000", "unique_id": "ffff", "rank": 1, "nranks": 2}),
    );
    other.all_reduce(20, "0x2000", 1_000, None);
    let report = analyse(&[a.read("a.jsonl", true), other.read("b.jsonl", false)]);
    assert_eq!(
        report.notes,
        [
            Note::CutShort {
                file: "b.jsonl".into(),
                cut_line: None,
            },
            Note::NothingShared
        ]
    );
    assert_eq!(
        sentences(&report.notes),
        [
            "b.jsonl has no footer (cut short): collectives after the cut are missing from it",
            "no communicator is shared by these traces (traces of different jobs, or \
             communicators made before tracing began): their clocks are aligned by the wall \
             clock alone",
        ]
    );
    assert_eq!(report.traces[1].clock.method, "wall clock");
    assert_eq!(report.communicators.len(), 2);
    assert!(
        report
            .communicators
            .iter()
            .all(|c| c.matched == 0 && c.unmatched == 1)
    );
}

#[test]
fn one_process_driving_both_ranks_in_a_group_is_matched_within_its_trace() {
    // JAX: one thread, a group of two all-reduces on the two ranks' communicators, the
    // kernels launched in ncclGroupEnd on devices 0 and 1.
    let mut t = Lines::new("a", 1_000, 0, true);
    t.call(
        10,
        "ncclCommInitAll",
        100,
        10,
        json!({"comms": ["0x2000", "0x2010"], "nranks": 2}),
    );
    for (round, late) in [(0u64, 0u64), (1, 7_000)] {
        let ts = 10_000 + round * 100_000;
        t.call(10, "ncclGroupStart", ts, 1, json!({}));
        for (at, comm) in [(ts + 5, "0x2000"), (ts + 12, "0x2010")] {
            t.call(
                10,
                "ncclAllReduce",
                at,
                5,
                json!({"comm": comm, "count": 8, "datatype": "float32", "datatype_size": 4,
                       "bytes": 32, "op": "sum"}),
            );
        }
        for (device, start) in [(0, ts + 1_000), (1, ts + 1_000 + late)] {
            let launch = ts + 30 + device;
            t.call(10, "cuLaunchKernel", launch, 2, json!({"function": "0x99"}));
            t.0.push(
                json!({"type": "gpu_kernel", "pid": 10, "device": device, "stream": 7,
                "ts_ns": start, "dur_ns": ts + 10_000 - start, "kernel": "ncclDevKernel_AllReduce",
                "call_tid": 10, "call_ts_ns": launch}),
            );
        }
        t.call(10, "ncclGroupEnd", ts + 20, 50, json!({}));
    }
    let report = analyse(&[t.read("jax.jsonl", true)]);
    assert_eq!(report.notes, []);
    let comm = &report.communicators[0];
    assert_eq!(
        (comm.comm_id.as_str(), comm.matched, comm.ready_from),
        ("10:0x2000", 2, "gpu")
    );
    let devices: Vec<Option<u32>> = comm.ranks.iter().map(|r| r.device).collect();
    assert_eq!(devices, [Some(0), Some(1)]);
    let waits: Vec<(i32, u64)> = comm
        .collectives
        .iter()
        .map(|c| (c.last_rank, c.max_wait_ns))
        .collect();
    // Equal starts: the lowest rank is named; then device 1 starts 7 µs late.
    assert_eq!(waits, [(0, 0), (1, 7_000)]);
    assert_eq!(comm.stragglers, [1]);
}

#[test]
fn ncclbcast_calling_ncclbroadcast_is_one_collective() {
    let mut t = Lines::new("a", 1_000, 0, false);
    t.init(10, "0x2000", 0, 2);
    // The inner call returns (and is written) first.
    t.call(
        10,
        "ncclBroadcast",
        1_010,
        20,
        json!({"comm": "0x2000", "bytes": 64, "root": 0}),
    );
    t.call(
        10,
        "ncclBcast",
        1_000,
        40,
        json!({"comm": "0x2000", "bytes": 64, "root": 0}),
    );
    let trace = t.read("a.jsonl", true);
    let kept: Vec<(&str, u64)> = trace.collectives.iter().map(|c| (c.op, c.seq)).collect();
    assert_eq!(kept, [("Bcast", 2)]);
}

fn sentences(notes: &[Note]) -> Vec<String> {
    notes.iter().map(Note::to_string).collect()
}

#[test]
fn missing_ranks_a_rank_twice_and_different_collectives_are_noted() {
    // Ranks 0 and 1 of 4; rank 1 broadcasts where rank 0 all-reduces (number 2); a
    // third trace holds rank 0 again.
    let mut a = Lines::new("a", 1_000, 0, false);
    a.init(10, "0x2000", 0, 4);
    a.all_reduce(10, "0x2000", 1_000, None);
    a.all_reduce(10, "0x2000", 2_000, None);
    let mut b = Lines::new("b", 1_000, 0, false);
    b.init(20, "0x2000", 1, 4);
    b.all_reduce(20, "0x2000", 1_000, None);
    b.call(
        20,
        "ncclBroadcast",
        2_000,
        10,
        json!({"comm": "0x2000", "bytes": 4_000_000, "root": 0}),
    );
    let mut again = Lines::new("c", 1_000, 0, false);
    again.init(30, "0x2000", 0, 4);
    again.all_reduce(30, "0x2000", 1_000, None);
    let report = analyse(&[
        a.read("a.jsonl", true),
        b.read("b.jsonl", true),
        again.read("c.jsonl", true),
    ]);
    let comm_id = report.communicators[0].comm_id.clone();
    assert_eq!(report.communicators[0].matched, 1);
    assert_eq!(report.communicators[0].mismatched, 1);
    assert_eq!(
        report.notes,
        [
            Note::RankTwice {
                comm_id: comm_id.clone(),
                rank: 0,
                kept: TraceProcess {
                    file: "a.jsonl".into(),
                    pid: 10
                },
                left_out: TraceProcess {
                    file: "c.jsonl".into(),
                    pid: 30
                },
            },
            Note::RanksMissing {
                comm_id: comm_id.clone(),
                nranks: 4,
                missing: vec![2, 3],
            },
            Note::Mismatched {
                comm_id: comm_id.clone(),
                first: 2,
                numbers: 1,
            },
        ]
    );
    assert_eq!(
        sentences(&report.notes),
        [
            format!(
                "communicator {comm_id}: rank 0 is in a.jsonl (pid 10) and again in c.jsonl \
                 (pid 30): the second is left out (the same run traced twice?)"
            ),
            format!(
                "communicator {comm_id}: rank 2, 3 of 4 in no trace given: the waits are those \
                 among the ranks given"
            ),
            format!(
                "communicator {comm_id}: its ranks called different collectives as number 2 (1 \
                 numbers in all; traces of different runs?): those are not matched"
            ),
        ]
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["notes"], json!(sentences(&report.notes)));
}
