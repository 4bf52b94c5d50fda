//! Linking GPU work to the driver call that issued it, and accounting for every launch,
//! copy and memset (`cudatrace run --gpu`, between decoding and writing). docs/gpu.md,
//! "Linking" and "Every launch accounted for", has the rules:
//!
//! - CUPTI's record of a call (an [`ApiRecord`]: thread, start, end) lies inside exactly
//!   one traced `call` line: same pid and tid, `call.ts_ns <= api.start` and
//!   `api.end <= call.ts_ns + call.dur_ns` (the innermost, if calls nest). A call probed
//!   at entry alone (the launches under `--gpu`, `--launch-entry-only`) has no `dur_ns`: it
//!   is taken to last until the next launch, copy or memset call of its thread begins (or
//!   for ever, if it is the thread's last), and encloses only API records of its own
//!   function (CUPTI's callback id);
//! - a GPU record names its API record by correlation id (per process).
//!
//! Under `--gpu` a launch's line waits for CUPTI's record of it, which gives its result and
//! duration ([`HoldChange`]; the pipeline keeps the trace's order meanwhile).
//!
//! Records arrive late: the injection library hands them over when CUPTI flushes (every
//! 200 ms, and at exit), long after the call lines went by. So this keeps, per thread, the
//! latest [`CALL_WINDOW`] launch, copy and memset calls; per process the latest
//! [`API_WINDOW`] API records' links; and GPU records whose API record has not come yet,
//! for [`PENDING_NS`] at most. Memory is bounded by these, whatever the trace's length.
//! Nothing is ever dropped: a record that cannot be linked is written without a link, with
//! the reason (`unlinked`), and counted; a call is counted with what became of its work
//! (`fates.rs`).
//!
//! | file | |
//! |---|---|
//! | `calls.rs` | the calls kept per thread |
//! | `fates.rs` | what became of each call's work; `gpu_gap` lines |
//! | `holds.rs` | letting held launch lines go |
//! | `clients.rs` | other CUPTI clients of a process taking and letting go of CUPTI |
//! | `nodes.rs` | graph work to the captured call that made its node |

mod calls;
mod clients;
mod fates;
mod holds;
mod nodes;
#[cfg(test)]
mod tests;

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::LazyLock,
};

use tracer_common::cbids::LINKED_DRIVER_FUNCTIONS;

pub use self::clients::ClientChange;
pub use self::nodes::{Node, NodeLink};
use self::{
    calls::{CallState, RecentCall, Thread},
    clients::Clients,
    fates::Recording,
    holds::{release_held, release_held_before, release_one},
    nodes::{Graphs, launch_kernel},
};
use super::{Role, classify};
use crate::{
    catalog::STREAM_VARIANTS,
    events::gpu::{ApiRecord, Session},
    schema::{CallLine, GpuFooter, GpuGapLine, GpuLine, gpu::unlinked},
};

pub use calls::CALL_WINDOW;

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
/// How long a launch's line waits for CUPTI's record of it at most.
pub const HOLD_MAX_NS: u64 = 2_000_000_000;

/// What an API record linked to.
#[derive(Clone, Copy, Debug)]
struct ApiLink {
    /// The call line: `(tid, ts_ns)`, or why there is none.
    call: Result<(u32, u64), &'static str>,
    api_end_ns: u64,
}

/// A held launch line may go: with CUPTI's result and end (`result`), or as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldChange {
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    /// `(CUresult, end_ns)` from CUPTI's record of the call.
    pub result: Option<(u32, u64)>,
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
    recording: Recording,
    clients: Clients,
    graphs: Graphs,
    /// Held launch lines, `(tid, ts_ns)` in arrival order.
    held: VecDeque<(u32, u64)>,
}

/// The linking state of `cudatrace run --gpu` (a trace read back is linked already).
#[derive(Default)]
pub struct GpuLinker {
    processes: HashMap<u32, Process>,
    /// Processes that exec'd or exited whose lines are not all written yet, in order.
    ended: VecDeque<(u32, Process)>,
    /// The footer's `gpu` figures.
    pub counts: GpuFooter,
    /// Launch lines probed at entry alone wait for CUPTI's record of them.
    pub hold_launches: bool,
    /// Held lines that may go now, for the pipeline.
    pub holds: Vec<HoldChange>,
}

/// Whether a call's role issues GPU work.
fn issues_work(role: Role) -> bool {
    matches!(
        role,
        Role::Launch | Role::GraphLaunch | Role::Copy | Role::Memset
    )
}

