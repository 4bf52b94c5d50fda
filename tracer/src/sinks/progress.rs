//! The progress line on stderr while `cudatrace run` traces: calls so far, their rate and
//! the events lost.

use std::{
    io::IsTerminal,
    time::{Duration, Instant},
};

/// Live progress on stderr: rewritten in place on a terminal, a line every 10 s otherwise.
pub struct Progress {
    enabled: bool,
    tty: bool,
    started: Instant,
    last_print: Instant,
    last_calls: u64,
    printed: bool,
}

impl Progress {
    pub fn new(quiet: bool) -> Self {
        let now = Instant::now();
        Progress {
            enabled: !quiet,
            tty: std::io::stderr().is_terminal(),
            started: now,
            last_print: now,
            last_calls: 0,
            printed: false,
        }
    }

    /// Called on every tick; prints at most once a second (terminal) or ten seconds.
    pub fn update(&mut self, calls: u64, lost: u64) {
        let every = if self.tty {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(10)
        };
        if !self.enabled || self.last_print.elapsed() < every {
            return;
        }
        let rate = (calls - self.last_calls) as f64 / self.last_print.elapsed().as_secs_f64();
        let line = format!(
            "cudatrace: {:.0}s, {calls} calls, {rate:.0}/s, {lost} lost",
            self.started.elapsed().as_secs_f64()
        );
        if self.tty {
            eprint!("\r\x1b[K{line}");
        } else {
            eprintln!("{line}");
        }
        self.printed = true;
        self.last_print = Instant::now();
        self.last_calls = calls;
    }

    /// Clears the line on a terminal.
    pub fn finish(&mut self) {
        if self.enabled && self.tty && self.printed {
            eprint!("\r\x1b[K");
        }
    }
}
