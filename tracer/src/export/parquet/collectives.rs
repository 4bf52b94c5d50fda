//! The `collectives` table's rows, built as the lines come: one row per collective the
//! program asked for, numbered on its communicator, with the GPU time of the NCCL kernels
//! it launched (`--gpu`), attributed as the summary's collectives section does
//! (`analysis/nccl/`):
//!
//! - a collective NCCL made inside another of the same thread (2.28's `ncclBcast` runs as
//!   `ncclBroadcast`) is the outer call's row, which names it (`inner_name`). Lines
//!   come as calls return, the inner first, so each thread's last collective is held
//!   until its next one (or the end) shows whether it ran inside that one;
//! - `comm_id` and `comm_seq` are the analysis's (`analysis/nccl/`): `(comm_id, comm_seq)`
//!   names one collective on every rank;
//! - a kernel belongs to the collective whose call its launch ran inside (same thread); a
//!   kernel launched inside an `ncclGroupEnd` to that group's collectives, its time
//!   shared in proportion to their bytes. A row waits for its kernels (they come some
//!   200 ms after the calls) and its group's end, at most [`WAITING_MAX`] rows at once.

use std::collections::{BTreeMap, VecDeque};

use foldhash::HashMap;

use super::{columns::int, tables::collectives::Row};
use crate::{
    analysis::{Analysis, Role},
    catalog::nccl::{collective_op, lookup},
    schema::{CallLine, GpuKernelLine},
};

/// Launches kept per thread until the collective around them returns.
const LAUNCHES_KEPT: usize = 256;
/// Rows waiting for their kernels or group; past it the oldest goes out as it is.
pub const WAITING_MAX: usize = 1 << 16;
/// NCCL kernels kept until their launch's collective comes.
const EARLY_MAX: usize = 1 << 16;

/// `(pid, tid, ts_ns)` of a launch call.
type LaunchKey = (u32, u32, u64);

/// One collective call, as its row will have it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Collective {
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    pub dur_ns: Option<u64>,
    pub name: String,
    pub op: &'static str,
    pub inner_name: Option<String>,
    pub ok: bool,
    pub ret: Option<u32>,
    pub ret_name: Option<String>,
    pub comm: Option<u64>,
    /// The communicator across processes (the call's `comm_id`), else `PID:COMM`.
    pub comm_id: String,
    pub unique_id: Option<String>,
    pub comm_rank: Option<i32>,
    pub comm_nranks: Option<i32>,
    pub comm_seq: Option<u64>,
    pub group: Option<u64>,
    pub count: Option<u64>,
    pub datatype: Option<String>,
    pub bytes: Option<u64>,
    pub reduction: Option<String>,
    pub root: Option<i32>,
    pub peer: Option<i32>,
    pub stream: Option<u64>,
    /// `--gpu`: the kernels attributed, the first start, the last end, and their time
    /// (shared within a group by bytes).
    pub gpu: Option<GpuSpan>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuSpan {
    pub kernels: u64,
    pub start_ns: Option<u64>,
    pub end_ns: Option<u64>,
    pub ns: f64,
}

impl Collective {
    /// A collective call's row, before its number and GPU time.
    pub fn of(call: &CallLine, analysis: &Analysis) -> Collective {
        let comm = call.comm.map(|comm| comm.0);
        let unique_id = comm
            .and_then(|comm| analysis.nccl_comm(call.pid, comm))
            .and_then(|info| info.unique_id.clone());
        Collective {
            pid: call.pid,
            tid: call.tid,
            ts_ns: call.ts_ns,
            dur_ns: call.dur_ns,
            name: call.name.clone(),
            op: collective_op(&call.name).unwrap_or("?"),
            inner_name: None,
            ok: call.ok(),
            ret: call.ret,
            ret_name: call.ret_name.as_deref().map(str::to_owned),
            comm,
            // The analysis's name, the same on every rank; a process's own where none.
            comm_id: call
                .comm_id
                .clone()
                .unwrap_or_else(|| format!("{}:{:#x}", call.pid, comm.unwrap_or(0))),
            unique_id,
            comm_rank: call.rank,
            comm_nranks: call.nranks,
            comm_seq: call.comm_seq,
            group: call.group,
            count: call.count,
            datatype: call.datatype.as_deref().map(str::to_owned),
            bytes: call.bytes,
            reduction: call.op.as_deref().map(str::to_owned),
            root: call.root,
            peer: call.peer,
            stream: call.stream.map(|stream| stream.0),
            gpu: None,
        }
    }