impl GpuLinker {
    /// A call line as it arrives: kept for linking and the account if it issues work, and
    /// followed if it is a CUPTI client's. Returns whether its line must wait for CUPTI's
    /// record of it, and what changed about the process's CUPTI clients.
    pub fn call_arrived(&mut self, call: &CallLine) -> (bool, Option<ClientChange>) {
        let (role, _) = classify(&call.name);
        if role == Role::Cupti {
            let change = self.client_call(call);
            return (false, change);
        }
        if !issues_work(role) {
            return (false, None);
        }
        let process = self.processes.entry(call.pid).or_default();
        let hold = self.hold_launches
            && call.dur_ns.is_none()
            && matches!(role, Role::Launch | Role::GraphLaunch)
            && process.recording.recording();
        let state = CallState {
            held_since: hold.then_some(call.ts_ns),
            failed: call.ret.is_some_and(|ret| ret != 0),
            empty: matches!(role, Role::Copy | Role::Memset) && call.bytes == Some(0),
            ..CallState::default()
        };
        self.push_call(
            call.pid,
            call.tid,
            call.ts_ns,
            call.dur_ns,
            &call.name,
            state,
        );
        if hold {
            let process = self.processes.entry(call.pid).or_default();
            process.held.push_back((call.tid, call.ts_ns));
        }
        (hold, None)
    }

    /// A launch, copy or memset call of function `name`, for linking; `dur_ns` is `None`
    /// for a call probed at entry alone.
    #[cfg(test)]
    pub fn call(&mut self, pid: u32, tid: u32, ts_ns: u64, dur_ns: Option<u64>, name: &str) {
        self.push_call(pid, tid, ts_ns, dur_ns, name, CallState::default());
    }

    fn push_call(
        &mut self,
        pid: u32,
        tid: u32,
        ts_ns: u64,
        dur_ns: Option<u64>,
        name: &str,
        state: CallState,
    ) {
        let function = match dur_ns {
            Some(_) => None,
            None => FUNCTIONS.get(base(name)).copied(),
        };
        let process = self.processes.entry(pid).or_default();
        let evicted = process.threads.entry(tid).or_default().push(RecentCall {
            ts_ns,
            end_ns: dur_ns.map_or(u64::MAX, |dur| ts_ns.saturating_add(dur)),
            open: dur_ns.is_none(),
            function,
            state,
        });
        if let Some(mut old) = evicted {
            process.recording.count(&mut old, &mut self.counts.issuing);
        }
    }

    fn client_call(&mut self, call: &CallLine) -> Option<ClientChange> {
        let process = self.processes.entry(call.pid).or_default();
        let change = process.clients.call(call)?;
        self.client_change(call.pid, change);
        Some(change)
    }

    /// Recording started in a process (`gpu_info`).
    pub fn started(&mut self, session: Session, ts_ns: u64) -> Option<ClientChange> {
        self.counts.processes += 1;
        let process = self.processes.entry(session.pid).or_default();
        process.recording.started = true;
        let change = process.clients.started(session, ts_ns)?;
        self.client_change(session.pid, change);
        Some(change)
    }

    /// Recording failed for good in process `pid` at `ts_ns`.
    pub fn failed(&mut self, pid: u32, ts_ns: u64) {
        self.counts.fatal_errors += 1;
        let process = self.processes.entry(pid).or_default();
        process.recording.failed_at.get_or_insert(ts_ns);
        release_held(pid, process, &mut self.holds);
    }

    fn client_change(&mut self, pid: u32, change: ClientChange) {
        let process = self.processes.entry(pid).or_default();
        match change {
            ClientChange::Taken { ts_ns, tid } => {
                if !process.recording.held() {
                    self.counts.gaps += 1;
                }
                // Lines held still wait for their records: CUPTI may hand the buffers that
                // hold them back to the library, or to the other client (then they go
                // after HOLD_MAX_NS).
                process.recording.taken(ts_ns, tid);
            }
            ClientChange::Released { .. } => {
                process.recording.releasing = process.recording.held();
            }
        }
    }

    /// A late start in `pid` records from `ts_ns` (its ATTACHED record); calls before it
    /// have no GPU lines (`not_recorded`).
    pub fn attached(&mut self, pid: u32, ts_ns: u64) {
        let process = self.processes.entry(pid).or_default();
        process.recording.late = true;
        process.recording.attached_at = Some(ts_ns);
        process.recording.detached_at = None;
    }

    /// A late start in `pid` found another CUPTI client holding CUPTI at `ts_ns`: a gap
    /// from then (calls in it are `cupti_held`).
    pub fn held_at_attach(&mut self, pid: u32, ts_ns: u64) {
        let process = self.processes.entry(pid).or_default();
        process.recording.late = true;
        process.recording.attached_at = Some(ts_ns);
        self.client_change(pid, ClientChange::Taken { ts_ns, tid: 0 });
    }

