//! The figures of one communicator's collectives, matched across its ranks: per
//! collective, each rank's arrival (its call), GPU start and end, the last rank to be
//! ready and the wait it caused on each other rank, the transfer time and bandwidth; per
//! rank, the waits it caused and suffered, its GPU busy time and how much of its
//! collectives' GPU time its compute kernels overlapped.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{
    ClockFit, JobTrace, Member, clocks::Differences, collect::CollectiveCall, notes::Note,
};
use crate::analysis::nccl::bus_rule;

/// One communicator across the traces.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CommunicatorReport {
    pub comm_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nranks: Option<i32>,
    /// `gpu`: ranks are ready when their NCCL kernel starts (every rank's trace has
    /// `--gpu`); `calls`: when they call.
    pub ready_from: &'static str,
    /// Collectives seen on two ranks or more (matched), on one rank only, and numbers
    /// whose ranks called different collectives (not matched).
    pub matched: u64,
    pub unmatched: u64,
    pub mismatched: u64,
    /// Ranks by rank.
    pub ranks: Vec<RankReport>,
    /// Ranks that held others back, the most waited-for first.
    pub stragglers: Vec<i32>,
    pub collectives: Vec<CollectiveReport>,
}

/// One rank of a communicator.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankReport {
    pub rank: i32,
    /// The trace (its file), its host and the process.
    pub file: String,
    pub host: String,
    pub pid: u32,
    /// `--gpu`: the CUDA device of its NCCL kernels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
    /// Matched collectives it took part in, and in how many it was the last ready.
    pub collectives: u64,
    pub last: u64,
    /// The time the other ranks waited for it, added up over them and the collectives.
    pub caused_wait_ns: u64,
    /// The time it waited for the last rank, added up.
    pub waited_ns: u64,
    /// `--gpu`: its GPU's busy time (kernels, copies, memsets of its process on its
    /// device) over the span from the first to the last of that work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_busy_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_span_ns: Option<u64>,
    /// `--gpu`: its collectives' GPU time (first kernel start to last kernel end, each),
    /// the part of it its compute kernels (all but NCCL's) ran in, and that share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub collective_gpu_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlapped_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap_share: Option<f64>,
}

/// One collective, matched across its ranks.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CollectiveReport {
    /// Its number on the communicator (`comm_seq`).
    pub seq: u64,
    pub op: &'static str,
    /// Per rank (the lowest rank's `bytes`), and nccl-tests' size.
    pub bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// The last rank to be ready, and the longest wait it caused.
    pub last_rank: i32,
    pub max_wait_ns: u64,
    /// `--gpu`: from the last rank's readiness to the end of the last kernel, and the
    /// bandwidth over it (GB/s, nccl-tests' algorithm and bus bandwidth).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transfer_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algbw_gb_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busbw_gb_s: Option<f64>,
    pub ranks: Vec<RankTimes>,
}

/// One rank's part in one collective, on the job's clock (wall-clock ns, aligned).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankTimes {
    pub rank: i32,
    pub call_ns: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_start_ns: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_end_ns: Option<i64>,
    /// How long it waited for the last rank.
    pub wait_ns: u64,
}

/// The matched collectives' entries per number: (member index, call) of each rank that
/// has it, when their ops agree.
type Matched<'t> = BTreeMap<u64, Vec<(usize, &'t CollectiveCall)>>;

fn entries<'t>(members: &[Member], traces: &'t [JobTrace]) -> (Matched<'t>, u64, u64, Option<u64>) {
    let numbers: BTreeSet<u64> = members
        .iter()
        .flat_map(|m| m.calls.keys().copied())
        .collect();
    let (mut matched, mut unmatched, mut mismatched, mut first_mismatch) =
        (Matched::new(), 0, 0, None);
    for seq in numbers {
        let calls: Vec<(usize, &CollectiveCall)> = members
            .iter()
            .enumerate()
            .filter_map(|(index, m)| {
                Some((index, &traces[m.trace].collectives[*m.calls.get(&seq)?]))
            })
            .collect();
        if calls.len() < 2 {
            unmatched += 1;
        } else if calls.iter().any(|(_, call)| call.op != calls[0].1.op) {
            mismatched += 1;
            first_mismatch.get_or_insert(seq);
        } else {
            matched.insert(seq, calls);
        }
    }
    (matched, unmatched, mismatched, first_mismatch)
}

