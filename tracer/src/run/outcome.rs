//! How the traced work ended, and the exit code and words that follow from it.

/// How the traced work ended.
#[derive(Clone, Copy, Debug, Default)]
pub struct Outcome {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stopped_by: Option<&'static str>,
    /// `--duration`: the window's end stopped tracing while the command ran on.
    pub window_closed: bool,
}

impl Outcome {
    /// Tracing failed: no exit to report.
    pub fn failed() -> Self {
        Outcome::default()
    }

    /// The command's own code, or 128 + the signal that ended it or stopped cudatrace.
    pub fn process_exit_code(&self) -> i32 {
        match (self.stopped_by, self.code, self.signal) {
            (Some("SIGINT"), _, _) => 128 + libc::SIGINT,
            (Some("SIGTERM"), _, _) => 128 + libc::SIGTERM,
            (Some("SIGHUP"), _, _) => 128 + libc::SIGHUP,
            (Some("SIGQUIT"), _, _) => 128 + libc::SIGQUIT,
            (_, Some(code), _) => code,
            (_, None, Some(signal)) => 128 + signal,
            _ => 0,
        }
    }

    /// ` (command exited with 0)`, for the closing line.
    pub fn describe(&self) -> String {
        match (self.stopped_by, self.code, self.signal) {
            (Some(by), _, _) => format!(" (stopped by {by})"),
            (None, None, None) if self.window_closed => " (the window closed)".into(),
            (_, Some(code), _) => format!(" (command exited with {code})"),
            (_, None, Some(signal)) => format!(" (command killed by signal {signal})"),
            _ => String::new(),
        }
    }
}
