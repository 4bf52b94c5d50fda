//! `--start-at TIME` and `--duration D`: one recording window, the same instant on every
//! node (each node's wall clock: NTP's agreement). The probes are attached from the start
//! as usual, and every line goes through the analysis (kernel names, communicators and
//! ranks need the calls before the window); only the window's lines are written. At its
//! end tracing stops: detach, drain, footer. A command runs on: cudatrace stays its parent
//! and waits for it ([`wait_for_command`]), so launchers see the same process end.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Result, anyhow};

use crate::{
    clock::{Clocks, monotonic_ns},
    schema::{GpuLine, Line, WindowFooter, WindowInfo},
};

/// With `--gpu`, the time tracing goes on after the window's end, so that the GPU records
/// of the window's last calls arrive: CUPTI hands them over at its flushes, every 200 ms
/// (`cupti-inject`'s `FLUSH_PERIOD`). Lines of calls after the end are not written.
pub const GPU_GRACE: Duration = Duration::from_millis(600);

/// The window asked for, placed on the trace's clocks (`clocks`, the header's pair):
/// `start_at` (ns since the epoch; default: now) for `duration` (default: until the end).
pub fn place(start_at: Option<u64>, duration: Option<Duration>, clocks: &Clocks) -> WindowInfo {
    let wall_now = clocks
        .wall
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let start_wall_ns = start_at.unwrap_or(wall_now);
    let on_monotonic = |wall_ns: u64| {
        let ns = i128::from(clocks.monotonic_ns) + i128::from(wall_ns) - i128::from(wall_now);
        ns.clamp(0, i128::from(u64::MAX)) as u64
    };
    let end_wall_ns = duration.map(|d| start_wall_ns.saturating_add(d.as_nanos() as u64));
    let wall_text = |ns: u64| {
        humantime::format_rfc3339_nanos(UNIX_EPOCH + Duration::from_nanos(ns)).to_string()
    };
    WindowInfo {
        start_wall: wall_text(start_wall_ns),
        start_wall_ns,
        start_monotonic_ns: on_monotonic(start_wall_ns),
        end_wall: end_wall_ns.map(wall_text),
        end_wall_ns,
        end_monotonic_ns: end_wall_ns.map(on_monotonic),
        duration_ns: duration.map(|d| d.as_nanos() as u64),
    }
}

/// Before anything starts: a window already over is a usage error; one already begun
/// records from now (said on stderr).
pub fn check(start_at: Option<u64>, duration: Option<Duration>) -> Result<(), String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let Some(start) = start_at else {
        return Ok(());
    };
    let end = duration.map(|d| start.saturating_add(d.as_nanos() as u64));
    if end.is_some_and(|end| end <= now) {
        return Err(format!(
            "the window (--start-at, --duration) ended {:.3} s ago: nothing to record",
            (now - end.unwrap_or(now)) as f64 / 1e9
        ));
    }
    // A start long past or far ahead is a typo (`--start-at 0` is 1970), not a window.
    const DAY_NS: u64 = 24 * 3600 * 1_000_000_000;
    if start.saturating_add(DAY_NS) < now {
        return Err(format!(
            "--start-at {} is {:.1} days ago: give a time within the last day, or in the future",
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_nanos(start)),
            (now - start) as f64 / DAY_NS as f64
        ));
    }
    if start > now.saturating_add(30 * DAY_NS) {
        return Err(format!(
            "--start-at {} is {:.1} days ahead: cudatrace waits 30 days at most",
            humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_nanos(start)),
            (start - now) as f64 / DAY_NS as f64
        ));
    }
    if start < now {
        eprintln!(
            "cudatrace: warning: --start-at is {:.3} s in the past: recording from now",
            (now - start) as f64 / 1e9
        );
    }
    Ok(())
}

/// Which lines the window keeps, and the footer's count of those it left out.
pub struct WindowFilter {
    pub info: WindowInfo,
    pub footer: WindowFooter,
}

impl WindowFilter {
    pub fn new(info: WindowInfo) -> Self {
        WindowFilter {
            info,
            footer: WindowFooter::default(),
        }
    }

    /// Whether `line` is written; counts it when not. Lines with no time of their own in
    /// the window's sense (libraries, losses, GPU recording's info, errors and gaps) always are.
    pub fn keeps(&mut self, line: &Line) -> bool {
        let ts = match line {
            Line::Call(call) => call.ts_ns,
            Line::Process(process) => process.ts_ns,
            Line::Driver(driver) => driver.ts_ns,
            Line::Power(power) => power.ts_ns,
            Line::Gpu(gpu) => return self.keeps_gpu(gpu),
            _ => return true,
        };
        self.keeps_time(ts)
    }

