//! NVIDIA kernel-driver activity of traced processes, on any kernel: the syscall
//! tracepoints see ioctls and mmaps of `/dev/nvidia*` files (fds are learnt from openat),
//! `nvidia:nvidia_dev_xid` reports Xid errors, and where the kernel has kprobes a generic
//! kprobe/kretprobe pair times named driver functions.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes, bpf_probe_read_user_str_bytes, generated,
    },
    macros::{kprobe, kretprobe, map, tracepoint},
    maps::HashMap,
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use tracer_common::{
    DEVICE_PREFIX_LEN, DriverEvent, EventHeader, IOCTL_PARAMS_LEN, SyscallFrame, counter,
    device_kind, driver_event, kind,
};

use crate::maps::{EVENTS, bump, current_ids, is_traced, load_const};

/// NVIDIA device fds of traced processes: key `tgid << 32 | fd`, value `index << 32 | kind`.
#[map]
static NV_FDS: HashMap<u64, u64> = HashMap::with_max_entries(16384, 0);

/// openat's file name pointer, from entry to exit, per thread.
#[map]
static PENDING_OPEN: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// The ioctl or mmap in flight, per thread.
#[map]
static SYSCALLS: HashMap<u32, SyscallFrame> = HashMap::with_max_entries(4096, 0);

/// Kernel functions in flight, keyed by `[tid, function address]`.
#[map]
static KFUNCS: HashMap<[u64; 2], SyscallFrame> = HashMap::with_max_entries(4096, 0);

/// Kernel functions reported whichever process runs them (interrupt handlers), by address.
#[map]
static KFUNC_ANY_PROCESS: HashMap<u64, u32> = HashMap::with_max_entries(64, 0);

/// Device files are those whose path starts with this (tests point it elsewhere).
#[unsafe(no_mangle)]
static DEVICE_PREFIX: [u8; DEVICE_PREFIX_LEN] = device_prefix_default();
#[unsafe(no_mangle)]
static DEVICE_PREFIX_USED: u32 = 11;

const fn device_prefix_default() -> [u8; DEVICE_PREFIX_LEN] {
    let mut prefix = [0u8; DEVICE_PREFIX_LEN];
    let text = b"/dev/nvidia";
    let mut i = 0;
    while i < text.len() {
        prefix[i] = text[i];
        i += 1;
    }
    prefix
}

/// Bytes of a path read at openat: the prefix and what follows it (a power of two, so an
/// index can be masked into range for the verifier).
const NAME_LEN: usize = 2 * DEVICE_PREFIX_LEN;
/// Field offsets of `nvidia:nvidia_dev_xid` (0 where absent).
#[unsafe(no_mangle)]
static XID_DEV_OFF: u32 = 0;
#[unsafe(no_mangle)]
static XID_CODE_OFF: u32 = 0;
#[unsafe(no_mangle)]
static XID_MSG_OFF: u32 = 0;

/// Syscall tracepoint layout: arguments from offset 16, 8 bytes each; `ret` at 16 on exit.
const ARG0: usize = 16;
const RET: usize = 16;
const IOC_TYPE_NVIDIA: u64 = b'F' as u64;

#[inline(always)]
fn current() -> (u64, u32, u32) {
    // A thread outside the loader's pid namespace is (0, 0): never traced.
    let (tgid, tid) = current_ids().unwrap_or((0, 0));
    ((u64::from(tgid) << 32) | u64::from(tid), tgid, tid)
}

#[inline(always)]
fn arg(ctx: &TracePointContext, index: usize) -> u64 {
    unsafe { ctx.read_at::<u64>(ARG0 + 8 * index) }.unwrap_or(0)
}

#[tracepoint]
pub fn sys_enter_openat(ctx: TracePointContext) -> u32 {
    let (_, tgid, tid) = current();
    if is_traced(tgid) {
        if PENDING_OPEN.insert(&tid, &arg(&ctx, 1), 0).is_err() {
            bump(counter::OPENS_FULL);
        }
    }
    0
}

#[tracepoint]
pub fn sys_exit_openat(ctx: TracePointContext) -> u32 {
    let _ = try_exit_openat(&ctx);
    0
}

