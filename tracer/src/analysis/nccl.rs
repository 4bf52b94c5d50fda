//! NCCL: communicators, groups and the collectives section.
//!
//! **Communicators** ([`NcclState`], per process: a `ncclComm_t` is a pointer of its
//! process). A communicator's rank and number of ranks come from the call that made it,
//! read at its return: `ncclCommInitRank`, `ncclCommInitRankConfig`,
//! `ncclCommInitRankScalable` (arguments), `ncclCommInitAll` (`comms[i]` is rank `i` of
//! `ndev`). A child of `ncclCommSplit`/`ncclCommShrink` is unknown until the program asks
//! NCCL (`ncclCommUserRank`, `ncclCommCount`). Every later call on the communicator gets
//! `rank` and `nranks`; where they are not known, they are absent.
//!
//! **Groups**: the outermost `ncclGroupStart` ... `ncclGroupEnd` of a thread is one group,
//! numbered per process from 1; the calls in it and its `ncclGroupEnd` carry `group`.
//!
//! **The collectives section** ([`CollectiveAccumulator`]): per process, communicator and
//! op: calls, bytes and host time; in a `--gpu` trace the GPU time of NCCL's kernels and
//! nccl-tests' algorithm and bus bandwidth. A kernel belongs to a collective when the
//! launch that issued it (its `call_tid`/`call_ts_ns`) ran inside the collective call on
//! the same thread; a kernel launched inside an `ncclGroupEnd` belongs to the group's
//! collectives, its GPU time split between them in proportion to their bytes.
//! docs/nccl.md has the formulas.
//!
//! **Nested calls.** NCCL's API may call itself through its exported symbols (2.28's
//! `ncclBcast` calls `ncclBroadcast`), so both calls are probed and traced. A collective
//! call made inside another collective call of the same thread counts once: the outer
//! call (what the program asked for) is the row, the inner one's calls, bytes and time
//! leave its row, its kernels go to the outer row, and the row says which function
//! the calls ran as (`inner_calls`, `inner_functions`). Lines arrive as calls return
//! (the inner before the outer), so the last [`RECENT_KEPT`] collective calls of each
//! thread stay undoable until a call around them returns.

use std::{
    cell::RefCell,
    collections::{BTreeSet, HashMap, VecDeque},
    rc::Rc,
};

use serde::Serialize;

use crate::{
    catalog::nccl::lookup,
    schema::{CallLine, GpuLine, Hex},
};

use super::Role;

/// What is known of one communicator.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommInfo {
    pub rank: Option<i32>,
    pub nranks: Option<i32>,
    /// The first 32 bytes of its `ncclUniqueId`, as hex (the same on every rank).
    pub unique_id: Option<String>,
    /// The CUDA device, from `ncclCommCuDevice`.
    pub device: Option<i32>,
}

/// NCCL's state in one process.
#[derive(Default)]
pub struct NcclState {
    comms: HashMap<u64, CommInfo>,
    /// Group nesting depth and the open group's number, per thread.
    groups: HashMap<u32, (u32, u64)>,
    last_group: u64,
}

/// `ncclInProgress`: a nonblocking communicator is being made; its handle is valid.
const IN_PROGRESS: u32 = 7;

