//! Communicators, groups and the collectives section, on scripted calls.

use std::collections::HashMap;

use super::*;
use crate::{
    analysis::testing::Script,
    schema::{CallLine, GpuKernelLine, GpuLine, GpuLink, Hex},
};

fn init(script: &mut Script, comm: u64, rank: i32, nranks: i32) {
    script.call("ncclCommInitRank", |r| {
        r.comm = Some(Hex(comm));
        r.rank = Some(rank);
        r.nranks = Some(nranks);
        r.unique_id = Some("00112233445566778899".into());
    });
}

fn collective(script: &mut Script, name: &str, comm: u64, bytes: u64) {
    script.call(name, |r| {
        r.comm = Some(Hex(comm));
        r.bytes = Some(bytes);
    });
}

#[test]
fn collectives_get_their_communicators_rank_and_groups_are_numbered() {
    let mut state = NcclState::default();
    let mut script = Script::new(7);
    init(&mut script, 0x2000, 1, 2);
    collective(&mut script, "ncclAllReduce", 0x2000, 4000);
    script.call("ncclCommSplit", |r| {
        r.comm = Some(Hex(0x2000));
        r.new_comm = Some(Hex(0x2010));
    });
    collective(&mut script, "ncclAllReduce", 0x2010, 20);
    script.call("ncclCommUserRank", |r| {
        r.comm = Some(Hex(0x2010));
        r.rank = Some(0);
    });
    script.plain("ncclGroupStart");
    script.plain("ncclGroupStart");
    collective(&mut script, "pncclSend", 0x2010, 8);
    script.plain("ncclGroupEnd");
    script.plain("ncclGroupEnd");
    script.plain("ncclGroupStart");
    script.plain("ncclGroupEnd");
    let mut out = Vec::new();
    for record in &script.records {
        let mut record = record.clone();
        state.observe(&mut record);
        out.push(record);
    }
    assert_eq!((out[1].rank, out[1].nranks), (Some(1), Some(2)));
    assert_eq!((out[3].rank, out[3].nranks), (None, None));
    assert_eq!((out[7].rank, out[7].nranks), (Some(0), None));
    let groups: Vec<Option<u64>> = out[5..].iter().map(|r| r.group).collect();
    assert_eq!(
        groups,
        [
            Some(1),
            Some(1),
            Some(1),
            Some(1),
            Some(1),
            Some(2),
            Some(2)
        ]
    );
    assert_eq!(out[1].group, None);
}

#[test]
fn communicators_are_named_across_processes_and_collectives_numbered_on_them() {
    let mut state = NcclState::default();
    let mut script = Script::new(7);
    init(&mut script, 0x2000, 1, 2);
    collective(&mut script, "ncclAllReduce", 0x2000, 4000);
    collective(&mut script, "ncclSend", 0x2000, 8);
    // A failed collective is no collective on the other ranks: not numbered.
    script.call("ncclAllReduce", |r| {
        r.comm = Some(Hex(0x2000));
        r.ret = Some(4);
    });
    collective(&mut script, "ncclBroadcast", 0x2000, 64);
    for color in [7, 9] {
        script.call("ncclCommSplit", |r| {
            r.comm = Some(Hex(0x2000));
            r.new_comm = Some(Hex(0x2010 + color as u64));
            r.color = Some(color);
        });
    }
    collective(&mut script, "ncclAllGather", 0x2019, 16);
    script.call("ncclCommInitAll", |r| {
        r.comms = vec![Hex(0x2100), Hex(0x2110)];
        r.nranks = Some(2);
    });
    collective(&mut script, "ncclAllReduce", 0x2110, 8);
    let out: Vec<CallLine> = script
        .records
        .iter()
        .map(|record| {
            let mut record = record.clone();
            state.observe(&mut record);
            record
        })
        .collect();
    let named: Vec<(&str, Option<&str>, Option<u64>)> = out
        .iter()
        .map(|r| (r.name.as_str(), r.comm_id.as_deref(), r.comm_seq))
        .collect();
    let id = Some("0011223344556677");
    assert_eq!(
        named,
        [
            ("ncclCommInitRank", id, None),
            ("ncclAllReduce", id, Some(1)),
            ("ncclSend", id, None),
            ("ncclAllReduce", id, None),
            ("ncclBroadcast", id, Some(2)),
            ("ncclCommSplit", id, None),
            ("ncclCommSplit", id, None),
            ("ncclAllGather", Some("0011223344556677/2c9"), Some(1)),
            ("ncclCommInitAll", None, None),
            ("ncclAllReduce", Some("7:0x2100"), Some(1)),
        ]
    );
    // A line that has them (written by `run`) keeps them.
    let mut kept = script.records[1].clone();
    kept.comm_id = Some("feed".into());
    kept.comm_seq = Some(40);
    let mut fresh = NcclState::default();
    fresh.observe(&mut script.records[0].clone());
    fresh.observe(&mut kept);
    assert_eq!(
        (kept.comm_id.as_deref(), kept.comm_seq),
        (Some("feed"), Some(40))
    );
}

