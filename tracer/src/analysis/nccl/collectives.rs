//! [`CollectiveAccumulator`]: the collectives section built call by call; nested
//! collective calls folded into the outer one, NCCL kernels' GPU time attributed.

use std::{
    cell::RefCell,
    collections::{BTreeSet, HashMap, VecDeque},
    rc::Rc,
};

use crate::{
    analysis::Role,
    catalog::nccl::lookup,
    schema::{CallLine, GpuLine, Hex},
};

use super::section::{CollectiveRow, CollectivesSummary, bus_rule};

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

    pub fn observe(&mut self, role: Role, record: &CallLine) {
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
                communicator: record
                    .comm_id
                    .clone()
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
