//! Stream capture (per process): launches, copies and memsets made on a stream while it is
//! being captured into a graph run nothing; their work runs in the graph's launches. Each
//! capture is numbered (per process, from 1), on the `cuStreamBeginCapture*` and
//! `cuStreamEndCapture` lines that begin and end it (`capture`) and on every call it took
//! (`captured`).
//!
//! A capture takes the calls on its stream, and on every stream joined to it: a stream
//! that waits (`cuStreamWaitEvent`) on an event recorded (`cuEventRecord*`) on a captured
//! stream is captured too, into the same graph, until the capture ends.

use std::collections::HashMap;

use super::Role;
use crate::schema::CallLine;

#[derive(Default)]
pub struct CaptureState {
    /// Captures numbered so far.
    count: u64,
    /// Streams being captured, and their capture.
    streams: HashMap<u64, u64>,
    /// Events recorded on a captured stream, and that capture.
    events: HashMap<u64, u64>,
}

impl CaptureState {
    /// Marks a call of the process; `symbol` is its catalog name.
    pub fn observe(&mut self, role: Role, symbol: Option<&str>, record: &mut CallLine) {
        let stream = record.stream.map(|stream| stream.0);
        match role {
            Role::CaptureBegin => {
                if let (Some(stream), true) = (stream, record.ok()) {
                    self.count += 1;
                    self.streams.insert(stream, self.count);
                    record.capture = Some(self.count);
                }
            }
            Role::CaptureEnd => {
                // Ended, or invalidated by an error: the stream is not captured any more.
                if let Some(capture) = stream.and_then(|stream| self.streams.get(&stream).copied())
                {
                    record.capture = Some(capture);
                    self.streams.retain(|_, c| *c != capture);
                    self.events.retain(|_, c| *c != capture);
                }
            }
            Role::Launch | Role::GraphLaunch | Role::Copy | Role::Memset => {
                if let Some(capture) = stream.and_then(|stream| self.streams.get(&stream)) {
                    record.captured = Some(*capture);
                }
            }
            _ => self.ordering(symbol, record),
        }
    }

    /// Events and waits: how other streams join a capture.
    fn ordering(&mut self, symbol: Option<&str>, record: &CallLine) {
        let (Some(event), Some(stream)) = (record.event, record.stream) else {
            return;
        };
        match symbol {
            Some("cuEventRecord" | "cuEventRecordWithFlags") if record.ok() => {
                match self.streams.get(&stream.0) {
                    Some(capture) => {
                        self.events.insert(event.0, *capture);
                    }
                    None => {
                        self.events.remove(&event.0);
                    }
                }
            }
            Some("cuStreamWaitEvent") if record.ok() => {
                if let Some(capture) = self.events.get(&event.0) {
                    self.streams.insert(stream.0, *capture);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{analysis::classify, schema::Hex};

    fn call(name: &str, stream: u64, fill: impl FnOnce(&mut CallLine)) -> CallLine {
        let mut call = CallLine {
            name: name.into(),
            ret: Some(0),
            stream: Some(Hex(stream)),
            ..CallLine::default()
        };
        fill(&mut call);
        call
    }

    fn marks(state: &mut CaptureState, mut record: CallLine) -> (Option<u64>, Option<u64>) {
        let (role, symbol) = classify(&record.name);
        state.observe(role, symbol, &mut record);
        (record.capture, record.captured)
    }

    #[test]
    fn calls_on_a_captured_stream_and_its_joined_streams_are_captured() {
        let mut state = CaptureState::default();
        let launch = |stream| call("cuLaunchKernel", stream, |_| {});
        assert_eq!(marks(&mut state, launch(0xa)), (None, None));
        assert_eq!(
            marks(&mut state, call("cuStreamBeginCapture_v2", 0xa, |_| {})),
            (Some(1), None)
        );
        assert_eq!(marks(&mut state, launch(0xa)), (None, Some(1)));
        assert_eq!(marks(&mut state, launch(0xb)), (None, None));
        // Stream b waits on an event recorded on a: it joins capture 1.
        let event = |name, stream| call(name, stream, |c| c.event = Some(Hex(0xe)));
        marks(&mut state, event("cuEventRecord", 0xa));
        marks(&mut state, event("cuStreamWaitEvent", 0xb));
        assert_eq!(
            marks(&mut state, call("cuMemsetD32Async", 0xb, |_| {})),
            (None, Some(1))
        );
        // A failed launch is marked too (it is counted as failed first).
        assert_eq!(
            marks(
                &mut state,
                call("cuLaunchKernel", 0xa, |c| c.ret = Some(400))
            ),
            (None, Some(1))
        );
        assert_eq!(
            marks(&mut state, call("cuStreamEndCapture", 0xa, |_| {})),
            (Some(1), None)
        );
        assert_eq!(marks(&mut state, launch(0xa)), (None, None));
        assert_eq!(marks(&mut state, launch(0xb)), (None, None));
        // A second capture is number 2; a failed begin captures nothing.
        assert_eq!(
            marks(
                &mut state,
                call("cuStreamBeginCapture", 0xc, |c| c.ret = Some(1))
            ),
            (None, None)
        );
        assert_eq!(
            marks(&mut state, call("cuStreamBeginCaptureToGraph", 0xc, |_| {})),
            (Some(2), None)
        );
        assert_eq!(
            marks(&mut state, call("cuGraphLaunch", 0xc, |_| {})),
            (None, Some(2))
        );
    }
}