#[test]
fn gpu_time_goes_to_the_collective_or_group_around_the_launch() {
    let mut acc = CollectiveAccumulator::default();
    acc.expect_gpu();
    let mut state = NcclState::default();
    let mut script = Script::new(7);
    init(&mut script, 0x2000, 0, 2);
    // An all-reduce whose launch is inside it (its line comes after the launch's).
    let mut lines: Vec<CallLine> = Vec::new();
    let launch = |ts: u64| CallLine {
        name: "cuLaunchKernelEx".into(),
        pid: 7,
        tid: 7,
        ts_ns: ts,
        dur_ns: Some(10),
        ..CallLine::default()
    };
    lines.push(script.records[0].clone());
    lines.push(launch(5_050));
    lines.push(CallLine {
        name: "ncclAllReduce".into(),
        pid: 7,
        tid: 7,
        ts_ns: 5_000,
        dur_ns: Some(200),
        comm: Some(Hex(0x2000)),
        bytes: Some(1_000_000),
        ..CallLine::default()
    });
    // A group of an all-gather (3 MB) and a broadcast (1 MB): one kernel at GroupEnd.
    let start = CallLine {
        name: "ncclGroupStart".into(),
        pid: 7,
        tid: 7,
        ts_ns: 6_000,
        dur_ns: Some(5),
        ..CallLine::default()
    };
    lines.push(start);
    for (name, ts, bytes) in [
        ("ncclAllGather", 6_100, 3_000_000),
        ("ncclBroadcast", 6_200, 1_000_000),
    ] {
        lines.push(CallLine {
            name: name.into(),
            pid: 7,
            tid: 7,
            ts_ns: ts,
            dur_ns: Some(10),
            comm: Some(Hex(0x2000)),
            bytes: Some(bytes),
            ..CallLine::default()
        });
    }
    lines.push(launch(6_350));
    lines.push(CallLine {
        name: "ncclGroupEnd".into(),
        pid: 7,
        tid: 7,
        ts_ns: 6_300,
        dur_ns: Some(100),
        ..CallLine::default()
    });
    for line in &mut lines {
        let role = crate::analysis::classify(&line.name).0;
        state.observe(line);
        acc.observe(role, line);
    }
    let kernel = |ts: u64, dur: u64| {
        GpuLine::Kernel(GpuKernelLine {
            pid: 7,
            dur_ns: dur,
            kernel: "ncclDevKernel_AllReduce_Sum_f32_RING_LL".into(),
            link: GpuLink {
                call_tid: Some(7),
                call_ts_ns: Some(ts),
                ..GpuLink::default()
            },
            ..GpuKernelLine::default()
        })
    };
    acc.gpu_line(&kernel(5_050, 1_000));
    acc.gpu_line(&kernel(6_350, 4_000));
    // A kernel of a launch in no collective.
    acc.gpu_line(&kernel(9_999, 7));
    let summary = acc.finish();
    assert_eq!(summary.unattributed_kernels, 1);
    let by_op: HashMap<&str, &CollectiveRow> =
        summary.rows.iter().map(|r| (r.op.as_str(), r)).collect();
    let all_reduce = by_op["AllReduce"];
    assert_eq!(
        (
            all_reduce.calls,
            all_reduce.bytes,
            all_reduce.gpu_ns,
            all_reduce.gpu_kernels
        ),
        (1, 1_000_000, Some(1_000), 1)
    );
    assert_eq!(all_reduce.communicator, "0011223344556677");
    // 1 MB in 1 µs: 1000 GB/s; bus factor 2(n-1)/n = 1 for two ranks.
    assert_eq!(all_reduce.algbw_gb_s, Some(1000.0));
    assert_eq!(all_reduce.busbw_gb_s, Some(1000.0));
    let all_gather = by_op["AllGather"];
    assert_eq!((all_gather.gpu_ns, all_gather.grouped), (Some(3_000), 1));
    // nccl-tests' size: 3 MB x 2 ranks in 3 µs = 2000 GB/s; bus factor 1/2.
    assert_eq!(all_gather.size_bytes, Some(6_000_000));
    assert_eq!(all_gather.algbw_gb_s, Some(2000.0));
    assert_eq!(all_gather.busbw_gb_s, Some(1000.0));
    assert_eq!(by_op["Broadcast"].gpu_ns, Some(1_000));
    assert_eq!(by_op["Broadcast"].busbw_gb_s, Some(1000.0));
}