impl NcclState {
    /// Learns from an NCCL call and adds `rank`, `nranks` and `group` to it.
    pub fn observe(&mut self, record: &mut CallLine) {
        let Some(spec) = lookup(&record.name) else {
            return;
        };
        let made = record.ok() || record.ret == Some(IN_PROGRESS);
        match spec.name() {
            "ncclCommInitRank" | "ncclCommInitRankConfig" | "ncclCommInitRankScalable" if made => {
                if let Some(comm) = record.comm {
                    self.comms.insert(
                        comm.0,
                        CommInfo {
                            rank: record.rank,
                            nranks: record.nranks,
                            unique_id: record.unique_id.clone(),
                            device: None,
                        },
                    );
                }
            }
            "ncclCommInitAll" if made => {
                for (rank, comm) in record.comms.iter().enumerate() {
                    self.comms.insert(
                        comm.0,
                        CommInfo {
                            rank: Some(rank as i32),
                            nranks: record.nranks,
                            ..CommInfo::default()
                        },
                    );
                }
            }
            "ncclCommSplit" | "ncclCommShrink" if made => {
                if let Some(child) = record.new_comm {
                    self.comms.insert(child.0, CommInfo::default());
                }
            }
            "ncclCommUserRank" if record.ok() => {
                if let Some(comm) = record.comm {
                    self.comms.entry(comm.0).or_default().rank = record.rank;
                }
            }
            "ncclCommCount" if record.ok() => {
                if let Some(comm) = record.comm {
                    self.comms.entry(comm.0).or_default().nranks = record.nranks;
                }
            }
            "ncclCommCuDevice" if record.ok() => {
                if let Some(comm) = record.comm {
                    self.comms.entry(comm.0).or_default().device = record.device;
                }
            }
            "ncclGroupStart" => {
                let (depth, group) = self.groups.entry(record.tid).or_insert((0, 0));
                if *depth == 0 {
                    self.last_group += 1;
                    *group = self.last_group;
                }
                *depth += 1;
                record.group = Some(*group);
                return;
            }
            "ncclGroupEnd" => {
                if let Some((depth, group)) = self.groups.get_mut(&record.tid) {
                    record.group = Some(*group);
                    *depth -= 1;
                    if *depth == 0 {
                        self.groups.remove(&record.tid);
                    }
                }
                return;
            }
            _ => {}
        }
        if let Some(comm) = record.comm.and_then(|comm| self.comms.get(&comm.0)) {
            record.rank = record.rank.or(comm.rank);
            record.nranks = record.nranks.or(comm.nranks);
        }
        if let Some((_, group)) = self.groups.get(&record.tid) {
            record.group = Some(*group);
        }
        if matches!(spec.name(), "ncclCommDestroy" | "ncclCommAbort")
            && record.ok()
            && let Some(comm) = record.comm
        {
            // The pointer may come back for another communicator.
            self.comms.remove(&comm.0);
        }
    }

    /// What is known of `comm`.
    pub fn comm(&self, comm: u64) -> Option<&CommInfo> {
        self.comms.get(&comm)
    }
}

/// How nccl-tests turn a collective's bytes into its bus bandwidth: the size it counts
/// (`bytes` times this many ranks: 1, or all of them) and the bus factor.
pub fn bus_rule(op: &str, nranks: f64) -> (bool, f64) {
    let ring = (nranks - 1.0) / nranks;
    match op {
        "AllReduce" => (false, 2.0 * ring),
        "AllGather" | "ReduceScatter" | "AlltoAll" | "Gather" | "Scatter" => (true, ring),
        // Broadcast, Bcast, Reduce, Send, Recv.
        _ => (false, 1.0),
    }
}

/// One row of the collectives section: one op on one communicator of one process.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CollectiveRow {
    /// `AllReduce`, `Broadcast`, `Send`, ...
    pub op: String,
    pub pid: u32,
    pub comm: Hex,
    /// The communicator across processes: the start of its `ncclUniqueId` where known
    /// (the same on every rank), else `PID:COMM`.
    pub communicator: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nranks: Option<i32>,
    /// Successful calls, and failed ones.
    pub calls: u64,
    pub errors: u64,
    /// Calls made inside a group (`ncclGroupStart` ... `ncclGroupEnd`).
    pub grouped: u64,
    /// `count` x element size, added up over the successful calls.
    pub bytes: u64,
    /// nccl-tests' size: `bytes`, times `nranks` for all-gather, reduce-scatter,
    /// all-to-all, gather and scatter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Time in the calls (enqueueing: NCCL returns before the GPU is done).
    pub host_ns: u64,
    /// `--gpu`: GPU time of the kernels attributed to these calls, and how many.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_ns: Option<u64>,
    #[serde(skip_serializing_if = "is_zero")]
    pub gpu_kernels: u64,
    /// `--gpu`: `size_bytes` / `gpu_ns` (GB/s, 10^9 bytes), and times the bus factor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algbw_gb_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busbw_gb_s: Option<f64>,
    /// Collective calls NCCL made inside these calls (on the same thread), counted here
    /// and not in rows of their own: `ncclBcast` runs as `ncclBroadcast`.
    #[serde(skip_serializing_if = "is_zero")]
    pub inner_calls: u64,
    /// The functions of those inner calls, e.g. `["ncclBroadcast"]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inner_functions: Vec<String>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// `(pid, comm, op)`.
