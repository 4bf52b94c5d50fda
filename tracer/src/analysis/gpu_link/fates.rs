//! What became of each launch, copy and memset (docs/gpu.md, "Every launch accounted
//! for"): its work has a GPU line, or it has a counted reason why not. A call is counted
//! once, when nothing more can come for it: when it leaves the window, when its process
//! ends, or when tracing does.
//!
//! The reasons, tried in this order:
//! 1. `captured`: made while its stream was being captured (its work runs in the graph);
//! 2. `failed`: it returned an error (its line, or CUPTI's record of it, says so);
//!    `empty`: a copy or memset of 0 bytes (nothing to run: CUPTI records none);
//! 3. `cupti_held`: another CUPTI client of the process held the activity API (in a
//!    `gpu_gap`), or took it while CUPTI still held the call's records (made after the last
//!    call CUPTI's records came for, before the gap: `handed_over`);
//! 4. `not_recorded`: CUPTI was not recording in the process then (a late start: before
//!    its ATTACHED record, from its DETACHED record on, or at the window's end: not
//!    returned when the library began turning CUPTI off, or its work not run by then);
//! 5. `no_api_record`: no record came for the call or a later one, but work of the
//!    process that started after the call came without its call's record (written
//!    unlinked): CUPTI recorded work again, not the calls (CUPTI 13.0 after torch.profiler);
//! 6. `not_flushed`: the process ended, and no record came for the call or a later one;
//! 7. `missing`: none of those.

use crate::schema::{GpuGapLine, IssuingCalls, gpu::fate};

use super::calls::RecentCall;

/// Another client's hold on the activity API.
#[derive(Clone, Debug)]
pub struct Gap {
    pub from_ns: u64,
    pub to_ns: Option<u64>,
    pub tid: u32,
    /// The latest start of a call of the process whose record came, before `from_ns`.
    pub last_recorded_before: u64,
    pub calls: u64,
    pub handed_over: u64,
}

/// A process's recording, as far as the account needs it.
#[derive(Default)]
pub struct Recording {
    /// Recording started (`gpu_info`), at the library's start.
    pub started: bool,
    /// It failed for good at this time.
    pub failed_at: Option<u64>,
    pub gaps: Vec<Gap>,
    /// The latest start of a call whose record came.
    pub last_recorded: u64,
    /// Started late (`-p PID --gpu`): calls before [`Self::attached_at`] were not recorded.
    pub late: bool,
    /// The latest start of a call whose work came (linked to it).
    pub last_with_work: Option<u64>,
    /// The latest GPU start of work written unlinked for want of its call's record.
    pub last_unlinked_work: u64,
    /// The process ended (exec or exit).
    pub ended: bool,
    /// A late start (`-p PID --gpu`): CUPTI recorded from here (its ATTACHED record) ...
    pub attached_at: Option<u64>,
    /// ... until here (its DETACHED record: the window ended).
    pub detached_at: Option<u64>,
    /// The other client let go, and the library is taking CUPTI back: calls from here on
    /// can get records again.
    pub releasing: bool,
}

impl Recording {
    /// Another client holds the activity API now.
    pub fn held(&self) -> bool {
        self.gaps.last().is_some_and(|gap| gap.to_ns.is_none())
    }

    /// Whether a call of this process can get CUPTI's record now.
    pub fn recording(&self) -> bool {
        self.started && self.failed_at.is_none() && (!self.held() || self.releasing)
    }

    /// CUPTI's record of a call that began at `start_ns` came.
    pub fn recorded(&mut self, start_ns: u64) {
        self.last_recorded = self.last_recorded.max(start_ns);
        for gap in self.gaps.iter_mut().filter(|gap| start_ns < gap.from_ns) {
            gap.last_recorded_before = gap.last_recorded_before.max(start_ns);
        }
    }

    /// Work that started at `start_ns` was written unlinked: its call's record never came.
    pub fn unlinked_work(&mut self, start_ns: u64) {
        self.last_unlinked_work = self.last_unlinked_work.max(start_ns);
    }

    /// Another client took the activity API at `ts_ns`.
    pub fn taken(&mut self, ts_ns: u64, tid: u32) {
        self.releasing = false;
        if self.held() {
            return;
        }
        self.gaps.push(Gap {
            from_ns: ts_ns,
            to_ns: None,
            tid,
            last_recorded_before: self.last_recorded,
            calls: 0,
            handed_over: 0,
        });
    }

    /// cudatrace's library had it back at `ts_ns`.
    pub fn resumed(&mut self, ts_ns: u64) {
        self.releasing = false;
        if let Some(gap) = self.gaps.last_mut().filter(|gap| gap.to_ns.is_none()) {
            gap.to_ns = Some(ts_ns.max(gap.from_ns));
        }
    }

