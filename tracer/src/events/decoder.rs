//! The decode stage of `cudatrace run`: a ring-buffer record to a trace line. Calls are
//! named through the plans (the probe id is the attach cookie), driver events through the
//! kernel's symbols, process events as they are.

use std::collections::HashMap;

use super::{
    call::decode_call,
    driver, process,
    raw::{DecodeError, RawEvent},
};
use crate::{
    probes::plan::Plans,
    schema::{CallLine, DriverLine, ProcessLine},
};

/// A decoded record: a line of the trace to be.
#[derive(Clone, Debug, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one event at a time, on the stack from decode to write: boxing calls would cost an allocation per call"
)]
pub enum Event {
    Call(CallLine),
    Process(ProcessLine),
    Driver(DriverLine),
}

pub struct Decoder {
    /// Kernel function names by address, for kprobe events.
    kernel_functions: HashMap<u64, String>,
    /// Records that could not be decoded (the footer's `undecodable`).
    pub undecodable: u64,
}

impl Decoder {
    pub fn new(kernel_functions: HashMap<u64, String>) -> Self {
        Decoder {
            kernel_functions,
            undecodable: 0,
        }
    }

    /// The line a record (read as a [`RawEvent`]) becomes, its calls named through
    /// `plans`; `None` (and counted) for a record that makes no sense. Attach events are no
    /// line: they are for the attach layer.
    pub fn decode_raw(
        &mut self,
        raw: Result<RawEvent, DecodeError>,
        plans: &Plans,
    ) -> Option<Event> {
        let event = match raw {
            Ok(RawEvent::Call { call, data }) => plans.probe(call.probe_id).map(|probe| {
                let mut line = decode_call(&call, data.as_deref(), &probe.symbol, probe.spec);
                line.lib = Some(probe.library);
                Event::Call(line)
            }),
            Ok(RawEvent::Driver(event)) => Some(Event::Driver(driver::decode(
                &event,
                &self.kernel_functions,
            ))),
            Ok(RawEvent::Proc(event)) => Some(Event::Process(process::decode(&event))),
            Ok(RawEvent::Attach(_)) | Err(_) => None,
        };
        if event.is_none() {
            self.undecodable += 1;
        }
        event
    }
}