// Inlined: code left in .text would be relinked into every program that uprobe_multi
// loads by hand, with relocations against maps it does not use.
#[inline(always)]
fn try_exit_openat(ctx: &TracePointContext) -> Option<()> {
    let (_, tgid, tid) = current();
    let filename = *unsafe { PENDING_OPEN.get(&tid) }?;
    let _ = PENDING_OPEN.remove(&tid);
    let fd: i64 = unsafe { ctx.read_at(RET) }.ok()?;
    if fd < 0 {
        return None;
    }
    // The kernel has just read the name, so its page is resident.
    let mut name = [0u8; NAME_LEN];
    let len = unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, &mut name) }
        .ok()?
        .len();
    let prefix_len = load_const(&DEVICE_PREFIX_USED) as usize;
    if prefix_len == 0 || prefix_len >= DEVICE_PREFIX_LEN || len < prefix_len {
        return None;
    }
    for i in 0..DEVICE_PREFIX_LEN {
        if i >= prefix_len {
            break;
        }
        let want = unsafe { core::ptr::read_volatile(&DEVICE_PREFIX[i]) };
        if name[i] != want {
            return None;
        }
    }
    let (device, index) = classify(&name, prefix_len);
    let key = (u64::from(tgid) << 32) | (fd as u64 & 0xffff_ffff);
    if NV_FDS
        .insert(&key, &((u64::from(index) << 32) | u64::from(device)), 0)
        .is_err()
    {
        bump(counter::FDS_FULL);
    }
    Some(())
}

/// `ctl` → nvidiactl, `-uvm...` → UVM, digits → GPU N, anything else → other.
#[inline(always)]
fn classify(name: &[u8; NAME_LEN], prefix_len: usize) -> (u32, u32) {
    let at = |i: usize| name.get(i & (NAME_LEN - 1)).copied().unwrap_or(0);
    let first = at(prefix_len);
    if first == b'c' && at(prefix_len + 1) == b't' && at(prefix_len + 2) == b'l' {
        return (device_kind::CTL, 0);
    }
    if first == b'-' && at(prefix_len + 1) == b'u' {
        return (device_kind::UVM, 0);
    }
    if first.is_ascii_digit() {
        let mut index = u32::from(first - b'0');
        let second = at(prefix_len + 1);
        if second.is_ascii_digit() {
            index = index * 10 + u32::from(second - b'0');
        }
        return (device_kind::GPU, index);
    }
    (device_kind::OTHER, 0)
}

#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    let (_, tgid, _) = current();
    if is_traced(tgid) {
        let key = (u64::from(tgid) << 32) | (arg(&ctx, 0) & 0xffff_ffff);
        let _ = NV_FDS.remove(&key);
    }
    0
}

/// The NVIDIA fd record of `fd` in the current process, if it is one.
#[inline(always)]
fn nvidia_fd(tgid: u32, fd: u64) -> Option<(u32, u32)> {
    if !is_traced(tgid) {
        return None;
    }
    let key = (u64::from(tgid) << 32) | (fd & 0xffff_ffff);
    let value = *unsafe { NV_FDS.get(&key) }?;
    Some((value as u32, (value >> 32) as u32))
}

#[tracepoint]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    let (_, tgid, tid) = current();
    let fd = arg(&ctx, 0);
    if let Some((device, index)) = nvidia_fd(tgid, fd) {
        let frame = SyscallFrame {
            ts_ns: unsafe { bpf_ktime_get_ns() },
            what: driver_event::IOCTL,
            device,
            device_index: index,
            fd: fd as i32,
            a: arg(&ctx, 1),
            b: arg(&ctx, 2),
            c: 0,
            d: 0,
        };
        if SYSCALLS.insert(&tid, &frame, 0).is_err() {
            bump(counter::SYSCALLS_FULL);
        }
    }
    0
}

#[tracepoint]
pub fn sys_enter_mmap(ctx: TracePointContext) -> u32 {
    let (_, tgid, tid) = current();
    let fd = arg(&ctx, 4);
    if let Some((device, index)) = nvidia_fd(tgid, fd) {
        let frame = SyscallFrame {
            ts_ns: unsafe { bpf_ktime_get_ns() },
            what: driver_event::MMAP,
            device,
            device_index: index,
            fd: fd as i32,
            a: arg(&ctx, 1),
            b: arg(&ctx, 5),
            c: arg(&ctx, 2),
            d: arg(&ctx, 3),
        };
        if SYSCALLS.insert(&tid, &frame, 0).is_err() {
            bump(counter::SYSCALLS_FULL);
        }
    }
    0
}

#[tracepoint]
pub fn sys_exit_ioctl(ctx: TracePointContext) -> u32 {
    let _ = try_sys_exit(&ctx, driver_event::IOCTL);
    0
}

#[tracepoint]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    let _ = try_sys_exit(&ctx, driver_event::MMAP);
    0
}

