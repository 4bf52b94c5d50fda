//! Linking GPU work to the driver call that issued it (`cudatrace run --gpu`, the enrich
//! stage). docs/gpu.md, "Linking", has the rule:
//!
//! - CUPTI's record of a call (an [`ApiRecord`]: thread, start, end) lies inside exactly
//!   one traced `call` line: same pid and tid, `call.ts_ns <= api.start` and
//!   `api.end <= call.ts_ns + call.dur_ns` (the innermost, if calls nest). A call probed
//!   at entry alone (`--launch-entry-only`) has no `dur_ns`: it is taken to last until
//!   the next launch, copy or memset call of its thread begins (or for ever, if it is the
//!   thread's last), and encloses only API records of its own function (CUPTI's callback
//!   id), so that the work of a launch function cudatrace does not probe is not taken for
//!   the probed launch's;
//! - a GPU record names its API record by correlation id (per process).
//!
//! Records arrive late: the injection library hands them over when CUPTI flushes (every
//! 200 ms, and at exit), long after the call lines went by. So this keeps, per thread, the
//! latest [`CALL_WINDOW`] launch, copy and memset calls; per process the latest
//! [`API_WINDOW`] API records' links; and GPU records whose API record has not come yet,
//! for [`PENDING_NS`] at most. Memory is bounded by these, whatever the trace's length.
//! Nothing is ever dropped: a record that cannot be linked is written without a link, with
//! the reason (`unlinked`), and counted.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::LazyLock,
};

use tracer_common::cbids::LINKED_DRIVER_FUNCTIONS;

use crate::{
    catalog::STREAM_VARIANTS,
    events::gpu::ApiRecord,
    schema::{GpuFooter, GpuLine, gpu::unlinked},
};

/// A driver function's name without its per-thread-stream suffix (`_ptsz`, `_ptds`): a call
/// line names the catalog's function, CUPTI the form that was called.
fn base(name: &str) -> &str {
    STREAM_VARIANTS
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// The function (its [`base`] name) of each CUPTI callback id whose API records come.
static FUNCTION_OF: LazyLock<HashMap<u32, &'static str>> = LazyLock::new(|| {
    LINKED_DRIVER_FUNCTIONS
        .iter()
        .map(|&(name, cbid)| (cbid, base(name)))
        .collect()
});

/// Those functions' base names.
static FUNCTIONS: LazyLock<HashSet<&'static str>> =
    LazyLock::new(|| FUNCTION_OF.values().copied().collect());

/// Launch, copy and memset calls kept per thread for linking (about 2.5 s of the fastest
/// launch loop measured, 100k launches/s); an API record of an older call is
/// [`unlinked::BEYOND_WINDOW`].
pub const CALL_WINDOW: usize = 1 << 18;
/// API records' links kept per process (the work of a call arrives after its API record,
/// within a few flushes).
pub const API_WINDOW: usize = 1 << 18;
/// How long a GPU record waits for its API record before it is written unlinked, provided
/// API records of its process kept coming after it (its own should have been among them).
pub const PENDING_NS: u64 = 2_000_000_000;
/// How long it waits at most, whatever came.
pub const PENDING_MAX_NS: u64 = 30_000_000_000;
/// GPU records waiting per process; beyond, the oldest are written unlinked.
pub const PENDING_MAX: usize = 1 << 17;

/// A call kept for linking.
#[derive(Clone, Copy, Debug)]
struct RecentCall {
    ts_ns: u64,
    /// `u64::MAX` until the next call of the thread closes it, for a call whose return was
    /// not seen.
    end_ns: u64,
    /// Its return was not seen: `end_ns` is where the thread's next call began.
    open: bool,
    /// An open call's function (its [`base`] name): it encloses only API records of that
    /// function. `None` for a call whose return was seen, and for a function CUPTI's ids do
    /// not name (it encloses any).
    function: Option<&'static str>,
}

/// One thread's recent calls, by `ts_ns`.
#[derive(Default)]
struct Thread {
    calls: VecDeque<RecentCall>,
    /// Calls were pushed out of the window.
    evicted: bool,
}

/// What an API record linked to.
#[derive(Clone, Copy, Debug)]
struct ApiLink {
    /// The call line: `(tid, ts_ns)`, or why there is none.
    call: Result<(u32, u64), &'static str>,
    api_end_ns: u64,
}