    /// Counts `call` in `counts` (once).
    pub fn count(&mut self, call: &mut RecentCall, counts: &mut IssuingCalls) {
        if call.state.counted {
            return;
        }
        call.state.counted = true;
        counts.calls += 1;
        let reason = self.reason(call);
        match reason {
            None => counts.with_work += 1,
            Some(fate::CAPTURED) => counts.captured += 1,
            Some(fate::FAILED) => counts.failed += 1,
            Some(fate::EMPTY) => counts.empty += 1,
            Some(fate::CUPTI_HELD) => counts.cupti_held += 1,
            Some(fate::NO_API_RECORD) => counts.no_api_record += 1,
            Some(fate::NOT_RECORDED) => counts.not_recorded += 1,
            Some(fate::NOT_FLUSHED) => counts.not_flushed += 1,
            _ => counts.missing += 1,
        }
    }

    fn reason(&mut self, call: &RecentCall) -> Option<&'static str> {
        let state = &call.state;
        if state.work > 0 {
            return None;
        }
        if state.captured {
            return Some(fate::CAPTURED);
        }
        if state.failed || state.api_result.is_some_and(|result| result != 0) {
            return Some(fate::FAILED);
        }
        if state.empty {
            return Some(fate::EMPTY);
        }
        let ts = call.ts_ns;
        // A late start: calls outside the library's window were not recorded, whoever held
        // CUPTI then.
        if self.late
            && (self.attached_at.is_none_or(|at| ts < at)
                || self.detached_at.is_some_and(|at| at <= ts))
        {
            return Some(fate::NOT_RECORDED);
        }
        if let Some(gap) = self
            .gaps
            .iter_mut()
            .find(|gap| gap.from_ns <= ts && gap.to_ns.is_none_or(|to| ts <= to))
        {
            gap.calls += 1;
            return Some(fate::CUPTI_HELD);
        }
        if state.api_result.is_none()
            && let Some(gap) = self
                .gaps
                .iter_mut()
                .find(|gap| ts < gap.from_ns && ts > gap.last_recorded_before)
        {
            gap.handed_over += 1;
            return Some(fate::CUPTI_HELD);
        }
        if !self.started || self.failed_at.is_some_and(|at| at <= ts) {
            return Some(fate::NOT_RECORDED);
        }
        // Nor those at its end, while the library held CUPTI (`at_window_end`).
        if self.late
            && self
                .detached_at
                .is_some_and(|at| self.at_window_end(call, at))
        {
            return Some(fate::NOT_RECORDED);
        }
        if state.api_result.is_none() && ts > self.last_recorded && ts < self.last_unlinked_work {
            return Some(fate::NO_API_RECORD);
        }
        if self.ended && state.api_result.is_none() && ts > self.last_recorded {
            return Some(fate::NOT_FLUSHED);
        }
        Some(fate::MISSING)
    }

    /// A call made before the library began turning CUPTI off at `detached_at` whose
    /// records could still not come: it had not returned by then (CUPTI records a call as
    /// it returns: its return, or its thread's next call, came after), or its work had not
    /// run (no call of the process made after it got work, and no work written unlinked
    /// started after it: work runs in order, and the last work before the stop may find
    /// the kinds off).
    fn at_window_end(&self, call: &RecentCall, detached_at: u64) -> bool {
        let work_ran_after = self.last_with_work.is_some_and(|last| call.ts_ns < last)
            || call.ts_ns < self.last_unlinked_work;
        call.end_ns >= detached_at || !work_ran_after
    }

    /// Work of the call made at `ts_ns` came.
    pub fn worked(&mut self, ts_ns: u64) {
        self.last_with_work = Some(self.last_with_work.map_or(ts_ns, |last| last.max(ts_ns)));
    }

    /// The gap lines of process `pid`.
    pub fn gap_lines(&self, pid: u32) -> Vec<GpuGapLine> {
        self.gaps
            .iter()
            .map(|gap| GpuGapLine {
                pid,
                from_ns: gap.from_ns,
                to_ns: gap.to_ns,
                tid: gap.tid,
                calls: gap.calls,
                handed_over: gap.handed_over,
                ..GpuGapLine::default()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::gpu_link::calls::CallState;

    fn call(ts_ns: u64, state: CallState) -> RecentCall {
        RecentCall {
            ts_ns,
            end_ns: ts_ns + 1,
            open: false,
            function: None,
            state,
        }
    }

    fn recorded(ts_ns: u64) -> RecentCall {
        call(
            ts_ns,
            CallState {
                api_result: Some(0),
                ..CallState::default()
            },
        )
    }

    #[test]
    fn every_call_gets_one_reason_in_order() {
        let mut recording = Recording {
            started: true,
            ..Recording::default()
        };
        recording.recorded(100);
        recording.recorded(150);
        // Taken at 200, back at 300; records of calls up to 150 came before it.
        recording.taken(200, 9);
        assert!(recording.held() && !recording.recording());
        recording.resumed(300);
        recording.recorded(400);
        recording.failed_at = Some(900);
        recording.ended = true;
        let mut counts = IssuingCalls::default();
        let calls = [
            call(
                50,
                CallState {
                    work: 2,
                    ..CallState::default()
                },
            ),
            call(
                60,
                CallState {
                    captured: true,
                    api_result: Some(0),
                    ..CallState::default()
                },
            ),
            call(
                70,
                CallState {
                    failed: true,
                    ..CallState::default()
                },
            ),
            call(
                75,
                CallState {
                    empty: true,
                    api_result: Some(0),
                    ..CallState::default()
                },
            ),
            recorded(120),
            // After the last recorded call before the gap: its records went with CUPTI.
            call(180, CallState::default()),
            call(250, CallState::default()),
            call(300, CallState::default()),
            // Recorded, no work: missing.
            recorded(350),
            call(420, CallState::default()),
            call(950, CallState::default()),
        ];
        for mut call in calls {
            recording.count(&mut call, &mut counts);
            recording.count(&mut call, &mut counts);
        }
        assert_eq!(
            counts,
            IssuingCalls {
                calls: 11,
                with_work: 1,
                captured: 1,
                failed: 1,
                empty: 1,
                cupti_held: 3,
                no_api_record: 0,
                not_flushed: 1,
                not_recorded: 1,
                missing: 2,
            }
        );
        let lines = recording.gap_lines(4);
        assert_eq!(
            (lines[0].from_ns, lines[0].to_ns, lines[0].tid),
            (200, Some(300), 9)
        );
        assert_eq!((lines[0].calls, lines[0].handed_over), (2, 1));
    }

    #[test]
    fn calls_before_work_that_came_without_its_calls_records_have_no_api_record() {
        let mut recording = Recording {
            started: true,
            ..Recording::default()
        };
        recording.recorded(100);
        // Work that started at 600 was written unlinked: no record of its call came.
        recording.unlinked_work(600);
        recording.ended = true;
        let mut counts = IssuingCalls::default();
        // Before the last recorded call: missing; between it and the unlinked work: no
        // record of the call came while CUPTI recorded work; after the work: not flushed.
        for ts in [50, 200, 500, 700] {
            recording.count(&mut call(ts, CallState::default()), &mut counts);
        }
        assert_eq!(
            counts,
            IssuingCalls {
                calls: 4,
                no_api_record: 2,
                not_flushed: 1,
                missing: 1,
                ..IssuingCalls::default()
            }
        );
    }

    #[test]
    fn a_late_starts_edges_are_not_recorded_and_nothing_else_is() {
        let mut recording = Recording {
            started: true,
            late: true,
            attached_at: Some(100),
            detached_at: Some(1000),
            ..Recording::default()
        };
        // Work came for calls up to 800 (the kernels of calls after it had not run when
        // the library turned CUPTI off at 1000).
        recording.recorded(800);
        recording.worked(800);
        let mut counts = IssuingCalls::default();
        let open = |ts_ns, end_ns| RecentCall {
            end_ns,
            ..call(ts_ns, CallState::default())
        };
        let mut calls = [
            // Before ATTACHED.
            open(90, 95),
            // In the window, returned long before the stop, later work came: missing.
            open(500, 510),
            // Returned after the stop began (its thread's next call came after it).
            open(700, 1200),
            // After the last call that got work: its work had not run.
            open(900, 950),
            // From the stop on.
            open(1000, 1001),
            open(1500, u64::MAX),
        ];
        for call in &mut calls {
            recording.count(call, &mut counts);
        }
        assert_eq!(
            counts,
            IssuingCalls {
                calls: 6,
                not_recorded: 5,
                missing: 1,
                ..IssuingCalls::default()
            }
        );
        // Work written unlinked that started after a call: that call's work ran.
        recording.unlinked_work(950);
        let mut counts = IssuingCalls::default();
        recording.count(&mut open(900, 950), &mut counts);
        assert_eq!((counts.not_recorded, counts.no_api_record), (0, 1));
    }

    #[test]
    fn a_process_never_recording_has_its_calls_not_recorded() {
        let mut recording = Recording::default();
        let mut counts = IssuingCalls::default();
        recording.count(&mut call(5, CallState::default()), &mut counts);
        assert_eq!((counts.calls, counts.not_recorded), (1, 1));
        assert!(!recording.recording());
    }
}