// Inlined: code left in .text would be relinked into every program that uprobe_multi
// loads by hand, with relocations against maps it does not use.
#[inline(always)]
fn try_sys_exit(ctx: &TracePointContext, what: u32) -> Option<()> {
    let now = unsafe { bpf_ktime_get_ns() };
    let (pid_tgid, _, tid) = current();
    let frame = *unsafe { SYSCALLS.get(&tid) }?;
    let _ = SYSCALLS.remove(&tid);
    if frame.what != what {
        return None;
    }
    let ret: i64 = unsafe { ctx.read_at(RET) }.unwrap_or(0);
    emit(pid_tgid, &frame, now, ret, |params| {
        // RM parameter blocks of 'F' ioctls: the kernel copied them, so they are resident.
        if what == driver_event::IOCTL && (frame.a >> 8) & 0xff == IOC_TYPE_NVIDIA {
            unsafe {
                generated::bpf_probe_read_user(
                    params.as_mut_ptr().cast(),
                    IOCTL_PARAMS_LEN as u32,
                    frame.b as *const core::ffi::c_void,
                )
            };
        }
    });
    Some(())
}

#[inline(always)]
fn emit(
    pid_tgid: u64,
    frame: &SyscallFrame,
    now: u64,
    ret: i64,
    fill_params: impl FnOnce(&mut [u8; IOCTL_PARAMS_LEN]),
) {
    let Some(mut entry) = EVENTS.reserve::<DriverEvent>(0) else {
        bump(counter::DRIVER_RING_FULL);
        return;
    };
    let out = entry.as_mut_ptr();
    unsafe {
        (*out).header = EventHeader {
            kind: kind::DRIVER,
            flags: 0,
            ts_ns: frame.ts_ns,
            pid: (pid_tgid >> 32) as u32,
            tid: pid_tgid as u32,
        };
        (*out).what = frame.what;
        (*out).device = frame.device;
        (*out).device_index = frame.device_index;
        (*out).fd = frame.fd;
        (*out).dur_ns = now.saturating_sub(frame.ts_ns);
        (*out).ret = ret;
        (*out).a = frame.a;
        (*out).b = frame.b;
        (*out).c = frame.c;
        (*out).d = frame.d;
        (*out).params = [0; IOCTL_PARAMS_LEN];
        fill_params(&mut (*out).params);
    }
    entry.submit(0);
}

#[tracepoint]
pub fn nvidia_dev_xid(ctx: TracePointContext) -> u32 {
    let _ = try_xid(&ctx);
    0
}

// Inlined: code left in .text would be relinked into every program that uprobe_multi
// loads by hand, with relocations against maps it does not use.
#[inline(always)]
fn try_xid(ctx: &TracePointContext) -> Option<()> {
    // Xids are rare and machine-wide news: reported whichever process is running.
    let (pid_tgid, _, _) = current();
    let code_off = load_const(&XID_CODE_OFF);
    if code_off == 0 {
        return None;
    }
    let frame = SyscallFrame {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        what: driver_event::XID,
        a: u64::from(unsafe { ctx.read_at::<u32>(code_off as usize) }.ok()?),
        b: u64::from(unsafe { ctx.read_at::<u32>(load_const(&XID_DEV_OFF) as usize) }.unwrap_or(0)),
        ..SyscallFrame::default()
    };
    let msg_off = load_const(&XID_MSG_OFF);
    emit(pid_tgid, &frame, frame.ts_ns, 0, |params| {
        if msg_off != 0 {
            if let Ok(loc) = unsafe { ctx.read_at::<u32>(msg_off as usize) } {
                let text = unsafe { (ctx.as_ptr() as *const u8).add((loc & 0xffff) as usize) };
                let _ = unsafe { bpf_probe_read_kernel_str_bytes(text, params) };
            }
        }
    });
    Some(())
}

#[kprobe]
pub fn kfunc_enter(ctx: ProbeContext) -> u32 {
    let (_, tgid, tid) = current();
    let ip = unsafe { generated::bpf_get_func_ip(ctx.as_ptr()) };
    if !is_traced(tgid) && unsafe { KFUNC_ANY_PROCESS.get(&ip) }.is_none() {
        return 0;
    }
    let frame = SyscallFrame {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        what: driver_event::KFUNC,
        a: ip,
        b: ctx.arg(0).unwrap_or(0),
        c: ctx.arg(1).unwrap_or(0),
        d: ctx.arg(2).unwrap_or(0),
        ..SyscallFrame::default()
    };
    if KFUNCS.insert(&[u64::from(tid), ip], &frame, 0).is_err() {
        bump(counter::KFUNCS_FULL);
    }
    0
}

#[kretprobe]
pub fn kfunc_return(ctx: RetProbeContext) -> u32 {
    let now = unsafe { bpf_ktime_get_ns() };
    let (pid_tgid, _, tid) = current();
    let ip = unsafe { generated::bpf_get_func_ip(ctx.as_ptr()) };
    let key = [u64::from(tid), ip];
    let Some(frame) = (unsafe { KFUNCS.get(&key) }).copied() else {
        return 0;
    };
    let _ = KFUNCS.remove(&key);
    let ret: i64 = ctx.ret();
    emit(pid_tgid, &frame, now, ret, |_| {});
    0
}