#[derive(Default)]
struct Process {
    threads: HashMap<u32, Thread>,
    apis: HashMap<u32, ApiLink>,
    api_order: VecDeque<u32>,
    /// GPU lines waiting for their API record, by correlation id, with when they came.
    pending: HashMap<u32, Vec<(u64, GpuLine)>>,
    pending_order: VecDeque<(u64, u32)>,
    pending_count: usize,
    /// When the latest API record came.
    last_api_ns: u64,
}

/// The enrich stage's linking state (`cudatrace run --gpu` only: a trace read back is
/// linked already).
#[derive(Default)]
pub struct GpuLinker {
    processes: HashMap<u32, Process>,
    /// The footer's `gpu` figures.
    pub counts: GpuFooter,
}

impl Thread {
    fn push(&mut self, call: RecentCall) {
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
            self.calls.pop_front();
            self.evicted = true;
        }
    }

    /// The innermost kept call enclosing `[start, end]`, the API record of `function`.
    fn enclosing(
        &self,
        start: u64,
        end: u64,
        function: Option<&str>,
    ) -> Result<RecentCall, &'static str> {
        let after = self.calls.partition_point(|c| c.ts_ns <= start);
        let found = self.calls.range(..after).rev().find(|c| {
            c.end_ns >= end && (!c.open || c.function.is_none() || c.function == function)
        });
        let oldest = self.calls.front().map_or(u64::MAX, |c| c.ts_ns);
        match found {
            Some(call) => Ok(*call),
            // Before the oldest call kept: its call may have been pushed out.
            None if self.evicted && start < oldest => Err(unlinked::BEYOND_WINDOW),
            None => Err(unlinked::NO_CALL),
        }
    }
}

impl GpuLinker {
    /// A launch, copy or memset call line of function `name`, as it goes by; `dur_ns` is
    /// `None` for a call probed at entry alone.
    pub fn call(&mut self, pid: u32, tid: u32, ts_ns: u64, dur_ns: Option<u64>, name: &str) {
        let function = match dur_ns {
            Some(_) => None,
            None => FUNCTIONS.get(base(name)).copied(),
        };
        self.processes
            .entry(pid)
            .or_default()
            .threads
            .entry(tid)
            .or_default()
            .push(RecentCall {
                ts_ns,
                end_ns: dur_ns.map_or(u64::MAX, |dur| ts_ns.saturating_add(dur)),
                open: dur_ns.is_none(),
                function,
            });
    }

    /// CUPTI's record of a call, come at `arrived_ns`: its link, and the work that waited
    /// for it, into `out`.
    pub fn api(&mut self, api: ApiRecord, arrived_ns: u64, out: &mut Vec<GpuLine>) {
        self.counts.api_records += 1;
        let process = self.processes.entry(api.pid).or_default();
        process.last_api_ns = process.last_api_ns.max(arrived_ns);
        let function = FUNCTION_OF.get(&api.cbid).copied();
        let call = match process.threads.get(&api.tid) {
            Some(thread) => thread
                .enclosing(api.start_ns, api.end_ns, function)
                .map(|call| (api.tid, call.ts_ns)),
            None => Err(unlinked::NO_CALL),
        };
        let link = ApiLink {
            call,
            api_end_ns: api.end_ns,
        };
        if process.apis.insert(api.correlation_id, link).is_none() {
            process.api_order.push_back(api.correlation_id);
            if process.api_order.len() > API_WINDOW
                && let Some(old) = process.api_order.pop_front()
            {
                process.apis.remove(&old);
            }
        }
        if let Some(waiting) = process.pending.remove(&api.correlation_id) {
            process.pending_count -= waiting.len();
            for (_, mut line) in waiting {
                apply(&mut self.counts, &mut line, Some(link));
                out.push(line);
            }
        }
    }

    /// A kernel, copy or memset line (decoded, unlinked) that came at `arrived_ns`: linked
    /// into `out` if its API record came already, else kept until it does.
    pub fn work(&mut self, mut line: GpuLine, arrived_ns: u64, out: &mut Vec<GpuLine>) {
        let Some(link) = line.link_mut() else {
            out.push(line);
            return;
        };
        let id = link.correlation_id;
        let process = self.processes.entry(line.pid()).or_default();
        if let Some(api) = process.apis.get(&id).copied() {
            apply(&mut self.counts, &mut line, Some(api));
            out.push(line);
            return;
        }
        process
            .pending
            .entry(id)
            .or_default()
            .push((arrived_ns, line));
        process.pending_order.push_back((arrived_ns, id));
        process.pending_count += 1;
        if process.pending_count > PENDING_MAX {
            release_oldest(process, &mut self.counts, Release::Oldest(1), out);
        }
    }

