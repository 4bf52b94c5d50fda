//! The clocks: CLOCK_MONOTONIC is the trace's.

/// CLOCK_MONOTONIC in ns: the trace's clock.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(clock, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// The clock CUPTI's timestamp callback gives: CLOCK_MONOTONIC, the trace's clock;
/// CLOCK_REALTIME while another client holds the activity API (CUPTI's own clock, which
/// that client expects unless it registered a callback of its own).
pub fn timestamp_ns(held_by_other: bool) -> u64 {
    if held_by_other {
        clock_ns(libc::CLOCK_REALTIME)
    } else {
        monotonic_ns()
    }
}