    /// GPU work by the call that issued it (the work may run after the window's end);
    /// unlinked work by its own start.
    pub fn keeps_gpu(&mut self, line: &GpuLine) -> bool {
        let ts = match line {
            GpuLine::Kernel(work) => work.link.call_ts_ns.unwrap_or(work.ts_ns),
            GpuLine::Copy(work) => work.link.call_ts_ns.unwrap_or(work.ts_ns),
            GpuLine::Memset(work) => work.link.call_ts_ns.unwrap_or(work.ts_ns),
            GpuLine::Info(_) | GpuLine::Error(_) | GpuLine::Gap(_) => return true,
        };
        self.keeps_time(ts)
    }

    pub fn keeps_time(&mut self, ts_ns: u64) -> bool {
        if self.info.contains(ts_ns) {
            return true;
        }
        if ts_ns < self.info.start_monotonic_ns {
            self.footer.lines_before += 1;
        } else {
            self.footer.lines_after += 1;
        }
        false
    }

    /// When tracing is to stop, as a time of the event loop's clock (`CLOCK_MONOTONIC`,
    /// as the trace's): the window's end, later by [`GPU_GRACE`] with `--gpu`.
    pub fn stop_at(&self, gpu: bool) -> Option<tokio::time::Instant> {
        let end = self.info.end_monotonic_ns?;
        let grace = if gpu { GPU_GRACE } else { Duration::ZERO };
        let left = Duration::from_nanos(end.saturating_sub(monotonic_ns()));
        Some(tokio::time::Instant::now() + left + grace)
    }
}

/// After the window closed, the command runs on: wait for it, passing SIGTERM and SIGHUP
/// on (SIGINT and SIGQUIT come from the terminal to the command itself), and return its
/// (exit code, killing signal).
pub fn wait_for_command(
    pid: u32,
    take_signal: impl Fn() -> Option<i32>,
) -> Result<(Option<i32>, Option<i32>)> {
    // SAFETY: pidfd_open(2) returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(anyhow!(
            "watching the command (pid {pid}): {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a fresh descriptor we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    loop {
        let mut poll = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd. A signal interrupts it (EINTR): looked at below.
        let ready = unsafe { libc::poll(&mut poll, 1, 200) };
        if let Some(signal) = take_signal()
            && matches!(signal, libc::SIGTERM | libc::SIGHUP)
        {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid as i32, signal) };
        }
        if ready > 0 {
            return Ok(crate::spawn::reap(pid));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_long_past_or_far_ahead_is_refused() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let error = check(Some(0), None).unwrap_err();
        assert!(
            error.starts_with("--start-at 1970-01-01T00:00:00Z is 2"),
            "{error}"
        );
        assert!(error.ends_with(" days ago: give a time within the last day, or in the future"));
        let day = 24 * 3600 * 1_000_000_000;
        assert!(check(Some(now - day / 2), None).is_ok());
        assert!(check(Some(now + 29 * day), None).is_ok());
        let error = check(Some(now + 31 * day), None).unwrap_err();
        assert!(
            error.ends_with(" days ahead: cudatrace waits 30 days at most"),
            "{error}"
        );
    }

    #[test]
    fn the_window_is_placed_on_the_header_clocks_and_keeps_its_lines() {
        let clocks = Clocks {
            wall: UNIX_EPOCH + Duration::from_secs(1000),
            monotonic_ns: 5_000_000_000,
        };
        let info = place(
            Some(1_002_000_000_000),
            Some(Duration::from_millis(1500)),
            &clocks,
        );
        assert_eq!(info.start_monotonic_ns, 7_000_000_000);
        assert_eq!(info.end_monotonic_ns, Some(8_500_000_000));
        assert_eq!(info.end_wall_ns, Some(1_003_500_000_000));
        assert_eq!(info.start_wall, "1970-01-01T00:16:42.000000000Z");
        let mut filter = WindowFilter::new(info);
        let call = |ts_ns: u64| {
            Line::Call(Box::new(crate::schema::CallLine {
                ts_ns,
                ..Default::default()
            }))
        };
        let kept: Vec<bool> = [6_999_999_999, 7_000_000_000, 8_499_999_999, 8_500_000_000]
            .into_iter()
            .map(|ts| filter.keeps(&call(ts)))
            .collect();
        assert_eq!(kept, [false, true, true, false]);
        assert_eq!(
            (filter.footer.lines_before, filter.footer.lines_after),
            (1, 1)
        );
        // Without --start-at the window starts at the header's own time.
        let now = place(None, None, &clocks);
        assert_eq!(
            (now.start_monotonic_ns, now.end_monotonic_ns),
            (5_000_000_000, None)
        );
    }
}
