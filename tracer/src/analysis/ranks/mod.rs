//! Who waited for whom: one job's collectives across its ranks, whether the ranks are in
//! several traces (one per node or rank: `cudatrace summary A.jsonl B.jsonl`, `merge`)
//! or in one (JAX drives every GPU from one process; `ncclCommInitAll`).
//!
//! Each collective call is named by its communicator (`comm_id`, the same on every rank)
//! and its number on it (`comm_seq`): NCCL requires the ranks to call a communicator's
//! collectives in the same order, so the same `(comm_id, comm_seq)` is one collective on
//! every rank. The traces' clocks are put on one (`clocks.rs`); then, per collective, each
//! rank is **ready** when its NCCL kernel starts on the GPU (`--gpu` traces; else when it
//! calls), the last ready rank holds every other one back by the difference (its
//! **wait**), and the transfer runs from the last rank's readiness to the end of the
//! kernels, which gives the bandwidth (a kernel that mostly waited says nothing of it).
//!
//! | file | |
//! |---|---|
//! | `collect.rs` | one trace read: header, numbered collective calls with their kernels' span, GPU busy and compute time |
//! | `clocks.rs` | each trace's clock offset and its uncertainty, from the collectives' kernel ends |
//! | `figures.rs` | per collective (arrivals, waits, transfer) and per rank (waits caused and suffered, GPU busy, overlap) |
//! | `intervals.rs` | sets of time intervals |
//! | `notes.rs` | what could not be matched or aligned ([`Note`]), and the sentence for each |
//! | `runs.rs` | whether the traces are of one run (their spans, their communicators' sizes) |

mod clocks;
mod collect;
mod figures;
mod intervals;
mod notes;
mod runs;

pub use clocks::ClockFit;
pub use collect::{JobHeader, JobTrace, collect};
pub use figures::CommunicatorReport;
pub use notes::Note;
pub use runs::{first_mismatch, runs};

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use self::notes::TraceProcess;

/// The cross-rank analysis of a job's traces.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobReport {
    pub traces: Vec<TraceReport>,
    /// Communicators with ranks in the traces given, by `comm_id`.
    pub communicators: Vec<CommunicatorReport>,
    /// What could not be matched or aligned, and why (each a sentence in the JSON).
    pub notes: Vec<Note>,
}

/// One trace of the job and how its clock was aligned.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TraceReport {
    pub file: String,
    pub host: String,
    pub version: u32,
    /// It ends with its footer.
    pub complete: bool,
    /// Malformed lines passed over (`--skip-bad-lines`).
    #[serde(skip_serializing_if = "is_zero")]
    pub skipped_lines: u64,
    pub start_wall_ns: u64,
    /// Numbered collective calls (outer calls) and those whose communicator is unknown.
    pub collectives: u64,
    pub unnumbered: u64,
    pub clock: ClockFit,
}

/// One communicator's member: a rank in a process of a trace.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Member {
    pub trace: usize,
    pub pid: u32,
    pub rank: i32,
    /// Indices into the trace's collectives, by `comm_seq`.
    pub calls: BTreeMap<u64, usize>,
}

/// Analyses `traces` (in the order given: the first is the clock's reference).
pub fn analyse(traces: &[JobTrace]) -> JobReport {
    let mut notes: Vec<Note> = traces
        .iter()
        .filter(|trace| !trace.complete)
        .map(|trace| Note::CutShort {
            file: trace.label.clone(),
            cut_line: trace.cut_line,
        })
        .collect();
    let communicators = members(traces, &mut notes);
    let shared = communicators.values().any(|members| {
        members
            .iter()
            .map(|m| m.trace)
            .collect::<BTreeSet<_>>()
            .len()
            > 1
    });
    if traces.len() > 1 && !shared {
        notes.push(Note::NothingShared);
    }
    let pairs = figures::end_differences(traces, &communicators);
    let fits = clocks::fit(traces.len(), &pairs);
    let mut reports = Vec::with_capacity(communicators.len());
    for (comm_id, members) in &communicators {
        let (report, left_out) = figures::communicator(comm_id, members, traces, &fits);
        reports.push(report);
        notes.extend(left_out);
    }
    JobReport {
        traces: traces
            .iter()
            .zip(fits)
            .map(|(trace, clock)| TraceReport {
                file: trace.label.clone(),
                host: trace.header.host.clone(),
                version: trace.header.version,
                complete: trace.complete,
                skipped_lines: trace.skipped_lines,
                start_wall_ns: trace.header.start_wall_ns,
                collectives: trace.collectives.len() as u64,
                unnumbered: trace.unnumbered,
                clock,
            })
            .collect(),
        communicators: reports,
        notes,
    }
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

/// (trace, pid, `ncclComm_t`, `comm_id`): one rank of a communicator.
type MemberKey<'t> = (usize, u32, u64, &'t str);

/// Each communicator's members (a rank of it in a process of a trace), by `comm_id`;
/// a rank found twice is kept once, with a note.
fn members(traces: &[JobTrace], notes: &mut Vec<Note>) -> BTreeMap<String, Vec<Member>> {
    let mut by_key: HashMap<MemberKey, Member> = HashMap::new();
    for (index, trace) in traces.iter().enumerate() {
        for (call_index, call) in trace.collectives.iter().enumerate() {
            let Some(rank) = call.rank else { continue };
            let member = by_key
                .entry((index, call.pid, call.comm, call.comm_id.as_str()))
                .or_insert_with(|| Member {
                    trace: index,
                    pid: call.pid,
                    rank,
                    calls: BTreeMap::new(),
                });
            member.calls.insert(call.seq, call_index);
        }
    }
    let mut keyed: Vec<(MemberKey, Member)> = by_key.into_iter().collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    let mut communicators: BTreeMap<String, Vec<Member>> = BTreeMap::new();
    for ((_, _, _, comm_id), member) in keyed {
        let members = communicators.entry(comm_id.to_owned()).or_default();
        if let Some(other) = members.iter().find(|m| m.rank == member.rank) {
            let process = |m: &Member| TraceProcess {
                file: traces[m.trace].label.clone(),
                pid: m.pid,
            };
            notes.push(Note::RankTwice {
                comm_id: comm_id.to_owned(),
                rank: member.rank,
                kept: process(other),
                left_out: process(&member),
            });
            continue;
        }
        members.push(member);
    }
    for members in communicators.values_mut() {
        members.sort_by_key(|m| m.rank);
    }
    communicators
}

#[cfg(test)]
mod tests;