type RowKey = (u32, u64, &'static str);
/// A launch call: `(pid, tid, ts_ns)`.
type LaunchKey = (u32, u32, u64);

/// Launches kept per thread until the collective around them returns.
const LAUNCHES_KEPT: usize = 256;
/// Collective calls kept per thread until a collective around them could return.
pub const RECENT_KEPT: usize = 8;

/// Where the GPU time of one collective call goes: its row, until a call around it
/// returns and takes it (with what it already got).
#[derive(Debug)]
struct CallSlot {
    key: RowKey,
    gpu_ns: f64,
    kernels: u64,
}

type SlotRef = Rc<RefCell<CallSlot>>;

/// A collective call whose counts an outer call may still take over.
struct RecentCall {
    key: RowKey,
    name: String,
    ts_ns: u64,
    end_ns: u64,
    ok: bool,
    bytes: u64,
    dur_ns: u64,
    group: Option<u64>,
    /// Its own slot first, then those of the calls it took over.
    slots: Vec<SlotRef>,
}
/// Launches waiting for their GPU kernel, and kernels waiting for their launch's owner.
const PENDING_MAX: usize = 1 << 16;

#[derive(Default)]
struct RowState {
    row: CollectiveRow,
    gpu_ns: f64,
    inner_functions: BTreeSet<String>,
}

/// The collectives section, built call by call.
#[derive(Default)]
pub struct CollectiveAccumulator {
    rows: HashMap<RowKey, RowState>,
    /// A `--gpu` trace: kernels are attributed.
    gpu: bool,
    /// Recent launches per thread (`pid`, `tid`): their `ts_ns`.
    launches: HashMap<(u32, u32), VecDeque<u64>>,
    /// Launches inside a collective or group, waiting for their kernel: the calls and
    /// weights their GPU time goes to.
    claimed: HashMap<LaunchKey, Vec<(SlotRef, f64)>>,
    /// NCCL kernels whose launch is not claimed yet: GPU time and kernels.
    waiting: HashMap<LaunchKey, (u64, u64)>,
    /// The collectives of each open group (`pid`, group): call and bytes.
    groups: HashMap<(u32, u64), Vec<(SlotRef, u64)>>,
    /// The last collective calls of each thread (`pid`, `tid`), newest last.
    recent: HashMap<(u32, u32), VecDeque<RecentCall>>,
    /// NCCL kernels never attributed (their launch was not inside a collective seen).
    pub unattributed_kernels: u64,
}

impl CollectiveAccumulator {
    /// The trace has GPU lines (`--gpu`): attribute kernels.
    pub fn expect_gpu(&mut self) {
        self.gpu = true;
    }

    pub fn observe(&mut self, role: Role, record: &CallLine, comm: Option<&CommInfo>) {
        if self.gpu && matches!(role, Role::Launch | Role::GraphLaunch) && record.ok() {
            let launches = self.launches.entry((record.pid, record.tid)).or_default();
            if launches.len() == LAUNCHES_KEPT {
                launches.pop_front();
            }
            launches.push_back(record.ts_ns);
            return;
        }
        let Some(spec) = lookup(&record.name) else {
            return;
        };
        if spec.name() == "ncclGroupEnd" {
            let Some(group) = record.group else { return };
            let members = self.groups.remove(&(record.pid, group)).unwrap_or_default();
            if self.gpu && !members.is_empty() {
                let total: u64 = members.iter().map(|(_, bytes)| *bytes).sum();
                let weights = members
                    .iter()
                    .map(|(slot, bytes)| {
                        let weight = if total == 0 {
                            1.0 / members.len() as f64
                        } else {
                            *bytes as f64 / total as f64
                        };
                        (slot.clone(), weight)
                    })
                    .collect();
                self.claim(record, weights);
            }
            return;
        }
        let Some(op) = crate::catalog::nccl::collective_op(&record.name) else {
            return;
        };
        let comm_ptr = record.comm.map_or(0, |c| c.0);
        let key = (record.pid, comm_ptr, op);
        let inner = self.take_inner(record);
        let state = self.rows.entry(key).or_insert_with(|| RowState {
            row: CollectiveRow {
                op: op.to_owned(),
                pid: record.pid,
                comm: Hex(comm_ptr),
                communicator: comm
                    .and_then(|c| c.unique_id.as_deref())
                    .map(|id| id.chars().take(16).collect())
                    .unwrap_or_else(|| format!("{}:{:#x}", record.pid, comm_ptr)),
                ..CollectiveRow::default()
            },
            ..RowState::default()
        });
        let row = &mut state.row;
        row.rank = row.rank.or(record.rank);
        row.nranks = row.nranks.or(record.nranks);
        let slot = Rc::new(RefCell::new(CallSlot {
            key,
            gpu_ns: 0.0,
            kernels: 0,
        }));
        let mut slots = vec![slot.clone()];
        for call in inner {
            row.inner_calls += 1;
            state.inner_functions.insert(call.name);
            for taken in call.slots {
                let mut taken_slot = taken.borrow_mut();
                taken_slot.key = key;
                state.gpu_ns += taken_slot.gpu_ns;
                row.gpu_kernels += taken_slot.kernels;
                drop(taken_slot);
                slots.push(taken);
            }
        }
        let ok = record.ok();
        let bytes = if ok { record.bytes.unwrap_or(0) } else { 0 };
        if ok {
            row.calls += 1;
            row.host_ns += record.dur_or_zero();
            row.bytes += bytes;
        } else {
            row.errors += 1;
        }
        let recent = self.recent.entry((record.pid, record.tid)).or_default();
        if recent.len() == RECENT_KEPT {
            recent.pop_front();
        }
        recent.push_back(RecentCall {
            key,
            name: record.name.clone(),
            ts_ns: record.ts_ns,
            end_ns: record.ts_ns + record.dur_or_zero(),
            ok,
            bytes,
            dur_ns: record.dur_or_zero(),
            group: record.group.filter(|_| ok),
            slots,
        });
        if !ok {
            return;
        }
        if let Some(group) = record.group {
            row.grouped += 1;
            self.groups
                .entry((record.pid, group))
                .or_default()
                .push((slot.clone(), bytes));
        }
        if self.gpu {
            self.claim(record, vec![(slot, 1.0)]);
        }
    }

    /// The recent collective calls of `record`'s thread inside it, their counts taken
    /// out of their rows (and their groups) for `record`'s row to take.
    fn take_inner(&mut self, record: &CallLine) -> Vec<RecentCall> {
        let Some(recent) = self.recent.get_mut(&(record.pid, record.tid)) else {
            return Vec::new();
        };
        let end = record.ts_ns + record.dur_or_zero();
        let inside = |call: &RecentCall| record.ts_ns <= call.ts_ns && call.end_ns <= end;
        if !recent.iter().any(inside) {
            return Vec::new();
        }
        let (inner, kept): (Vec<RecentCall>, Vec<RecentCall>) =
            recent.drain(..).partition(|call| inside(call));
        recent.extend(kept);
        for call in &inner {
            if let Some(state) = self.rows.get_mut(&call.key) {
                let row = &mut state.row;
                if call.ok {
                    row.calls -= 1;
                    row.host_ns -= call.dur_ns;
                    row.bytes -= call.bytes;
                } else {
                    row.errors -= 1;
                }
                for slot in &call.slots {
                    let slot = slot.borrow();
                    state.gpu_ns -= slot.gpu_ns;
                    row.gpu_kernels -= slot.kernels;
                }
                if let Some(group) = call.group {
                    row.grouped -= 1;
                    if let Some(members) = self.groups.get_mut(&(record.pid, group)) {
                        members.retain(|(slot, _)| !Rc::ptr_eq(slot, &call.slots[0]));
                    }
                }
            }
        }
        inner
    }

    /// The launches of `record`'s thread inside it go to `weights`.
    fn claim(&mut self, record: &CallLine, weights: Vec<(SlotRef, f64)>) {
        let Some(launches) = self.launches.get_mut(&(record.pid, record.tid)) else {
            return;
        };
        let end = record.ts_ns + record.dur_or_zero();
        let inside: Vec<u64> = launches
            .iter()
            .copied()
            .filter(|ts| (record.ts_ns..=end).contains(ts))
            .collect();
        launches.retain(|ts| !(record.ts_ns..=end).contains(ts));
        for ts in inside {
            let launch = (record.pid, record.tid, ts);
            if let Some((gpu_ns, kernels)) = self.waiting.remove(&launch) {
                self.add_gpu(&weights, gpu_ns, kernels);
            } else if self.claimed.len() < PENDING_MAX {
                self.claimed.insert(launch, weights.clone());
            }
        }
    }

    fn add_gpu(&mut self, weights: &[(SlotRef, f64)], gpu_ns: u64, kernels: u64) {
        for (slot, weight) in weights {
            let mut slot = slot.borrow_mut();
            slot.gpu_ns += gpu_ns as f64 * weight;
            slot.kernels += kernels;
            if let Some(state) = self.rows.get_mut(&slot.key) {
                state.gpu_ns += gpu_ns as f64 * weight;
                state.row.gpu_kernels += kernels;
            }
        }
    }

    /// A `--gpu` line: an NCCL kernel's time goes to the collective that launched it.
    pub fn gpu_line(&mut self, line: &GpuLine) {
        let GpuLine::Kernel(kernel) = line else {
            return;
        };
        let (Some(tid), Some(ts)) = (kernel.link.call_tid, kernel.link.call_ts_ns) else {
            return;
        };
        let launch = (kernel.pid, tid, ts);
        if let Some(weights) = self.claimed.remove(&launch) {
            self.add_gpu(&weights, kernel.dur_ns, 1);
        } else if kernel.kernel.contains("nccl") {
            if self.waiting.len() < PENDING_MAX {
                let waiting = self.waiting.entry(launch).or_default();
                waiting.0 += kernel.dur_ns;
                waiting.1 += 1;
            } else {
                self.unattributed_kernels += 1;
            }
        }
    }

    /// The rows, by communicator, rank, then op.
    pub fn finish(self) -> CollectivesSummary {
        let gpu = self.gpu;
        let mut unattributed = self.unattributed_kernels;
        unattributed += self
            .waiting
            .values()
            .map(|(_, kernels)| kernels)
            .sum::<u64>();
        let mut rows: Vec<CollectiveRow> = self
            .rows
            .into_values()
            // A row whose every call ran inside another collective.
            .filter(|state| state.row.calls + state.row.errors > 0)
            .map(|state| {
                let mut row = state.row;
                row.inner_functions = state.inner_functions.into_iter().collect();
                let nranks = row.nranks.filter(|n| *n > 0).map(f64::from);
                if let Some(n) = nranks {
                    let (times_ranks, _) = bus_rule(&row.op, n);
                    row.size_bytes = Some(if times_ranks {
                        row.bytes * n as u64
                    } else {
                        row.bytes
                    });
                }
                if gpu {
                    row.gpu_ns = Some(state.gpu_ns.round() as u64);
                    if let (Some(size), Some(n)) = (row.size_bytes, nranks)
                        && state.gpu_ns > 0.5
                    {
                        let algbw = size as f64 / state.gpu_ns;
                        row.algbw_gb_s = Some(algbw);
                        row.busbw_gb_s = Some(algbw * bus_rule(&row.op, n).1);
                    }
                }
                row
            })
            .collect();
        rows.sort_by(|a, b| {
            (&a.communicator, a.rank, a.pid, &a.op).cmp(&(&b.communicator, b.rank, b.pid, &b.op))
        });
        CollectivesSummary {
            rows,
            unattributed_kernels: if gpu { unattributed } else { 0 },
        }
    }
}

/// The collectives section.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CollectivesSummary {
    pub rows: Vec<CollectiveRow>,
    /// `--gpu`: NCCL kernels whose launch was in no collective call seen.
    pub unattributed_kernels: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        analysis::testing::Script,
        schema::{GpuKernelLine, GpuLink},
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
            let comm = line.comm.and_then(|c| state.comm(c.0)).cloned();
            acc.observe(role, line, comm.as_ref());
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
            acc.observe(crate::analysis::classify(&line.name).0, &line, None);
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
}