/// For the clocks: per pair of traces (a < b), `wall_a(end) − wall_b(end)` of every
/// matched collective both have a GPU end for.
pub fn end_differences(
    traces: &[JobTrace],
    communicators: &BTreeMap<String, Vec<Member>>,
) -> BTreeMap<(usize, usize), Differences> {
    let mut pairs: BTreeMap<(usize, usize), Differences> = BTreeMap::new();
    for members in communicators.values() {
        let (matched, ..) = entries(members, traces);
        for calls in matched.values() {
            let ends: Vec<(usize, i128)> = calls
                .iter()
                .filter_map(|(member, call)| {
                    let trace = members[*member].trace;
                    Some((trace, traces[trace].header.wall_ns(call.gpu_end_ns?)))
                })
                .collect();
            for (i, (a, end_a)) in ends.iter().enumerate() {
                for (b, end_b) in &ends[i + 1..] {
                    match a.cmp(b) {
                        std::cmp::Ordering::Less => {
                            pairs.entry((*a, *b)).or_default().push(end_a - end_b)
                        }
                        std::cmp::Ordering::Greater => {
                            pairs.entry((*b, *a)).or_default().push(end_b - end_a)
                        }
                        std::cmp::Ordering::Equal => {}
                    }
                }
            }
        }
    }
    pairs
}

/// The report of communicator `comm_id`, its members' times on the clocks `fits` gives,
/// and what it leaves out.
pub fn communicator(
    comm_id: &str,
    members: &[Member],
    traces: &[JobTrace],
    fits: &[ClockFit],
) -> (CommunicatorReport, Vec<Note>) {
    let (matched, unmatched, mismatched, first_mismatch) = entries(members, traces);
    let nranks = members
        .iter()
        .flat_map(|m| calls_of(m, traces))
        .filter_map(|c| c.nranks)
        .max();
    let mut notes = Vec::new();
    if let Some(n) = nranks {
        let present: BTreeSet<i32> = members.iter().map(|m| m.rank).collect();
        let missing: Vec<i32> = (0..n).filter(|r| !present.contains(r)).collect();
        if !missing.is_empty() && members.len() > 1 {
            notes.push(Note::RanksMissing {
                comm_id: comm_id.to_owned(),
                nranks: n,
                missing,
            });
        }
    }
    if let Some(first) = first_mismatch {
        notes.push(Note::Mismatched {
            comm_id: comm_id.to_owned(),
            first,
            numbers: mismatched,
        });
    }
    let gpu = !matched.is_empty()
        && matched
            .values()
            .flatten()
            .all(|(_, call)| call.gpu_start_ns.is_some() && call.gpu_end_ns.is_some());
    let job_clock = JobClock {
        members,
        traces,
        fits,
    };
    let mut ranks: Vec<RankReport> = members
        .iter()
        .map(|m| rank_report(m, traces, calls_of(m, traces)))
        .collect();
    let mut collectives = Vec::with_capacity(matched.len());
    for (seq, calls) in &matched {
        let (report, last) = collective(*seq, calls, &job_clock, gpu);
        for ((member, _), t) in calls.iter().zip(&report.ranks) {
            let rank = &mut ranks[*member];
            rank.collectives += 1;
            rank.waited_ns += t.wait_ns;
        }
        let last_member = calls[last].0;
        ranks[last_member].last += 1;
        ranks[last_member].caused_wait_ns += report.ranks.iter().map(|t| t.wait_ns).sum::<u64>();
        collectives.push(report);
    }
    let mut stragglers: Vec<&RankReport> = ranks.iter().filter(|r| r.caused_wait_ns > 0).collect();
    stragglers.sort_by_key(|r| (std::cmp::Reverse(r.caused_wait_ns), r.rank));
    let report = CommunicatorReport {
        comm_id: comm_id.to_owned(),
        nranks,
        ready_from: if gpu { "gpu" } else { "calls" },
        matched: matched.len() as u64,
        unmatched,
        mismatched,
        stragglers: stragglers.iter().map(|r| r.rank).collect(),
        ranks,
        collectives,
    };
    (report, notes)
}

/// A communicator's members' times put on the job's clock.
struct JobClock<'a> {
    members: &'a [Member],
    traces: &'a [JobTrace],
    fits: &'a [ClockFit],
}

impl JobClock<'_> {
    /// `ts` of member `member`'s trace, in wall-clock ns aligned to the job's clock.
    fn aligned(&self, member: usize, ts: u64) -> i64 {
        let trace = self.members[member].trace;
        (self.traces[trace].header.wall_ns(ts) + i128::from(self.fits[trace].offset_ns)) as i64
    }
}