    /// Writes unlinked the work that waited longer than [`PENDING_NS`] by `now_ns` while
    /// API records kept coming after it, or longer than [`PENDING_MAX_NS`].
    pub fn expire(&mut self, now_ns: u64, out: &mut Vec<GpuLine>) {
        let release = Release::Expired {
            before: now_ns.saturating_sub(PENDING_NS),
            hard_before: now_ns.saturating_sub(PENDING_MAX_NS),
        };
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            if let Some(process) = self.processes.get_mut(&pid) {
                release_oldest(process, &mut self.counts, release, out);
            }
        }
    }

    /// A process exec'd or exited: nothing more will come for its work.
    pub fn end_process(&mut self, pid: u32, out: &mut Vec<GpuLine>) {
        if let Some(mut process) = self.processes.remove(&pid) {
            release_oldest(&mut process, &mut self.counts, Release::All, out);
        }
    }

    /// Tracing ended: every waiting record, unlinked.
    pub fn finish(&mut self, out: &mut Vec<GpuLine>) {
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            self.end_process(pid, out);
        }
    }
}

/// Which waiting records [`release_oldest`] writes unlinked.
#[derive(Clone, Copy)]
enum Release {
    /// This many, oldest first.
    Oldest(usize),
    /// Those that came before `before` with API records after them, or before
    /// `hard_before`.
    Expired {
        before: u64,
        hard_before: u64,
    },
    All,
}

/// Writes unlinked the waiting records `release` names, oldest first.
fn release_oldest(
    process: &mut Process,
    counts: &mut GpuFooter,
    release: Release,
    out: &mut Vec<GpuLine>,
) {
    let mut released = 0;
    while let Some(&(arrived, id)) = process.pending_order.front() {
        let due = match release {
            Release::Oldest(limit) => released < limit,
            Release::Expired {
                before,
                hard_before,
            } => arrived < hard_before || (arrived < before && process.last_api_ns > arrived),
            Release::All => true,
        };
        if !due {
            break;
        }
        process.pending_order.pop_front();
        // An entry whose records were linked meanwhile is stale.
        let Some(waiting) = process.pending.get_mut(&id) else {
            continue;
        };
        let Some(at) = waiting.iter().position(|(a, _)| *a == arrived) else {
            continue;
        };
        let (_, mut line) = waiting.remove(at);
        if waiting.is_empty() {
            process.pending.remove(&id);
        }
        process.pending_count -= 1;
        apply(counts, &mut line, None);
        out.push(line);
        released += 1;
    }
}