    /// Its row of the `collectives` table.
    pub fn row(&self, wall_offset_ns: Option<i64>) -> Row<'_> {
        let gpu = self.gpu;
        Row {
            pid: self.pid as i32,
            tid: self.tid as i32,
            ts_ns: int(self.ts_ns),
            dur_ns: self.dur_ns.map(int),
            name: &self.name,
            op: self.op,
            inner_name: self.inner_name.as_deref(),
            ok: self.ok,
            ret: self.ret.map(i64::from),
            ret_name: self.ret_name.as_deref(),
            comm: self.comm.map(|comm| comm as i64),
            comm_id: &self.comm_id,
            unique_id: self.unique_id.as_deref(),
            comm_rank: self.comm_rank,
            comm_nranks: self.comm_nranks,
            comm_seq: self.comm_seq.map(int),
            group: self.group.map(int),
            count: self.count.map(int),
            datatype: self.datatype.as_deref(),
            bytes: self.bytes.map(int),
            reduction: self.reduction.as_deref(),
            root: self.root,
            peer: self.peer,
            stream: self.stream.map(|stream| stream as i64),
            gpu_kernels: gpu.map(|gpu| int(gpu.kernels)),
            gpu_start_ns: gpu.and_then(|gpu| gpu.start_ns).map(int),
            gpu_end_ns: gpu.and_then(|gpu| gpu.end_ns).map(int),
            gpu_ns: gpu.map(|gpu| gpu.ns.round() as i64),
            wall_offset_ns,
        }
    }

    fn end_ns(&self) -> u64 {
        self.ts_ns + self.dur_ns.unwrap_or(0)
    }
}

/// A row not written yet.
struct Waiting {
    row: Collective,
    /// Its thread's next collective has come (or the trace ended): no outer call will
    /// take it over.
    settled: bool,
    /// Launches claimed whose kernel has not come.
    launches_left: usize,
    /// In a group whose `ncclGroupEnd` has not come (`--gpu`).
    in_open_group: bool,
}

impl Waiting {
    fn done(&self) -> bool {
        self.settled && self.launches_left == 0 && !self.in_open_group
    }
}

/// The collectives of a trace, row by row.
#[derive(Default)]
pub struct Collectives {
    gpu: bool,
    launches: HashMap<(u32, u32), VecDeque<u64>>,
    /// Rows by arrival, oldest first.
    waiting: BTreeMap<u64, Waiting>,
    next_id: u64,
    /// Each thread's last collective (its row's id), until the next one comes.
    latest: HashMap<(u32, u32), u64>,
    /// Launches waiting for their kernel: the rows and weights their time goes to.
    claimed: HashMap<LaunchKey, Vec<(u64, f64)>>,
    /// NCCL kernels whose launch no collective has claimed yet: start and duration.
    early: HashMap<LaunchKey, (u64, u64)>,
    /// Each open group's collectives, `(pid, group)`: row ids and bytes.
    groups: HashMap<(u32, u64), Vec<(u64, u64)>>,
    /// Rows complete, to write.
    pub ready: Vec<Collective>,
}

impl Collectives {
    /// A `--gpu` trace: rows wait for their kernels.
    pub fn expect_gpu(&mut self) {
        self.gpu = true;
    }

    /// A call line, annotated (ranks, groups). `made` builds the row of a collective.
    pub fn call(&mut self, role: Role, call: &CallLine, made: impl FnOnce() -> Collective) {
        let thread = (call.pid, call.tid);
        if self.gpu && matches!(role, Role::Launch | Role::GraphLaunch) && call.ok() {
            let launches = self.launches.entry(thread).or_default();
            if launches.len() == LAUNCHES_KEPT {
                launches.pop_front();
            }
            launches.push_back(call.ts_ns);
            return;
        }
        if !call.name.starts_with("nccl") && !call.name.starts_with("pnccl") {
            return;
        }
        if lookup(&call.name).is_some_and(|spec| spec.name() == "ncclGroupEnd") {
            return self.group_end(call);
        }
        if collective_op(&call.name).is_none() {
            return;
        }
        let mut row = made();
        if self.gpu {
            row.gpu = Some(GpuSpan::default());
        }
        let end = row.end_ns();
        let inner = self.latest.get(&thread).copied().filter(|id| {
            self.waiting
                .get(id)
                .is_some_and(|w| row.ts_ns <= w.row.ts_ns && w.row.end_ns() <= end)
        });
        let id = match inner {
            // The outer call takes the inner one's row: its kernels and group.
            Some(id) => {
                let waiting = self.waiting.get_mut(&id).expect("filtered above");
                row.inner_name = Some(std::mem::take(&mut waiting.row.name));
                row.gpu = waiting.row.gpu;
                waiting.row = row;
                id
            }
            None => {
                if let Some(previous) = self.latest.remove(&thread) {
                    self.settle(previous);
                }
                let id = self.next_id;
                self.next_id += 1;
                let in_open_group = self.gpu && row.ok && row.group.is_some();
                if let (true, Some(group)) = (in_open_group, row.group) {
                    self.groups
                        .entry((row.pid, group))
                        .or_default()
                        .push((id, row.bytes.unwrap_or(0)));
                }
                self.waiting.insert(
                    id,
                    Waiting {
                        row,
                        settled: false,
                        launches_left: 0,
                        in_open_group,
                    },
                );
                id
            }
        };
        self.latest.insert(thread, id);
        if self.gpu && call.ok() {
            self.claim(call, &[(id, 1.0)]);
        }
        self.bound();
    }

