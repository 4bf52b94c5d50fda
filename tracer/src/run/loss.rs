//! Loss accounting: the kernel's per-CPU drop counters, read every tick, become `lost`
//! lines (one per reason that grew) and the footer's `lost` figures.

use std::io;

use super::clock::monotonic_ns;
use crate::{probes::maps::Counters, schema::LostLine, sinks::jsonl::TraceWriter};

/// The counters as last reported.
#[derive(Default)]
pub struct LossAccount {
    last: Counters,
}

impl LossAccount {
    /// Everything lost so far.
    pub fn lost(&self) -> u64 {
        self.last.lost()
    }

    /// Writes a `lost` line for each counter that grew since the last look, and sets the
    /// footer's figures.
    pub fn update(&mut self, now: Counters, writer: &mut TraceWriter) -> io::Result<()> {
        let last = &self.last;
        let ts_ns = monotonic_ns();
        for (reason, before, after) in [
            ("ring_full", last.ring_full, now.ring_full),
            ("too_deep", last.too_deep, now.too_deep),
            ("frames_full", last.frames_full, now.frames_full),
            (
                "process_ring_full",
                last.process_ring_full,
                now.process_ring_full,
            ),
            (
                "driver_ring_full",
                last.driver_ring_full,
                now.driver_ring_full,
            ),
            (
                "attach_ring_full",
                last.attach_ring_full,
                now.attach_ring_full,
            ),
        ] {
            if after > before {
                writer.write(&LostLine {
                    ts_ns,
                    reason: reason.into(),
                    count: after - before,
                    total: now.lost(),
                    ..LostLine::default()
                })?;
            }
        }
        let footer = &mut writer.footer;
        footer.lost.ring_full = now.ring_full;
        footer.lost.too_deep = now.too_deep;
        footer.lost.frames_full = now.frames_full;
        footer.lost.process_ring_full = now.process_ring_full;
        footer.lost.driver_ring_full = now.driver_ring_full;
        footer.lost.attach_ring_full = now.attach_ring_full;
        footer.abandoned_calls = now.abandoned_frames;
        footer.lost.calls = now.calls_lost();
        footer.lost.total = now.lost();
        footer.entries_seen = now.entries;
        footer.unmatched_returns = now.unmatched_returns;
        self.last = now;
        Ok(())
    }
}