/// Links `line` through its API record's link (or says why it cannot), counting it.
fn apply(counts: &mut GpuFooter, line: &mut GpuLine, api: Option<ApiLink>) {
    let start = line.work().map_or(0, |work| work.ts_ns);
    let Some(link) = line.link_mut() else { return };
    let call = match api {
        Some(api) => {
            if link.timed() && api.api_end_ns != 0 {
                link.queued_ns = Some(start as i64 - api.api_end_ns as i64);
            }
            api.call
        }
        None => Err(unlinked::NO_API_RECORD),
    };
    match call {
        Ok((tid, ts_ns)) => {
            link.call_tid = Some(tid);
            link.call_ts_ns = Some(ts_ns);
            counts.linked += 1;
        }
        Err(reason) => {
            link.unlinked = Some(reason.into());
            match reason {
                unlinked::NO_API_RECORD => counts.unlinked.no_api_record += 1,
                unlinked::BEYOND_WINDOW => counts.unlinked.beyond_window += 1,
                _ => counts.unlinked.no_call += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{GpuKernelLine, GpuLink};

    fn kernel(pid: u32, correlation_id: u32, ts_ns: u64) -> GpuLine {
        GpuLine::Kernel(GpuKernelLine {
            pid,
            ts_ns,
            dur_ns: 10,
            kernel: "k".into(),
            link: GpuLink {
                correlation_id,
                ..GpuLink::default()
            },
            ..GpuKernelLine::default()
        })
    }

    fn api(tid: u32, correlation_id: u32, start_ns: u64, end_ns: u64) -> ApiRecord {
        api_of(307, tid, correlation_id, start_ns, end_ns)
    }

    /// CUPTI's record of a call to function `cbid`.
    fn api_of(cbid: u32, tid: u32, correlation_id: u32, start_ns: u64, end_ns: u64) -> ApiRecord {
        ApiRecord {
            pid: 1,
            tid,
            correlation_id,
            start_ns,
            end_ns,
            cbid,
            result: 0,
        }
    }

    fn link(line: &GpuLine) -> (Option<(u32, u64)>, Option<i64>, Option<&str>) {
        let GpuLine::Kernel(k) = line else { panic!() };
        (k.link.call(), k.link.queued_ns, k.link.unlinked.as_deref())
    }

    #[test]
    fn work_links_to_the_innermost_call_around_its_api_record_in_either_order() {
        let mut linker = GpuLinker::default();
        let mut out = Vec::new();
        // Thread 1: an outer call 100..400 around an inner one 150..250 (the inner returns,
        // and so arrives, first); thread 2: 120..300.
        linker.call(1, 1, 150, Some(100), "cuLaunchKernel");
        linker.call(1, 1, 100, Some(300), "cuLaunchKernel");
        linker.call(1, 2, 120, Some(180), "cuLaunchKernel");
        linker.api(api(1, 5, 160, 240), 0, &mut out);
        assert!(out.is_empty());
        linker.work(kernel(1, 5, 1240), 0, &mut out);
        assert_eq!(link(&out[0]), (Some((1, 150)), Some(1000), None));
        // The work first, then its API record.
        linker.work(kernel(1, 6, 500), 0, &mut out);
        assert_eq!(out.len(), 1);
        linker.api(api(1, 6, 110, 390), 0, &mut out);
        assert_eq!(link(&out[1]), (Some((1, 100)), Some(110), None));
        // Another thread's call; graph kernels share their call.
        linker.api(api(2, 7, 130, 290), 0, &mut out);
        linker.work(kernel(1, 7, 280), 0, &mut out);
        linker.work(kernel(1, 7, 300), 0, &mut out);
        assert_eq!(link(&out[2]), (Some((2, 120)), Some(-10), None));
        assert_eq!(link(&out[3]).0, Some((2, 120)));
        // An API record no call encloses.
        linker.api(api(2, 8, 50, 60), 0, &mut out);
        linker.work(kernel(1, 8, 70), 0, &mut out);
        assert_eq!(link(&out[4]), (None, Some(10), Some("no_call")));
        assert_eq!(linker.counts.linked, 4);
        assert_eq!(linker.counts.unlinked.no_call, 1);
        assert_eq!(linker.counts.api_records, 4);
    }

    #[test]
    fn waiting_work_is_written_unlinked_never_dropped() {
        let mut linker = GpuLinker::default();
        let mut out = Vec::new();
        linker.work(kernel(1, 1, 10), 1_000, &mut out);
        linker.work(kernel(1, 2, 20), 2_000_000_000, &mut out);
        linker.work(kernel(2, 3, 30), 5, &mut out);
        // Without API records since, waiting work stays (its record may be late)...
        linker.expire(PENDING_NS + 1_500, &mut out);
        assert!(out.is_empty());
        // ...until API records of its process come after it, or it waited too long.
        linker.api(api(1, 9, 1, 2), 3_000, &mut out);
        linker.expire(PENDING_NS + 1_500, &mut out);
        assert_eq!(out.len(), 1);
        linker.expire(PENDING_MAX_NS + 10, &mut out);
        let first: Vec<_> = out.iter().map(|l| (l.pid(), link(l).2)).collect();
        assert_eq!(
            first,
            [(1, Some("no_api_record")), (2, Some("no_api_record"))]
        );
        linker.end_process(1, &mut out);
        assert_eq!(out.len(), 3);
        assert_eq!(linker.counts.unlinked.no_api_record, 3);
        linker.work(kernel(1, 4, 40), 0, &mut out);
        linker.finish(&mut out);
        assert_eq!(out.len(), 4);
        // Beyond the waiting limit, the oldest go first.
        let mut linker = GpuLinker::default();
        let mut out = Vec::new();
        for id in 0..=PENDING_MAX as u32 {
            linker.work(kernel(1, id, u64::from(id)), u64::from(id), &mut out);
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].work().unwrap().ts_ns, 0);
    }

    #[test]
    fn a_call_without_its_return_lasts_until_the_threads_next_call() {
        let mut linker = GpuLinker::default();
        let mut out = Vec::new();
        // Thread 1: entry-only launches at 100 and 300, a copy 500..600 and a last launch
        // at 700; thread 2: an entry-only launch at 200.
        linker.call(1, 1, 100, None, "cuLaunchKernel");
        linker.call(1, 2, 200, None, "cuLaunchKernel");
        linker.call(1, 1, 300, None, "cuLaunchKernel");
        linker.call(1, 1, 500, Some(100), "cuMemcpyHtoD");
        linker.call(1, 1, 700, None, "cuLaunchKernel");
        for (id, tid, start, end) in [
            (1, 1, 110, 290),
            (2, 2, 210, 10_000),
            (3, 1, 310, 490),
            (4, 1, 510, 590),
            (5, 1, 710, 10_000),
            // Past the launch at 300 but not before the copy began: no call encloses it.
            (6, 1, 320, 520),
            // Between the copy's end and the next launch: the copy is over.
            (7, 1, 650, 660),
        ] {
            linker.api(api(tid, id, start, end), 0, &mut out);
            linker.work(kernel(1, id, 20_000), 0, &mut out);
        }
        let calls: Vec<_> = out.iter().map(|line| link(line).0).collect();
        assert_eq!(
            calls,
            [
                Some((1, 100)),
                Some((2, 200)),
                Some((1, 300)),
                Some((1, 500)),
                Some((1, 700)),
                None,
                None
            ]
        );
        assert_eq!(
            (linker.counts.linked, linker.counts.unlinked.no_call),
            (5, 2)
        );
    }

    #[test]
    fn a_call_without_its_return_encloses_only_its_own_functions_api_records() {
        let mut linker = GpuLinker::default();
        let mut out = Vec::new();
        // Entry-only: cuLaunchKernel at 100 (probed as its _ptsz form), cuGraphLaunch at
        // 400; with its return seen: cuLaunchKernel 700..800.
        linker.call(1, 1, 100, None, "cuLaunchKernel");
        linker.call(1, 1, 400, None, "cuGraphLaunch");
        linker.call(1, 1, 700, Some(100), "cuLaunchKernel");
        for (id, cbid, start, end) in [
            // cuLaunchKernel_ptsz (442) and cuLaunchKernel (307) inside the launch at 100.
            (1, 442, 110, 190),
            (2, 307, 210, 290),
            // cuLaunch (115), cuLaunchGrid (116): functions cudatrace does not probe, made
            // while the launch at 100 is taken to last.
            (3, 115, 300, 310),
            (4, 116, 320, 330),
            // cuGraphLaunch_ptsz (515) in the graph launch; a kernel launch there is not.
            (5, 515, 410, 420),
            (6, 307, 430, 440),
            // A call whose return was seen encloses what lies inside it, whatever its id.
            (7, 115, 710, 720),
        ] {
            linker.api(api_of(cbid, 1, id, start, end), 0, &mut out);
            linker.work(kernel(1, id, 20_000), 0, &mut out);
        }
        let calls: Vec<_> = out.iter().map(|line| link(line).0).collect();
        assert_eq!(
            calls,
            [
                Some((1, 100)),
                Some((1, 100)),
                None,
                None,
                Some((1, 400)),
                None,
                Some((1, 700))
            ]
        );
        assert_eq!(
            (linker.counts.linked, linker.counts.unlinked.no_call),
            (4, 3)
        );
    }

    #[test]
    fn calls_beyond_the_window_are_told_apart() {
        let mut linker = GpuLinker::default();
        let mut out = Vec::new();
        for i in 0..=CALL_WINDOW as u64 {
            linker.call(1, 1, i * 10, Some(5), "cuLaunchKernel");
        }
        linker.api(api(1, 1, 1, 2), 0, &mut out);
        linker.work(kernel(1, 1, 100), 0, &mut out);
        assert_eq!(link(&out[0]).2, Some("beyond_window"));
        linker.api(api(1, 2, 11, 12), 0, &mut out);
        linker.work(kernel(1, 2, 100), 0, &mut out);
        assert_eq!(link(&out[1]).0, Some((1, 10)));
        assert_eq!(linker.counts.unlinked.beyond_window, 1);
    }
}
