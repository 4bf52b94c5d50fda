//! `cudatrace run`'s pipeline, top to bottom: **source** (the ring buffer) → **decode**
//! (`events::Decoder`: the probe catalog names each call's arguments) → **enrich**
//! (`analysis::Analysis`: kernel names and live device bytes into the line; the run's
//! stages and figures) → **sinks** (`sinks::jsonl::TraceWriter`; the progress line reads its
//! counts). Each stage knows only the one before it; this file wires them. `--power`'s
//! sampler is a second source: its lines need no decoding and go through enrich and sinks.

use std::io;

use aya::maps::{MapData, RingBuf};

use crate::{analysis::Analysis, events::Decoder, schema::PowerLine, sinks::jsonl::TraceWriter};

pub struct Pipeline<'a> {
    pub decoder: Decoder<'a>,
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

    /// One record through decode, enrich and the sinks.
    fn record(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(mut event) = self.decoder.decode(bytes) else {
            return Ok(());
        };
        self.analysis.enrich(&mut event);
        self.writer.event(&event)
    }

    /// `--power`: one tick's lines through enrich and the sinks.
    pub fn power(&mut self, lines: &[PowerLine]) -> io::Result<()> {
        for line in lines {
            self.analysis.power_sample(line);
            self.writer.write(line)?;
        }
        Ok(())
    }
}
