//! Flow arrows from each kernel launch to the next synchronisation that waits for it:
//! `cuStreamSynchronize` on the launch's stream, or `cuCtxSynchronize*`, which waits for
//! every stream of the process. In `--gpu` traces also from each launch, copy and memset
//! call to the GPU work it issued ([`GpuFlows`]).
//!
//! Launches wait here until their synchronisation comes, so memory holds the launches not
//! yet synchronised, at most [`MAX_PENDING_PER_STREAM`] per stream (older ones are
//! dropped and counted: a program that never synchronises a stream gets no arrows).

use std::collections::VecDeque;

use foldhash::HashMap;

use crate::{catalog::is_per_thread_variant, schema::CallLine};

/// Launches kept per stream while waiting for a synchronisation.
pub const MAX_PENDING_PER_STREAM: usize = 65_536;

/// `CU_STREAM_LEGACY`: the legacy default stream, the same as stream 0.
const STREAM_LEGACY: u64 = 0x1;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
const STREAM_PER_THREAD: u64 = 0x2;

/// A stream of one process. A thread's per-thread default stream is its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamKey {
    stream: u64,
    /// The thread, for a per-thread default stream; 0 otherwise.
    per_thread: u32,
}

impl StreamKey {
    /// The stream a launch or `cuStreamSynchronize` names, if the line has one.
    pub fn of(record: &CallLine) -> Option<StreamKey> {
        let stream = record.stream?.0;
        // `_ptsz`/`_ptds` entry points treat stream 0 as the per-thread default stream.
        let per_thread_api = is_per_thread_variant(&record.name);
        Some(match stream {
            STREAM_PER_THREAD => StreamKey::thread_default(record.tid),
            0 if per_thread_api => StreamKey::thread_default(record.tid),
            STREAM_LEGACY => StreamKey {
                stream: 0,
                per_thread: 0,
            },
            stream => StreamKey {
                stream,
                per_thread: 0,
            },
        })
    }

    fn thread_default(tid: u32) -> StreamKey {
        StreamKey {
            stream: STREAM_PER_THREAD,
            per_thread: tid,
        }
    }
}

/// The start of a flow: a launch, on the exporter's relative clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowStart {
    pub id: u64,
    pub pid: u32,
    pub tid: u32,
    /// Where the arrow leaves: the middle of the launch's slice (ns since the base).
    pub ts_ns: u64,
    /// The start of the launch's slice (ns since the base): an arrow may leave as early as
    /// this where its other end comes before `ts_ns` (`chrome.rs`).
    pub slice_ts_ns: u64,
    /// The launch's own start on the trace clock, to leave launches that started after a
    /// synchronisation for the next one.
    pub launch_ts_ns: u64,
    /// Whether the launch's slice passed the filters (an arrow needs both ends).
    pub kept: bool,
    /// What the arrow shows: [`TO_SYNC`] or [`TO_GPU`].
    pub name: &'static str,
}

/// The arrow from a launch to the synchronisation that waited for it.
pub const TO_SYNC: &str = "launch → sync";
/// `--gpu`: the arrow from a launch, copy or memset call to the GPU work it issued.
pub const TO_GPU: &str = "call → GPU";

/// `--gpu`: calls whose GPU work has not come yet, kept for their arrow, at most this many
/// (older ones lose it, counted).
pub const MAX_WAITING_FOR_GPU: usize = 1 << 20;

/// `--gpu`: each launch, copy and memset call waits here for its first GPU work, by
/// `(pid, tid, ts_ns)` (the link a GPU line carries).
#[derive(Default)]
pub struct GpuFlows {
    waiting: HashMap<(u32, u32, u64), FlowStart>,
    order: VecDeque<(u32, u32, u64)>,
    /// Calls whose arrow was dropped because too many waited.
    pub dropped: u64,
}

impl GpuFlows {
    pub fn call(&mut self, start: FlowStart) {
        let key = (start.pid, start.tid, start.launch_ts_ns);
        if self.waiting.insert(key, start).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > MAX_WAITING_FOR_GPU {
            if let Some(old) = self.order.pop_front()
                && self.waiting.remove(&old).is_some()
            {
                self.dropped += 1;
            }
        }
    }

    /// The call `(pid, tid, ts_ns)` whose GPU work came: its flow, the first time only
    /// (the kernels of a graph share one call).
    pub fn work(&mut self, pid: u32, tid: u32, ts_ns: u64) -> Option<FlowStart> {
        self.waiting.remove(&(pid, tid, ts_ns))
    }

    /// The process exec'd or exited.
    pub fn forget_process(&mut self, pid: u32) {
        self.waiting.retain(|key, _| key.0 != pid);
        self.order.retain(|key| key.0 != pid);
    }
}

#[derive(Default)]
pub struct FlowTracker {
    next_id: u64,
    /// Per process, per stream: launches not yet synchronised, oldest first.
    pending: HashMap<u32, HashMap<StreamKey, VecDeque<FlowStart>>>,
    /// Launches dropped from a full queue.
    pub dropped: u64,
}

