//! Loss accounting: the kernel's per-CPU drop counters, read every tick, and the records
//! a signal-stopped run had no time to write, become `lost` lines (one per reason that grew)
//! and the footer's `lost` figures.

use std::io;

use crate::{
    clock::monotonic_ns,
    probes::maps::Counters,
    schema::{LostCounts, LostLine},
    sinks::jsonl::TraceWriter,
};

/// Records left in the ring when a signal-stopped run's last drain ran out of time: read
/// and counted, not written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NotDrained {
    pub calls: u64,
    pub other: u64,
}

/// The footer's figures of the loss accounting, as last reported.
#[derive(Clone, Debug, Default)]
pub struct LossFigures {
    pub lost: LostCounts,
    /// Calls the kernel saw start in traced processes.
    pub entries_seen: u64,
    pub abandoned_calls: u64,
    pub unmatched_returns: u64,
}

/// The figures as last reported.
#[derive(Default)]
pub struct LossAccount {
    last: LossFigures,
    /// `--gpu`: the GPU figures are written (as 0 too).
    gpu: bool,
}

/// The footer's figures from the kernel's counters and what was not drained; the GPU
/// figures with `--gpu`, or once any is not 0.
fn lost_counts(now: &Counters, not_drained: NotDrained, gpu: bool) -> LostCounts {
    let not_drained_total = not_drained.calls + not_drained.other;
    let gpu_figure = |figure: u64| (gpu || now.gpu_lost() > 0).then_some(figure);
    LostCounts {
        ring_full: now.ring_full,
        too_deep: now.too_deep,
        frames_full: now.frames_full,
        process_ring_full: now.process_ring_full,
        driver_ring_full: now.driver_ring_full,
        gpu_ring_full: gpu_figure(now.gpu_ring_full),
        gpu_read_failed: gpu_figure(now.gpu_read_failed),
        cupti_dropped: gpu_figure(now.cupti_dropped),
        gpu_cupti_held: gpu_figure(now.gpu_cupti_held),
        gpu_no_api_record: gpu_figure(now.gpu_no_api_record),
        gpu_not_flushed: gpu_figure(now.gpu_not_flushed),
        gpu_not_recorded: gpu_figure(now.gpu_not_recorded),
        gpu_missing: gpu_figure(now.gpu_missing),
        traced_full: now.traced_full,
        fds_full: now.fds_full,
        opens_full: now.opens_full,
        syscalls_full: now.syscalls_full,
        kfuncs_full: now.kfuncs_full,
        attach_ring_full: now.attach_ring_full,
        unidentified_probe: now.unidentified_probe,
        child_unseen: now.child_unseen,
        library_not_attached: now.library_not_attached,
        not_drained: not_drained_total,
        // Known only at the end, from the trace file (`TraceWriter::finish`).
        unwritten: None,
        calls: now.calls_lost() + not_drained.calls,
        total: now.lost() + now.library_not_attached + not_drained_total,
    }
}

