//! The decode stage of `cudatrace run`: a ring-buffer record to a trace line. Calls are
//! named through the plans (the probe id is the attach cookie), driver events through the
//! kernel's symbols, process events as they are, GPU records (`--gpu`) through each
//! process's kernel names and clock (`gpu.rs`).

use std::collections::HashMap;

use super::{
    call::decode_call_of,
    driver,
    gpu::{GpuDecoded, GpuDecoder, GpuEvent},
    process,
    raw::{DecodeError, RawEvent},
};
use crate::{
    catalog::cuda_result,
    probes::plan::Plans,
    schema::{CallLine, Line},
};

/// A decoded record: a line of the trace to be (the schema's [`Line`], which readers read
/// back), or a GPU record that is not a line yet.
#[derive(Debug, PartialEq)]
pub enum Event {
    /// A call, process or driver event.
    Line(Line),
    /// A GPU record, for the enrich stage to link (`--gpu`).
    Gpu(GpuEvent),
}

pub struct Decoder {
    /// Kernel function names by address, for kprobe events.
    kernel_functions: HashMap<u64, String>,
    gpu: GpuDecoder,
    /// The box of the last call written, given back ([`Decoder::recycle`]) for the next.
    spare_call: Option<Box<CallLine>>,
    /// Records that could not be decoded (the footer's `undecodable`).
    pub undecodable: u64,
}

impl Decoder {
    pub fn new(kernel_functions: HashMap<u64, String>) -> Self {
        Decoder {
            kernel_functions,
            gpu: GpuDecoder::default(),
            spare_call: None,
            undecodable: 0,
        }
    }

    /// The line a record (read as a [`RawEvent`]) becomes, its calls named through
    /// `plans` (which grow as libraries are found); `None` for a record that makes no sense
    /// (counted), or one kept for later records (a GPU kernel name or clock pair). Attach
    /// events are no line: they are for the attach layer.
    pub fn decode_raw(
        &mut self,
        raw: Result<RawEvent, DecodeError>,
        plans: &Plans,
    ) -> Option<Event> {
        let event = match raw {
            Ok(RawEvent::Call { call, data, .. }) => plans.probe(call.probe_id).map(|probe| {
                let result_name = plans
                    .get(probe.library)
                    .map_or(cuda_result::name as fn(u32) -> _, |plan| {
                        plan.set.result_name
                    });
                let mut line = decode_call_of(
                    &call,
                    data.as_deref(),
                    &probe.symbol,
                    probe.spec,
                    result_name,
                );
                line.lib = Some(probe.library);
                Event::Line(Line::Call(boxed(&mut self.spare_call, line)))
            }),
            Ok(RawEvent::Driver(event)) => Some(Event::Line(Line::Driver(Box::new(
                driver::decode(&event, &self.kernel_functions),
            )))),
            Ok(RawEvent::Proc(event)) => {
                let line = process::decode(&event);
                if line.event.ends_address_space() {
                    self.gpu.forget(line.pid);
                }
                Some(Event::Line(Line::Process(line)))
            }
            Ok(RawEvent::Gpu(record)) => match self.gpu.decode(record) {
                GpuDecoded::Event(event) => Some(Event::Gpu(event)),
                GpuDecoded::Consumed => return None,
                GpuDecoded::Unknown => None,
            },
            // Taken apart by the pipeline, record by record, before it comes here.
            Ok(RawEvent::GpuBatch { .. }) => None,
            // The stacks stage's (`run/pipeline.rs`): no line of their own here.
            Ok(RawEvent::Stack { .. } | RawEvent::Code { .. }) => return None,
            Ok(RawEvent::Attach(_)) | Err(_) => None,
        };
        if event.is_none() {
            self.undecodable += 1;
        }
        event
    }

    /// Takes a line back once it is written: a call's box holds the next call.
    pub fn recycle(&mut self, line: Line) {
        if let Line::Call(call) = line {
            self.spare_call = Some(call);
        }
    }
}

/// `call` in the spare box if there is one: a call is over a kilobyte, and allocating that
/// for each one takes the allocator's slow path.
fn boxed(spare: &mut Option<Box<CallLine>>, call: CallLine) -> Box<CallLine> {
    match spare.take() {
        Some(mut spare) => {
            *spare = call;
            spare
        }
        None => Box::new(call),
    }
}
