//! The collectives section's rows, as `summary --json` writes them, and how nccl-tests
//! turn bytes into bus bandwidth.

use serde::Serialize;

use crate::schema::Hex;

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

/// The collectives section.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CollectivesSummary {
    pub rows: Vec<CollectiveRow>,
    /// `--gpu`: NCCL kernels whose launch was in no collective call seen.
    pub unattributed_kernels: u64,
}
