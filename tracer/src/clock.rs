//! The trace's clock: `CLOCK_MONOTONIC`, the clock of every event's `ts_ns`.

use std::time::SystemTime;

/// The monotonic clock of `ts_ns` and the wall clock, read together.
#[derive(Clone, Copy, Debug)]
pub struct Clocks {
    pub wall: SystemTime,
    pub monotonic_ns: u64,
}

impl Clocks {
    pub fn now() -> Self {
        let wall = SystemTime::now();
        Clocks {
            wall,
            monotonic_ns: monotonic_ns(),
        }
    }
}

/// Now, on the events' clock.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
