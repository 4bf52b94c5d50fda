//! `cudatrace run`'s pipeline, top to bottom: **source** (the ring buffer) → **decode**
//! (`events::Decoder`: the probe catalog names each call's arguments) → **enrich**
//! (`analysis::Analysis`: kernel names and live device bytes into the line; the run's
//! stages and figures) → **sinks** (`sinks::jsonl::TraceWriter`; the progress line reads its
//! counts). Each stage knows only the one before it; this file wires them.
//!
//! Beside it, the attach layer (`probes::discovery::Discovery`) takes the records that are
//! for it rather than for the trace: a library opened, a fork, an exec (it attaches, writes
//! a `library` line for a new file, and continues the stopped process), and every exit
//! (the process's probes go).

use std::io;

use aya::maps::{MapData, RingBuf};
use tracer_common::proc_event;

use crate::{
    analysis::Analysis,
    events::{Decoder, RawEvent, decode},
    probes::discovery::Discovery,
    sinks::jsonl::TraceWriter,
};

pub struct Pipeline<'a> {
    pub decoder: Decoder,
    pub discovery: &'a mut Discovery,
    pub analysis: &'a mut Analysis,
    pub writer: &'a mut TraceWriter,
}

impl Pipeline<'_> {
    /// The source: passes up to `budget` records from the ring down the pipeline; returns
    /// how many.
    pub fn drain(&mut self, ring: &mut RingBuf<MapData>, budget: usize) -> io::Result<usize> {
        let mut n = 0;
        while n < budget {
            let Some(record) = ring.next() else { break };
            self.record(&record)?;
            n += 1;
        }
        Ok(n)
    }

    /// One record through decode, enrich and the sinks (or to the attach layer).
    fn record(&mut self, bytes: &[u8]) -> io::Result<()> {
        let raw = decode(bytes);
        match &raw {
            Ok(RawEvent::Attach(event)) => {
                for line in self.discovery.handle(event) {
                    self.writer.write(&line)?;
                }
                return Ok(());
            }
            Ok(RawEvent::Proc(event)) if event.what == proc_event::EXIT => {
                self.discovery.process_exited(event.header.pid);
            }
            _ => {}
        }
        let Some(mut event) = self.decoder.decode_raw(raw, &self.discovery.plans) else {
            return Ok(());
        };
        self.analysis.enrich(&mut event);
        self.writer.event(&event)
    }
}