    /// A group ends: its launches go to its collectives, by bytes.
    fn group_end(&mut self, call: &CallLine) {
        let Some(group) = call.group else { return };
        let Some(members) = self.groups.remove(&(call.pid, group)) else {
            return;
        };
        let total: u64 = members.iter().map(|(_, bytes)| bytes).sum();
        let weights: Vec<(u64, f64)> = members
            .iter()
            .map(|(id, bytes)| {
                let weight = match total {
                    0 => 1.0 / members.len() as f64,
                    _ => *bytes as f64 / total as f64,
                };
                (*id, weight)
            })
            .collect();
        self.claim(call, &weights);
        for (id, _) in members {
            if let Some(waiting) = self.waiting.get_mut(&id) {
                waiting.in_open_group = false;
            }
            self.release(id);
        }
    }

    /// The launches of `call`'s thread inside it go to `weights`.
    fn claim(&mut self, call: &CallLine, weights: &[(u64, f64)]) {
        let Some(launches) = self.launches.get_mut(&(call.pid, call.tid)) else {
            return;
        };
        let span = call.ts_ns..=call.ts_ns + call.dur_or_zero();
        let inside: Vec<u64> = launches
            .iter()
            .copied()
            .filter(|ts| span.contains(ts))
            .collect();
        launches.retain(|ts| !span.contains(ts));
        for ts in inside {
            let launch = (call.pid, call.tid, ts);
            if let Some((start, dur)) = self.early.remove(&launch) {
                self.add_kernel(weights, start, dur, false);
            } else if self.claimed.len() < WAITING_MAX {
                for (id, _) in weights {
                    if let Some(waiting) = self.waiting.get_mut(id) {
                        waiting.launches_left += 1;
                    }
                }
                self.claimed.insert(launch, weights.to_vec());
            }
        }
    }

    /// A kernel's time to the rows of its launch; `claimed`: the launch was waiting.
    fn add_kernel(&mut self, weights: &[(u64, f64)], start: u64, dur: u64, claimed: bool) {
        for (id, weight) in weights {
            let Some(waiting) = self.waiting.get_mut(id) else {
                continue;
            };
            let span = waiting.row.gpu.get_or_insert_with(GpuSpan::default);
            span.kernels += 1;
            span.start_ns = Some(span.start_ns.map_or(start, |s| s.min(start)));
            span.end_ns = Some(span.end_ns.map_or(start + dur, |e| e.max(start + dur)));
            span.ns += dur as f64 * weight;
            if claimed {
                waiting.launches_left = waiting.launches_left.saturating_sub(1);
            }
        }
        for (id, _) in weights {
            self.release(*id);
        }
    }

    /// A `gpu_kernel` line: its time to the collective that launched it.
    pub fn kernel(&mut self, kernel: &GpuKernelLine) {
        let (Some(tid), Some(ts)) = (kernel.link.call_tid, kernel.link.call_ts_ns) else {
            return;
        };
        let launch = (kernel.pid, tid, ts);
        if let Some(weights) = self.claimed.remove(&launch) {
            self.add_kernel(&weights, kernel.ts_ns, kernel.dur_ns, true);
        } else if kernel.kernel.contains("nccl") && self.early.len() < EARLY_MAX {
            self.early.insert(launch, (kernel.ts_ns, kernel.dur_ns));
        }
    }

    /// `id`'s thread has moved on: no call around it will come; written once complete.
    fn settle(&mut self, id: u64) {
        let Some(waiting) = self.waiting.get_mut(&id) else {
            return;
        };
        waiting.settled = true;
        self.release(id);
    }

    /// Moves `id` to `ready` if it is complete.
    fn release(&mut self, id: u64) {
        if self.waiting.get(&id).is_some_and(Waiting::done) {
            let waiting = self.waiting.remove(&id).expect("just seen");
            self.ready.push(waiting.row);
        }
    }

    /// Past [`WAITING_MAX`] rows, the oldest settled ones go out as they are.
    fn bound(&mut self) {
        while self.waiting.len() > WAITING_MAX {
            let Some(id) = self
                .waiting
                .iter()
                .find(|(_, waiting)| waiting.settled)
                .map(|(id, _)| *id)
            else {
                return;
            };
            let waiting = self.waiting.remove(&id).expect("just found");
            self.ready.push(waiting.row);
        }
    }

    /// The end of the trace: every row, in arrival order.
    pub fn finish(&mut self) {
        let mut latest: Vec<u64> = self.latest.drain().map(|(_, id)| id).collect();
        latest.sort_unstable();
        for id in latest {
            self.settle(id);
        }
        let waiting = std::mem::take(&mut self.waiting);
        self.ready.extend(waiting.into_values().map(|w| w.row));
    }
}
