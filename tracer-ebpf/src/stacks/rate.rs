//! `--stack-rate HZ`: at most HZ stacked calls a second per thread, for programs whose call
//! rate is not known beforehand (a server). Each thread has a token bucket
//! ([`RateBucket`]: HZ calls, refilled at HZ a second, full for a new thread); a call
//! without a token has no stack, counted as `rate_limited`.

use aya_ebpf::{macros::map, maps::LruHashMap};
use tracer_common::stacks::RateBucket;

/// The rate (`--stack-rate`); 0: no limit.
#[unsafe(no_mangle)]
static STACK_RATE: u32 = 0;

/// Each thread's bucket, by tid. An evicted thread's comes back full.
#[map]
static STACK_RATES: LruHashMap<u32, RateBucket> = LruHashMap::with_max_entries(16384, 0);

/// Whether thread `tid`'s call at `now_ns` may walk its stack (it takes a token).
#[inline(always)]
pub fn admitted(tid: u32, now_ns: u64) -> bool {
    let rate = crate::maps::load_const(&STACK_RATE);
    if rate == 0 {
        return true;
    }
    if let Some(bucket) = STACK_RATES.get_ptr_mut(&tid) {
        // SAFETY: this thread's map value; only this thread's calls take from it.
        return unsafe { (*bucket).take(rate, now_ns) };
    }
    let mut bucket = RateBucket::full(rate, now_ns);
    let admitted = bucket.take(rate, now_ns);
    // A bucket that cannot be kept (the map full of pinned entries): this call walks,
    // the next tries again.
    let _ = STACK_RATES.insert(&tid, &bucket, 0);
    admitted
}

/// Thread `tid` exited: a new thread with its tid gets a full bucket.
#[inline(always)]
pub fn forget(tid: u32) {
    let _ = STACK_RATES.remove(&tid);
}
