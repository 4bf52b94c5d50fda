//! Communicators ([`NcclState`]): each one's rank, number of ranks, unique id and device,
//! from the calls that made it and asked about it; groups numbered per process.

use std::collections::HashMap;

use crate::{
    catalog::{Family, nccl::lookup},
    schema::CallLine,
};

/// Hex digits of the unique id that name a communicator: its first 8 bytes, NCCL's random
/// magic (the rest is the root's address, the same for every communicator it roots).
pub const ID_HEX: usize = 16;

/// Point-to-point calls: ranks need not make them in the same order, so they are not
/// numbered on their communicator.
pub fn is_p2p(function: &str) -> bool {
    matches!(function, "ncclSend" | "ncclRecv")
}

/// What is known of one communicator.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommInfo {
    pub rank: Option<i32>,
    pub nranks: Option<i32>,
    /// The first 32 bytes of its `ncclUniqueId`, as hex (the same on every rank).
    pub unique_id: Option<String>,
    /// The CUDA device, from `ncclCommCuDevice`.
    pub device: Option<i32>,
    /// Its name across processes (`comm_id`): the first 8 bytes of the unique id as hex;
    /// for a split, its parent's, the split's number and color; for `ncclCommInitAll`,
    /// `PID:COMMS0` (one process holds every rank).
    pub id: Option<String>,
    /// Successful collective calls on it so far (not `ncclSend`/`ncclRecv`).
    collectives: u64,
    /// Splits and shrinks made from it so far.
    children: u64,
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
                            id: record
                                .unique_id
                                .as_deref()
                                .map(|id| id.chars().take(ID_HEX).collect()),
                            unique_id: record.unique_id.clone(),
                            ..CommInfo::default()
                        },
                    );
                }
            }
            "ncclCommInitAll" if made => {
                let id = record
                    .comms
                    .first()
                    .map(|first| format!("{}:{:#x}", record.pid, first.0));
                for (rank, comm) in record.comms.iter().enumerate() {
                    self.comms.insert(
                        comm.0,
                        CommInfo {
                            rank: Some(rank as i32),
                            nranks: record.nranks,
                            id: id.clone(),
                            ..CommInfo::default()
                        },
                    );
                }
            }
            "ncclCommSplit" | "ncclCommShrink" if made => {
                // Every rank splits its parent in the same order: the n-th split of a
                // parent (and its color) names the same child everywhere.
                let id = record.comm.and_then(|parent| {
                    let parent = self.comms.get_mut(&parent.0)?;
                    parent.children += 1;
                    let parent_id = parent.id.as_deref()?;
                    Some(match record.color {
                        Some(color) => format!("{parent_id}/{}c{color}", parent.children),
                        None => format!("{parent_id}/{}", parent.children),
                    })
                });
                if let Some(child) = record.new_comm {
                    self.comms.insert(
                        child.0,
                        CommInfo {
                            id,
                            ..CommInfo::default()
                        },
                    );
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
        if let Some(comm) = record.comm.and_then(|comm| self.comms.get_mut(&comm.0)) {
            record.rank = record.rank.or(comm.rank);
            record.nranks = record.nranks.or(comm.nranks);
            if record.comm_id.is_none() {
                record.comm_id.clone_from(&comm.id);
            }
            if record.ok() && matches!(spec.family, Family::Collective) && !is_p2p(spec.name()) {
                comm.collectives += 1;
                record.comm_seq = record.comm_seq.or(Some(comm.collectives));
            }
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
