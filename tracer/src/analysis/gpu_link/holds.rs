//! Launch lines held for CUPTI's record of their call (`--gpu`), let go without it.

use super::{HoldChange, Process};

/// Lets the oldest held line of the process go as it is.
pub(super) fn release_one(pid: u32, process: &mut Process, holds: &mut Vec<HoldChange>) {
    let Some((tid, ts_ns)) = process.held.pop_front() else {
        return;
    };
    let held = process
        .threads
        .get_mut(&tid)
        .and_then(|thread| thread.find_mut(ts_ns))
        .and_then(|call| call.state.held_since.take());
    if held.is_some() {
        holds.push(HoldChange {
            pid,
            tid,
            ts_ns,
            result: None,
        });
    }
}

/// Lets every held line of the process go.
pub(super) fn release_held(pid: u32, process: &mut Process, holds: &mut Vec<HoldChange>) {
    while !process.held.is_empty() {
        release_one(pid, process, holds);
    }
}

/// Lets go the held lines of thread `tid` that began before `before`.
pub(super) fn release_held_before(
    pid: u32,
    tid: u32,
    before: u64,
    process: &mut Process,
    holds: &mut Vec<HoldChange>,
) {
    let Some(thread) = process.threads.get_mut(&tid) else {
        return;
    };
    let end = thread.calls.partition_point(|c| c.ts_ns < before);
    for call in thread.calls.range_mut(..end).rev() {
        if call.state.held_since.take().is_some() {
            holds.push(HoldChange {
                pid,
                tid,
                ts_ns: call.ts_ns,
                result: None,
            });
        } else if call.state.api_result.is_some() {
            // Older calls were settled when this one was.
            break;
        }
    }
    // The held queue keeps entries already let go: they are skipped when reached.
    while let Some(&(held_tid, ts)) = process.held.front() {
        let still = process
            .threads
            .get(&held_tid)
            .and_then(|t| t.find(ts))
            .is_some_and(|c| c.state.held_since.is_some());
        if still {
            break;
        }
        process.held.pop_front();
    }
}
