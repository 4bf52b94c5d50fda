//! Self-test programs: a uprobe and a uretprobe on a test function, emitting separate
//! entry and return events and one aya-log line per call. Used by the root tests and by
//! `cudatrace doctor` to prove that uprobes, the ring buffer and aya-log work here.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{fentry, kprobe, map, tracepoint, uprobe, uretprobe},
    maps::RingBuf,
    programs::{FEntryContext, ProbeContext, RetProbeContext, TracePointContext},
};
use aya_log_ebpf::info;
use tracer_common::{EventHeader, SelftestEvent, kind};

#[map]
static SELFTEST_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 16, 0);

#[uprobe]
pub fn selftest_enter(ctx: ProbeContext) -> u32 {
    let arg0: u64 = ctx.arg(0).unwrap_or(0);
    let arg1: u64 = ctx.arg(1).unwrap_or(0);
    info!(&ctx, "selftest entry arg0={} arg1={}", arg0, arg1);
    emit(kind::SELFTEST_ENTRY, arg0, arg1, 0);
    0
}

#[uretprobe]
pub fn selftest_return(ctx: RetProbeContext) -> u32 {
    let ret: u64 = ctx.ret();
    emit(kind::SELFTEST_RETURN, 0, 0, ret);
    0
}

#[inline(always)]
fn emit(event_kind: u32, arg0: u64, arg1: u64, ret: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let event = SelftestEvent {
        header: EventHeader {
            kind: event_kind,
            flags: 0,
            ts_ns: unsafe { bpf_ktime_get_ns() },
            pid: (pid_tgid >> 32) as u32,
            tid: pid_tgid as u32,
        },
        arg0,
        arg1,
        ret,
    };
    let _ = SELFTEST_EVENTS.output::<SelftestEvent>(&event, 0);
}

/// `cudatrace doctor` loads and attaches these empty programs to learn what the kernel
/// allows: each either loads and attaches or fails with the kernel's reason.
#[kprobe]
pub fn doctor_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

#[fentry(function = "do_sys_openat2")]
pub fn doctor_fentry(_ctx: FEntryContext) -> u32 {
    0
}

#[tracepoint]
pub fn doctor_tracepoint(_ctx: TracePointContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
