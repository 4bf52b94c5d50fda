//! The calls kept per thread: for linking CUPTI's records of calls to call lines, and for
//! the account of what became of each launch, copy and memset.

use std::{collections::VecDeque, sync::Arc};

use crate::schema::gpu::unlinked;

/// Launch, copy and memset calls kept per thread for linking (about 2.5 s of the fastest
/// launch loop measured, 100k launches/s); an API record of an older call is
/// [`unlinked::BEYOND_WINDOW`].
pub const CALL_WINDOW: usize = 1 << 18;

/// What is known of a call's work, for the account (`fates.rs`).
#[derive(Clone, Debug, Default)]
pub struct CallState {
    /// Its line waits in the output queue for CUPTI's record (a launch probed at entry
    /// alone under `--gpu`): since when.
    pub held_since: Option<u64>,
    /// CUPTI's record of it came, with this result.
    pub api_result: Option<u32>,
    /// Its line says it failed.
    pub failed: bool,
    /// A copy or memset of 0 bytes.
    pub empty: bool,
    /// GPU lines linked to it.
    pub work: u32,
    /// Made while its stream was captured (known once its line was written).
    pub captured: bool,
    /// A launch's kernel name as the program passed it (known once its line was written).
    pub kernel: Option<Arc<str>>,
    /// `cuGraphLaunch`: the executable graph launched.
    pub graph_exec: Option<u64>,
    /// It was counted in the account.
    pub counted: bool,
}

/// A call kept for linking.
#[derive(Clone, Debug)]
pub struct RecentCall {
    pub ts_ns: u64,
    /// `u64::MAX` until the next call of the thread closes it, for a call whose return was
    /// not seen.
    pub end_ns: u64,
    /// Its return was not seen: `end_ns` is where the thread's next call began.
    pub open: bool,
    /// An open call's function (its base name): it encloses only API records of that
    /// function. `None` for a call whose return was seen, and for a function CUPTI's ids do
    /// not name (it encloses any).
    pub function: Option<&'static str>,
    pub state: CallState,
}

/// One thread's recent calls, by `ts_ns`.
#[derive(Default)]
pub struct Thread {
    pub calls: VecDeque<RecentCall>,
    /// Calls were pushed out of the window.
    pub evicted: bool,
}

impl Thread {
    /// Keeps `call`; gives back the call pushed out of the window, if one was.
    pub fn push(&mut self, call: RecentCall) -> Option<RecentCall> {
        // Calls arrive as they return: a nested one before the call around it.
        let at = self
            .calls
            .iter()
            .rposition(|c| c.ts_ns <= call.ts_ns)
            .map_or(0, |i| i + 1);
        let mut call = call;
        // A thread runs one call at a time: a call whose return was not seen ended before
        // the thread's next call began.
        if call.open
            && let Some(next) = self.calls.get(at)
        {
            call.end_ns = next.ts_ns;
        }
        if at > 0
            && let Some(previous) = self.calls.get_mut(at - 1)
            && previous.open
        {
            previous.end_ns = previous.end_ns.min(call.ts_ns);
        }
        self.calls.insert(at, call);
        if self.calls.len() > CALL_WINDOW {
            self.evicted = true;
            return self.calls.pop_front();
        }
        None
    }

    /// The innermost kept call enclosing `[start, end]`, the API record of `function`.
    pub fn enclosing(
        &mut self,
        start: u64,
        end: u64,
        function: Option<&str>,
    ) -> Result<&mut RecentCall, &'static str> {
        let after = self.calls.partition_point(|c| c.ts_ns <= start);
        let oldest = self.calls.front().map_or(u64::MAX, |c| c.ts_ns);
        let found = self.calls.range(..after).rposition(|c| {
            c.end_ns >= end && (!c.open || c.function.is_none() || c.function == function)
        });
        match found {
            Some(index) => Ok(&mut self.calls[index]),
            // Before the oldest call kept: its call may have been pushed out.
            None if self.evicted && start < oldest => Err(unlinked::BEYOND_WINDOW),
            None => Err(unlinked::NO_CALL),
        }
    }

    /// The kept call that began at `ts_ns`.
    pub fn find_mut(&mut self, ts_ns: u64) -> Option<&mut RecentCall> {
        let at = self.calls.partition_point(|c| c.ts_ns < ts_ns);
        self.calls.get_mut(at).filter(|c| c.ts_ns == ts_ns)
    }

    pub fn find(&self, ts_ns: u64) -> Option<&RecentCall> {
        let at = self.calls.partition_point(|c| c.ts_ns < ts_ns);
        self.calls.get(at).filter(|c| c.ts_ns == ts_ns)
    }
}