    /// A late start's window ended in `pid` at `ts_ns`: the library records nothing more.
    pub fn detached(&mut self, pid: u32, ts_ns: u64) {
        let process = self.processes.entry(pid).or_default();
        process.recording.late = true;
        process.recording.detached_at = Some(ts_ns);
    }

    /// The injection library of `pid` yielded (`resumed` false) or had CUPTI back at `ts_ns`.
    pub fn client(&mut self, pid: u32, resumed: bool, ts_ns: u64) {
        if resumed {
            let process = self.processes.entry(pid).or_default();
            process.recording.resumed(ts_ns);
        }
    }

    /// CUPTI's record of a call, come at `arrived_ns`: its link, and the work that waited
    /// for it, into `out`.
    pub fn api(&mut self, api: ApiRecord, arrived_ns: u64, out: &mut Vec<GpuLine>) {
        self.counts.api_records += 1;
        let process = self.processes.entry(api.pid).or_default();
        process.last_api_ns = process.last_api_ns.max(arrived_ns);
        process.recording.recorded(api.start_ns);
        let function = FUNCTION_OF.get(&api.cbid).copied();
        let call = match process.threads.get_mut(&api.tid) {
            Some(thread) => match thread.enclosing(api.start_ns, api.end_ns, function) {
                Ok(call) => {
                    call.state.api_result = Some(api.result);
                    if call.state.held_since.take().is_some() {
                        self.holds.push(HoldChange {
                            pid: api.pid,
                            tid: api.tid,
                            ts_ns: call.ts_ns,
                            result: Some((api.result, api.end_ns)),
                        });
                    }
                    Ok((api.tid, call.ts_ns))
                }
                Err(reason) => Err(reason),
            },
            None => Err(unlinked::NO_CALL),
        };
        // A thread's records come in its calls' order: a launch of the thread held from
        // before this call has no record coming.
        let before = call.map_or(api.start_ns, |(_, ts)| ts);
        release_held_before(api.pid, api.tid, before, process, &mut self.holds);
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
                apply(&mut self.counts, process, &mut line, Some(link));
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
            apply(&mut self.counts, process, &mut line, Some(api));
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
    /// API records kept coming after it, or longer than [`PENDING_MAX_NS`]; lets go of
    /// launch lines held longer than [`HOLD_MAX_NS`].
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
                while let Some(&(tid, ts)) = process.held.front() {
                    let since =
                        thread_call(process, tid, ts).and_then(|call| call.state.held_since);
                    match since {
                        Some(since) if since.saturating_add(HOLD_MAX_NS) > now_ns => break,
                        _ => release_one(pid, process, &mut self.holds),
                    }
                }
            }
        }
    }

    /// A process exec'd or exited: nothing more will come for its work. Its waiting work
    /// goes out unlinked, its held lines go; it is counted once its lines are written
    /// ([`Self::finish_process`]).
    pub fn end_process(&mut self, pid: u32, out: &mut Vec<GpuLine>) {
        let mut process = self.processes.remove(&pid).unwrap_or_default();
        release_oldest(&mut process, &mut self.counts, Release::All, out);
        release_held(pid, &mut process, &mut self.holds);
        process.recording.ended = true;
        self.ended.push_back((pid, process));
    }

    /// The process a line being written belongs to: one that ended and whose lines are
    /// not all written yet comes first (a pid's lines before its exec are written first).
    fn written(&mut self, pid: u32) -> Option<&mut Process> {
        match self.ended.iter().position(|(ended, _)| *ended == pid) {
            Some(at) => self.ended.get_mut(at).map(|(_, process)| process),
            None => self.processes.get_mut(&pid),
        }
    }

    /// Tracing ended: every waiting record, unlinked; every held line.
    pub fn finish(&mut self, out: &mut Vec<GpuLine>) {
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            if let Some(process) = self.processes.get_mut(&pid) {
                release_oldest(process, &mut self.counts, Release::All, out);
                release_held(pid, process, &mut self.holds);
            }
        }
    }

    /// A call line as it is written (in the trace's order, its analysis fields given).
    pub fn call_written(&mut self, call: &CallLine) {
        let (role, _) = classify(&call.name);
        let Some(process) = self.written(call.pid) else {
            return;
        };
        process.graphs.call(call);
        if !issues_work(role) {
            return;
        }
        let Some(recent) = process
            .threads
            .get_mut(&call.tid)
            .and_then(|thread| thread.find_mut(call.ts_ns))
        else {
            return;
        };
        recent.state.captured = call.captured.is_some();
        recent.state.kernel = launch_kernel(call);
        if role == Role::GraphLaunch {
            recent.state.graph_exec = call.graph.map(|graph| graph.0);
        }
    }

    /// A GPU line as it is written: a kernel keeps its launch's name (CUPTI's goes to
    /// `cupti_kernel` where they differ), graph work gets the captured call that made its
    /// node. `replay` gives the nodes of the line's graph launch seen so far, `force` maps
    /// with what there is.
    pub fn line_written(
        &mut self,
        line: &mut GpuLine,
        replay: impl FnOnce() -> Vec<Node>,
        force: bool,
    ) -> NodeLink {
        let pid = line.pid();
        let Some(work) = line.work() else {
            return NodeLink::Done(None);
        };
        let (Some((tid, ts)), node) = (work.link.call(), work.link.graph_node_id) else {
            return NodeLink::Done(None);
        };
        let Some(state) = self
            .written(pid)
            .and_then(|process| thread_call(process, tid, ts))
            .map(|call| call.state.clone())
        else {
            return NodeLink::Done(None);
        };
        if let (GpuLine::Kernel(kernel), Some(launched)) = (&mut *line, &state.kernel)
            && state.graph_exec.is_none()
            && !kernel.link.warnings.iter().any(|w| w == "name_truncated")
            && kernel.kernel != "unknown"
            && *kernel.kernel != **launched
        {
            kernel.cupti_kernel = Some(std::mem::replace(&mut kernel.kernel, launched.to_string()));
            self.counts.name_mismatches += 1;
        }
        let (Some(exec), Some(node)) = (state.graph_exec, node) else {
            return NodeLink::Done(None);
        };
        let Some(process) = self.written(pid) else {
            return NodeLink::Done(None);
        };
        let own = Node::of(line);
        let found = process.graphs.link(
            exec,
            node,
            || own.into_iter().chain(replay()).collect(),
            force,
        );
        if let NodeLink::Done(found) = found {
            let link = line.link_mut().expect("work has a link");
            (link.capture_call_tid, link.capture_call_ts_ns) = found.unzip();
            match found {
                Some(_) => self.counts.graph_nodes.linked += 1,
                None => self.counts.graph_nodes.unlinked += 1,
            }
        }
        found
    }

    /// The lines of process `pid` up to its exec or exit are written: its calls are
    /// counted and its gaps said.
    pub fn finish_process(&mut self, pid: u32) -> Vec<GpuGapLine> {
        match self.ended.iter().position(|(ended, _)| *ended == pid) {
            Some(at) => {
                let (_, process) = self.ended.remove(at).expect("found");
                self.count(pid, process)
            }
            None => Vec::new(),
        }
    }

    fn count(&mut self, pid: u32, mut process: Process) -> Vec<GpuGapLine> {
        for thread in process.threads.values_mut() {
            for call in thread.calls.iter_mut() {
                process.recording.count(call, &mut self.counts.issuing);
            }
        }
        process.recording.gap_lines(pid)
    }

    /// Every line is written: every process is counted.
    pub fn finish_all(&mut self) -> Vec<GpuGapLine> {
        let mut lines = Vec::new();
        while let Some((pid, process)) = self.ended.pop_front() {
            lines.extend(self.count(pid, process));
        }
        let mut pids: Vec<u32> = self.processes.keys().copied().collect();
        pids.sort_unstable();
        for pid in pids {
            if let Some(process) = self.processes.remove(&pid) {
                lines.extend(self.count(pid, process));
            }
        }
        lines
    }

    /// Calls counted so far whose work (or CUPTI's record of the call) is lost, by reason:
    /// `(cupti_held, no_api_record, not_flushed, not_recorded, missing)`.
    pub fn unrecorded(&self) -> [u64; 5] {
        let issuing = &self.counts.issuing;
        [
            issuing.cupti_held,
            issuing.no_api_record,
            issuing.not_flushed,
            issuing.not_recorded,
            issuing.missing,
        ]
    }
}

fn thread_call(process: &Process, tid: u32, ts_ns: u64) -> Option<&RecentCall> {
    process.threads.get(&tid)?.find(ts_ns)
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
        apply(counts, process, &mut line, None);
        out.push(line);
        released += 1;
    }
}

/// Links `line` through its API record's link (or says why it cannot), counting it, and
/// counting the work toward its call.
fn apply(counts: &mut GpuFooter, process: &mut Process, line: &mut GpuLine, api: Option<ApiLink>) {
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
            if let Some(call) = process
                .threads
                .get_mut(&tid)
                .and_then(|thread| thread.find_mut(ts_ns))
            {
                call.state.work += 1;
            }
            process.recording.worked(ts_ns);
        }
        Err(reason) => {
            link.unlinked = Some(reason.into());
            match reason {
                unlinked::NO_API_RECORD => {
                    counts.unlinked.no_api_record += 1;
                    process.recording.unlinked_work(start);
                }
                unlinked::BEYOND_WINDOW => counts.unlinked.beyond_window += 1,
                _ => counts.unlinked.no_call += 1,
            }
        }
    }
}
