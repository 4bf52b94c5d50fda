//! `cudatrace run`'s pipeline, top to bottom: **source** (the ring buffer) → **decode**
//! (`events::Decoder`: the probe catalog names each call's arguments) → **enrich**
//! (`analysis::Analysis`: kernel names and live device bytes into the line; the run's
//! stages and figures) → **sinks** (`sinks::jsonl::TraceWriter`; the progress line reads its
//! counts). Each stage knows only the one before it; this file wires them.

use std::{
    io,
    time::{Duration, Instant},
};

use aya::maps::{MapData, RingBuf};

use crate::{analysis::Analysis, events::Decoder, sinks::jsonl::TraceWriter};

pub struct Pipeline<'a> {
    pub decoder: Decoder<'a>,
    pub analysis: &'a mut Analysis,
    pub writer: &'a mut TraceWriter,
}

/// What one drain did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drained {
    pub records: usize,
    /// The ring was found empty (rather than the budget running out).
    pub empty: bool,
}

/// Records between two looks at the clock.
const CLOCK_EVERY: usize = 256;

impl Pipeline<'_> {
    /// The source: passes records from the ring down the pipeline until it is empty, or
    /// `records` of them have passed, or `time` has elapsed, or `stop` says so.
    pub fn drain(
        &mut self,
        ring: &mut RingBuf<MapData>,
        records: usize,
        time: Duration,
        stop: &dyn Fn() -> bool,
    ) -> io::Result<Drained> {
        let deadline = Instant::now().checked_add(time);
        let mut n = 0;
        while n < records {
            if n % CLOCK_EVERY == CLOCK_EVERY - 1
                && (deadline.is_some_and(|deadline| Instant::now() >= deadline) || stop())
            {
                break;
            }
            let Some(record) = ring.next() else {
                return Ok(Drained {
                    records: n,
                    empty: true,
                });
            };
            self.record(&record)?;
            n += 1;
        }
        Ok(Drained {
            records: n,
            empty: false,
        })
    }

    /// One record through decode, enrich and the sinks.
    fn record(&mut self, bytes: &[u8]) -> io::Result<()> {
        let Some(mut event) = self.decoder.decode(bytes) else {
            return Ok(());
        };
        self.analysis.enrich(&mut event);
        self.writer.event(&event)
    }
}
