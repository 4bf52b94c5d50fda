//! Process-tree tracking: a traced process's new child processes become traced, and
//! forks, execs and exits of traced processes are reported.

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::tracepoint,
    programs::TracePointContext,
};
use tracer_common::{EventHeader, ProcEvent, counter, kind, proc_event};

use crate::maps::{
    EVENTS, FRAMES, TRACED, bump, exec_filename_off, exit_group_dead_off, newtask_flags_off,
    newtask_pid_off, trace_all,
};

const CLONE_THREAD: u64 = 0x0001_0000;

#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    let _ = try_task_newtask(&ctx);
    0
}

#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let _ = try_sched_process_exec(&ctx);
    0
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let _ = try_sched_process_exit(&ctx);
    0
}

fn try_task_newtask(ctx: &TracePointContext) -> Option<()> {
    if trace_all() {
        return None;
    }
    // The tracepoint runs in the parent: its tgid decides, whichever thread forks.
    let pid_tgid = bpf_get_current_pid_tgid();
    let parent = (pid_tgid >> 32) as u32;
    unsafe { TRACED.get(&parent) }?;
    let clone_flags: u64 = unsafe { ctx.read_at(newtask_flags_off() as usize) }.ok()?;
    if clone_flags & CLONE_THREAD != 0 {
        return None;
    }
    let child: i32 = unsafe { ctx.read_at(newtask_pid_off() as usize) }.ok()?;
    if TRACED.insert(&(child as u32), &1, 0).is_err() {
        // The child goes untraced: say so rather than drop it silently.
        bump(counter::TRACED_FULL);
    }
    emit(pid_tgid, proc_event::FORK, child as u32, |name| {
        if let Ok(comm) = bpf_get_current_comm() {
            name[..16].copy_from_slice(&comm);
        }
    });
    Some(())
}

fn try_sched_process_exec(ctx: &TracePointContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !trace_all() {
        unsafe { TRACED.get(&((pid_tgid >> 32) as u32)) }?;
    }
    let loc: u32 = unsafe { ctx.read_at(exec_filename_off() as usize) }.ok()?;
    let offset = (loc & 0xffff) as usize;
    let filename = unsafe { (ctx.as_ptr() as *const u8).add(offset) };
    emit(pid_tgid, proc_event::EXEC, 0, |name| {
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(filename, name) };
    });
    Some(())
}

fn try_sched_process_exit(ctx: &TracePointContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if !trace_all() {
        unsafe { TRACED.get(&tgid) }?;
    }
    // A thread that dies mid-call never returns: drop its pending frames.
    let _ = FRAMES.remove(&tid);
    let group_dead = match exit_group_dead_off() {
        0 => tid == tgid,
        off => unsafe { ctx.read_at::<u8>(off as usize) }.ok()? != 0,
    };
    if !group_dead {
        return None;
    }
    if !trace_all() {
        let _ = TRACED.remove(&tgid);
    }
    emit(pid_tgid, proc_event::EXIT, 0, |name| {
        if let Ok(comm) = bpf_get_current_comm() {
            name[..16].copy_from_slice(&comm);
        }
    });
    Some(())
}

#[inline(always)]
fn emit(pid_tgid: u64, what: u32, child_pid: u32, fill_name: impl FnOnce(&mut [u8; 64])) {
    let Some(mut entry) = EVENTS.reserve::<ProcEvent>(0) else {
        bump(counter::PROC_RING_FULL);
        return;
    };
    let out = entry.as_mut_ptr();
    unsafe {
        (*out).header = EventHeader {
            kind: kind::PROC,
            flags: 0,
            ts_ns: bpf_ktime_get_ns(),
            pid: (pid_tgid >> 32) as u32,
            tid: pid_tgid as u32,
        };
        (*out).what = what;
        (*out).child_pid = child_pid;
        (*out).name = [0; 64];
        fill_name(&mut (*out).name);
    }
    entry.submit(0);
}
