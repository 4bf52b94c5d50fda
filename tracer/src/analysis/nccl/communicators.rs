//! Communicators ([`NcclState`]): each one's rank, number of ranks, unique id and device,
//! from the calls that made it and asked about it; groups numbered per process.

use std::collections::HashMap;

use crate::{catalog::nccl::lookup, schema::CallLine};

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