#[test]
fn a_collective_inside_another_counts_once_as_the_outer_with_its_kernels() {
    let mut acc = CollectiveAccumulator::default();
    acc.expect_gpu();
    let call = |name: &str, ts: u64, dur: u64, bytes: Option<u64>| CallLine {
        name: name.into(),
        pid: 7,
        tid: 8,
        ts_ns: ts,
        dur_ns: Some(dur),
        comm: bytes.map(|_| Hex(0x2000)),
        bytes,
        rank: Some(0),
        nranks: Some(2),
        ..CallLine::default()
    };
    let kernel = |ts: u64, dur: u64| {
        GpuLine::Kernel(GpuKernelLine {
            pid: 7,
            dur_ns: dur,
            kernel: "ncclDevKernel_Broadcast_RING_LL".into(),
            link: GpuLink {
                call_tid: Some(8),
                call_ts_ns: Some(ts),
                ..GpuLink::default()
            },
            ..GpuKernelLine::default()
        })
    };
    let feed = |acc: &mut CollectiveAccumulator, line: CallLine| {
        acc.observe(crate::analysis::classify(&line.name).0, &line);
    };
    // ncclBcast 1000..1300 calls ncclBroadcast 1010..1290, which launches at 1100;
    // the kernel's line comes between the two call lines.
    feed(&mut acc, call("cuLaunchKernelEx", 1_100, 10, None));
    feed(&mut acc, call("ncclBroadcast", 1_010, 280, Some(4_000_000)));
    acc.gpu_line(&kernel(1_100, 2_000));
    feed(&mut acc, call("ncclBcast", 1_000, 300, Some(4_000_000)));
    // Again, the kernel's line after both.
    feed(&mut acc, call("cuLaunchKernelEx", 2_100, 10, None));
    feed(
        &mut acc,
        call("pncclBroadcast", 2_010, 280, Some(4_000_000)),
    );
    feed(&mut acc, call("pncclBcast", 2_000, 300, Some(4_000_000)));
    acc.gpu_line(&kernel(2_100, 2_000));
    // A broadcast of its own, after them.
    feed(&mut acc, call("cuLaunchKernelEx", 3_100, 10, None));
    feed(&mut acc, call("ncclBroadcast", 3_000, 200, Some(1_000_000)));
    acc.gpu_line(&kernel(3_100, 500));
    let summary = acc.finish();
    assert_eq!(summary.unattributed_kernels, 0);
    let brief: Vec<_> = summary
        .rows
        .iter()
        .map(|r| {
            (
                r.op.as_str(),
                r.calls,
                r.bytes,
                r.host_ns,
                r.gpu_ns,
                r.gpu_kernels,
                r.busbw_gb_s,
                r.inner_calls,
                r.inner_functions.clone(),
            )
        })
        .collect();
    assert_eq!(
        brief,
        [
            (
                "Bcast",
                2,
                8_000_000,
                600,
                Some(4_000),
                2,
                Some(2000.0),
                2,
                vec!["ncclBroadcast".to_owned(), "pncclBroadcast".to_owned()]
            ),
            (
                "Broadcast",
                1,
                1_000_000,
                200,
                Some(500),
                1,
                Some(2000.0),
                0,
                vec![]
            ),
        ]
    );
}

#[test]
fn bus_factors_follow_nccl_tests() {
    assert_eq!(bus_rule("AllReduce", 4.0), (false, 1.5));
    assert_eq!(bus_rule("AllGather", 4.0), (true, 0.75));
    assert_eq!(bus_rule("ReduceScatter", 8.0), (true, 0.875));
    assert_eq!(bus_rule("AlltoAll", 2.0), (true, 0.5));
    assert_eq!(bus_rule("Broadcast", 8.0), (false, 1.0));
    assert_eq!(bus_rule("Reduce", 8.0), (false, 1.0));
}
