//! The processes the eBPF side stops until this side is done with them (a library they
//! opened is attached, a fork child gets its own probes), and continuing them: each once
//! its stops are handled, every one when tracing ends, and on every way out ([`Drop`]).

use anyhow::Result;

use super::maps::StopMaps;
use crate::keeper::Keeper;

/// The stops, and whether tracing is ending.
pub struct Stops {
    maps: StopMaps,
    /// The process that continues what is still stopped if cudatrace is killed; dropped
    /// (and reaped) after the last stop is continued here.
    keeper: Option<Keeper>,
    /// Tracing is ending: nothing more is stopped, and every stop goes on at once.
    ending: bool,
    /// The events' clock (`CLOCK_MONOTONIC` ns), to time the stops.
    clock: fn() -> u64,
}

/// A stopped process continued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Continued {
    pub pid: u32,
    /// How long it was stopped.
    pub stopped_ns: u64,
}

impl Stops {
    /// The stops, watched by a keeper process (`crate::keeper`); the error, when the keeper
    /// could not be started, is for the caller to report: stops still work without it.
    pub fn new(maps: StopMaps, clock: fn() -> u64) -> (Self, std::io::Result<()>) {
        let keeper = Keeper::spawn(maps.stopped_fd());
        let started = keeper
            .as_ref()
            .map(|_| ())
            .map_err(|e| std::io::Error::new(e.kind(), e.to_string()));
        let stops = Stops {
            maps,
            keeper: keeper.ok(),
            ending: false,
            clock,
        };
        (stops, started)
    }

    /// Lets the eBPF side stop processes.
    pub fn allow(&mut self) -> Result<()> {
        self.maps.allow(true)
    }

    /// Continues `pid`, stopped at `stopped_at_ns`, unless another of its stops is still
    /// to be handled.
    pub fn continue_process(&mut self, pid: u32, stopped_at_ns: u64) -> Option<Continued> {
        // Ending, nothing more is attached: each stop goes on at once (a stop that raced
        // with the end is continued here, whatever the stop counts say).
        if !self.ending && !self.maps.handled(pid) {
            // Another thread's stop of the same process is still to be handled.
            return None;
        }
        // SAFETY: kill(2); the pid was stopped by our probes (ESRCH if it died since).
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        Some(Continued {
            pid,
            stopped_ns: (self.clock)().saturating_sub(stopped_at_ns),
        })
    }

    /// Tracing ends: no more stops, and every process still stopped goes on (also when
    /// forbidding the stops failed; that error is returned, the first time).
    pub fn end(&mut self) -> Result<()> {
        let forbidden = match self.ending {
            true => Ok(()),
            false => {
                self.ending = true;
                self.maps.allow(false)
            }
        };
        for pid in self.maps.stopped_pids() {
            self.maps.forget(pid);
            // SAFETY: kill(2) of a process our probes stopped.
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
        }
        forbidden
    }
}

impl Drop for Stops {
    /// Every way out (an error, a panic) continues what was stopped; then the keeper goes,
    /// with nothing left to continue.
    fn drop(&mut self) {
        let _ = self.end();
        drop(self.keeper.take());
    }
}
