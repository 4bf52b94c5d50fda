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
//! (the inner before the outer), so the last [`RECENT_KEPT`](collectives::RECENT_KEPT)
//! collective calls of each thread stay undoable until a call around them returns.
//!
//! | file | |
//! |---|---|
//! | `communicators.rs` | [`NcclState`]: communicators' ranks, groups |
//! | `collectives.rs` | [`CollectiveAccumulator`]: the section, call by call; kernels attributed |
//! | `section.rs` | the section's rows and nccl-tests' bus factors |

mod collectives;
mod communicators;
mod section;

pub use collectives::CollectiveAccumulator;
pub use communicators::{CommInfo, NcclState};
pub use section::*;

#[cfg(test)]
mod tests;