impl FlowTracker {
    /// A fresh flow id (ids are unique in the export).
    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A launch on `stream` of `start.pid` waits for its synchronisation.
    pub fn launch(&mut self, stream: StreamKey, start: FlowStart) {
        let queue = self
            .pending
            .entry(start.pid)
            .or_default()
            .entry(stream)
            .or_default();
        if queue.len() == MAX_PENDING_PER_STREAM {
            queue.pop_front();
            self.dropped += 1;
        }
        queue.push_back(start);
    }

    /// `cuStreamSynchronize(stream)` starting at `sync_ts_ns`: the launches it waits for.
    pub fn sync_stream(&mut self, pid: u32, stream: StreamKey, sync_ts_ns: u64) -> Vec<FlowStart> {
        let mut synced = Vec::new();
        if let Some(queue) = self.pending.get_mut(&pid).and_then(|s| s.get_mut(&stream)) {
            take_started_before(queue, sync_ts_ns, &mut synced);
        }
        synced
    }

    /// `cuCtxSynchronize*` starting at `sync_ts_ns`: every stream's launches.
    pub fn sync_process(&mut self, pid: u32, sync_ts_ns: u64) -> Vec<FlowStart> {
        let mut synced = Vec::new();
        if let Some(streams) = self.pending.get_mut(&pid) {
            for queue in streams.values_mut() {
                take_started_before(queue, sync_ts_ns, &mut synced);
            }
            streams.retain(|_, queue| !queue.is_empty());
        }
        synced.sort_by_key(|start| start.id);
        synced
    }

    /// The process exec'd or exited: its streams are gone.
    pub fn forget_process(&mut self, pid: u32) {
        self.pending.remove(&pid);
    }
}

/// Moves the launches that started by `ts_ns` from `queue` to `out`, in order.
fn take_started_before(queue: &mut VecDeque<FlowStart>, ts_ns: u64, out: &mut Vec<FlowStart>) {
    // Launches on one stream are nearly always in order; a later one from another thread
    // stays for the next synchronisation.
    let mut index = 0;
    while index < queue.len() {
        if queue[index].launch_ts_ns <= ts_ns {
            out.extend(queue.remove(index));
        } else {
            index += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Hex;

    fn record(name: &str, tid: u32, stream: u64) -> CallLine {
        CallLine {
            name: name.into(),
            pid: 1,
            tid,
            stream: Some(Hex(stream)),
            ..CallLine::default()
        }
    }

    fn start(tracker: &mut FlowTracker, ts: u64) -> FlowStart {
        FlowStart {
            id: tracker.next_id(),
            pid: 1,
            tid: 1,
            ts_ns: ts,
            slice_ts_ns: ts,
            launch_ts_ns: ts,
            kept: true,
            name: TO_SYNC,
        }
    }

    #[test]
    fn default_streams_are_told_apart() {
        let key = |name, tid, stream| StreamKey::of(&record(name, tid, stream)).unwrap();
        assert_eq!(key("cuLaunchKernel", 1, 0), key("cuLaunchKernel", 2, 1));
        assert_eq!(
            key("cuLaunchKernel_ptsz", 3, 0),
            key("cuStreamSynchronize", 3, 2)
        );
        assert_ne!(
            key("cuLaunchKernel_ptsz", 3, 0),
            key("cuLaunchKernel_ptsz", 4, 0)
        );
        assert_ne!(key("cuLaunchKernel", 1, 0), key("cuLaunchKernel", 1, 0x50));
        assert_eq!(StreamKey::of(&CallLine::default()), None);
    }

    #[test]
    fn a_stream_sync_takes_its_stream_and_a_context_sync_takes_all() {
        let mut tracker = FlowTracker::default();
        let a = StreamKey::of(&record("cuLaunchKernel", 1, 0xa)).unwrap();
        let b = StreamKey::of(&record("cuLaunchKernel", 1, 0xb)).unwrap();
        let first = start(&mut tracker, 10);
        let second = start(&mut tracker, 20);
        let third = start(&mut tracker, 30);
        let late = start(&mut tracker, 500);
        tracker.launch(a, first);
        tracker.launch(b, second);
        tracker.launch(a, third);
        tracker.launch(a, late);
        assert_eq!(tracker.sync_stream(1, a, 100), [first, third]);
        assert_eq!(tracker.sync_stream(1, a, 100), []);
        assert_eq!(tracker.sync_stream(2, b, 100), [], "another process");
        assert_eq!(tracker.sync_process(1, 100), [second]);
        assert_eq!(tracker.sync_process(1, 600), [late]);
        assert_eq!(tracker.dropped, 0);
    }

    #[test]
    fn queues_are_bounded() {
        let mut tracker = FlowTracker::default();
        let a = StreamKey::of(&record("cuLaunchKernel", 1, 0xa)).unwrap();
        for ts in 0..(MAX_PENDING_PER_STREAM as u64 + 10) {
            let launch = start(&mut tracker, ts);
            tracker.launch(a, launch);
        }
        assert_eq!(tracker.dropped, 10);
        let synced = tracker.sync_stream(1, a, u64::MAX);
        assert_eq!(synced.len(), MAX_PENDING_PER_STREAM);
        assert_eq!(synced[0].ts_ns, 10, "the oldest were dropped");
        let launch = start(&mut tracker, 1);
        tracker.launch(a, launch);
        tracker.forget_process(1);
        assert_eq!(tracker.sync_process(1, u64::MAX), []);
    }
}