/// Collective `seq` matched across its ranks' `calls`: each rank's times and wait, the
/// transfer and its bandwidth; and which of `calls` was the last ready. Ranks are ready
/// when their kernel starts (`gpu`), else when they call.
fn collective(
    seq: u64,
    calls: &[(usize, &CollectiveCall)],
    clock: &JobClock,
    gpu: bool,
) -> (CollectiveReport, usize) {
    let mut times: Vec<RankTimes> = calls
        .iter()
        .map(|(member, call)| RankTimes {
            rank: clock.members[*member].rank,
            call_ns: clock.aligned(*member, call.ts_ns),
            gpu_start_ns: call.gpu_start_ns.map(|ts| clock.aligned(*member, ts)),
            gpu_end_ns: call.gpu_end_ns.map(|ts| clock.aligned(*member, ts)),
            wait_ns: 0,
        })
        .collect();
    let ready = |t: &RankTimes| match (gpu, t.gpu_start_ns) {
        (true, Some(start)) => start,
        _ => t.call_ns,
    };
    // The last ready; the lowest rank among equals.
    let last = (0..times.len())
        .max_by_key(|&i| (ready(&times[i]), std::cmp::Reverse(times[i].rank)))
        .unwrap_or(0);
    let last_ready = ready(&times[last]);
    for t in &mut times {
        t.wait_ns = (last_ready - ready(t)).max(0) as u64;
    }
    let op = calls[0].1.op;
    let nranks = calls.iter().filter_map(|(_, c)| c.nranks).max();
    let bytes = calls[0].1.bytes;
    let size_bytes = nranks.filter(|n| *n > 0).map(|n| {
        let (times_ranks, _) = bus_rule(op, f64::from(n));
        if times_ranks { bytes * n as u64 } else { bytes }
    });
    let transfer_ns = gpu.then(|| {
        let end = times
            .iter()
            .filter_map(|t| t.gpu_end_ns)
            .max()
            .unwrap_or(last_ready);
        (end - last_ready).max(0) as u64
    });
    let algbw = match (size_bytes, transfer_ns) {
        (Some(size), Some(ns)) if ns > 0 => Some(size as f64 / ns as f64),
        _ => None,
    };
    let report = CollectiveReport {
        seq,
        op,
        bytes,
        size_bytes,
        last_rank: times[last].rank,
        max_wait_ns: times.iter().map(|t| t.wait_ns).max().unwrap_or(0),
        transfer_ns,
        algbw_gb_s: algbw,
        busbw_gb_s: algbw
            .zip(nranks)
            .map(|(bw, n)| bw * bus_rule(op, f64::from(n)).1),
        ranks: times,
    };
    (report, last)
}

/// A member's collective calls, by number.
fn calls_of<'t>(
    member: &'t Member,
    traces: &'t [JobTrace],
) -> impl Iterator<Item = &'t CollectiveCall> + Clone {
    member
        .calls
        .values()
        .map(move |&i| &traces[member.trace].collectives[i])
}

/// A rank's own figures: its GPU's busy time, its collectives' GPU time and how much
/// of it compute kernels overlapped.
fn rank_report<'t>(
    member: &Member,
    traces: &'t [JobTrace],
    calls: impl Iterator<Item = &'t CollectiveCall> + Clone,
) -> RankReport {
    let trace = &traces[member.trace];
    let device = calls.clone().find_map(|call| call.device);
    let mut report = RankReport {
        rank: member.rank,
        file: trace.label.clone(),
        host: trace.header.host.clone(),
        pid: member.pid,
        device,
        ..RankReport::default()
    };
    let Some(device) = device else {
        return report;
    };
    let key = (member.pid, device);
    if let Some(busy) = trace.busy.get(&key) {
        report.gpu_busy_ns = Some(busy.total());
        report.gpu_span_ns = busy.span().map(|(start, end)| end - start);
    }
    let spans: Vec<(u64, u64)> = calls
        .filter_map(|call| Some((call.gpu_start_ns?, call.gpu_end_ns?)))
        .collect();
    let total: u64 = spans.iter().map(|(start, end)| end - start).sum();
    let overlapped: u64 = trace.compute.get(&key).map_or(0, |compute| {
        spans.iter().map(|(s, e)| compute.covered(*s, *e)).sum()
    });
    report.collective_gpu_ns = Some(total);
    report.overlapped_ns = Some(overlapped);
    report.overlap_share = (total > 0).then(|| overlapped as f64 / total as f64);
    report
}