/// Each reason with its figure, in the order `lost` lines are written.
fn reasons(counts: &LostCounts) -> [(&'static str, u64); 22] {
    [
        ("ring_full", counts.ring_full),
        ("too_deep", counts.too_deep),
        ("frames_full", counts.frames_full),
        ("process_ring_full", counts.process_ring_full),
        ("driver_ring_full", counts.driver_ring_full),
        ("gpu_ring_full", counts.gpu_ring_full.unwrap_or(0)),
        ("gpu_read_failed", counts.gpu_read_failed.unwrap_or(0)),
        ("cupti_dropped", counts.cupti_dropped.unwrap_or(0)),
        ("gpu_cupti_held", counts.gpu_cupti_held.unwrap_or(0)),
        ("gpu_no_api_record", counts.gpu_no_api_record.unwrap_or(0)),
        ("gpu_not_flushed", counts.gpu_not_flushed.unwrap_or(0)),
        ("gpu_not_recorded", counts.gpu_not_recorded.unwrap_or(0)),
        ("gpu_missing", counts.gpu_missing.unwrap_or(0)),
        ("traced_full", counts.traced_full),
        ("fds_full", counts.fds_full),
        ("opens_full", counts.opens_full),
        ("syscalls_full", counts.syscalls_full),
        ("kfuncs_full", counts.kfuncs_full),
        ("attach_ring_full", counts.attach_ring_full),
        ("unidentified_probe", counts.unidentified_probe),
        ("child_unseen", counts.child_unseen),
        ("not_drained", counts.not_drained),
    ]
}

impl LossAccount {
    pub fn new(gpu: bool) -> Self {
        LossAccount {
            last: LossFigures::default(),
            gpu,
        }
    }

    /// Everything lost so far.
    pub fn lost(&self) -> u64 {
        self.last.lost.total
    }

    /// The footer's figures, as last reported.
    pub fn figures(&self) -> LossFigures {
        self.last.clone()
    }

    /// The `lost` figures, as last reported.
    pub fn last(&self) -> &LostCounts {
        &self.last.lost
    }

    /// Writes a `lost` line for each reason that grew since the last look, and keeps the
    /// footer's figures.
    pub fn update(
        &mut self,
        now: Counters,
        not_drained: NotDrained,
        writer: &mut TraceWriter,
    ) -> io::Result<()> {
        let counts = lost_counts(&now, not_drained, self.gpu);
        let ts_ns = monotonic_ns();
        for ((reason, after), (_, before)) in
            reasons(&counts).into_iter().zip(reasons(&self.last.lost))
        {
            if after > before {
                writer.write(&LostLine {
                    ts_ns,
                    reason: reason.into(),
                    count: after - before,
                    total: counts.total,
                    ..LostLine::default()
                })?;
            }
        }
        self.last = LossFigures {
            lost: counts,
            entries_seen: now.entries,
            abandoned_calls: now.abandoned_frames,
            unmatched_returns: now.unmatched_returns,
        };
        Ok(())
    }

    /// One line for stderr naming every reason that lost something, or `None`.
    pub fn describe(counts: &LostCounts) -> Option<String> {
        // Libraries not attached have lines of their own, naming them (the pipeline's).
        let libraries = ("library_not_attached", counts.library_not_attached);
        let parts: Vec<String> = reasons(counts)
            .into_iter()
            .chain([libraries])
            .filter(|(_, count)| *count > 0)
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_adds_up_and_calls_include_those_not_drained() {
        let now = Counters {
            ring_full: 1,
            too_deep: 2,
            frames_full: 4,
            process_ring_full: 8,
            driver_ring_full: 16,
            traced_full: 32,
            fds_full: 64,
            opens_full: 128,
            syscalls_full: 256,
            kfuncs_full: 512,
            attach_ring_full: 4096,
            unidentified_probe: 16384,
            child_unseen: 32768,
            // Not a loss: calls that can no longer return (the footer's abandoned_calls).
            abandoned_frames: 8192,
            ..Counters::default()
        };
        let counts = lost_counts(
            &now,
            NotDrained {
                calls: 1024,
                other: 2048,
            },
            false,
        );
        assert_eq!(counts.calls, 1 + 2 + 4 + 16384 + 1024);
        assert_eq!(counts.total, 4095 + 4096 + 16384 + 32768);
        assert_eq!(counts.unidentified_probe, 16384);
        assert_eq!(counts.child_unseen, 32768);
        assert_eq!(counts.attach_ring_full, 4096);
        assert_eq!(counts.not_drained, 3072);
        assert_eq!(
            LossAccount::describe(&LostCounts {
                frames_full: 3,
                opens_full: 2,
                ..LostCounts::default()
            })
            .as_deref(),
            Some("frames_full 3, opens_full 2")
        );
        assert_eq!(LossAccount::describe(&LostCounts::default()), None);
    }

    #[test]
    fn gpu_figures_are_written_with_gpu_or_once_one_is_not_zero() {
        let quiet = lost_counts(&Counters::default(), NotDrained::default(), false);
        assert_eq!(quiet.gpu_ring_full, None);
        let with_gpu = lost_counts(&Counters::default(), NotDrained::default(), true);
        assert_eq!(
            (
                with_gpu.gpu_ring_full,
                with_gpu.gpu_read_failed,
                with_gpu.cupti_dropped
            ),
            (Some(0), Some(0), Some(0))
        );
        let now = Counters {
            gpu_read_failed: 3,
            cupti_dropped: 5,
            traced_full: 7,
            ..Counters::default()
        };
        let counts = lost_counts(&now, NotDrained::default(), false);
        assert_eq!(
            (
                counts.gpu_ring_full,
                counts.gpu_read_failed,
                counts.cupti_dropped
            ),
            (Some(0), Some(3), Some(5))
        );
        assert_eq!((counts.calls, counts.total), (0, 15));
        assert_eq!(
            LossAccount::describe(&counts).as_deref(),
            Some("gpu_read_failed 3, cupti_dropped 5, traced_full 7")
        );
    }
}
