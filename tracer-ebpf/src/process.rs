//! Process-tree tracking: a traced process's new child processes become traced, and
//! forks, execs and exits of traced processes are reported.
//!
//! Pids are the loader's (its pid namespace). A child is named by the kernel's own pid in
//! `task_newtask`, which runs in the parent; where the two differ, the child registers
//! itself on its return from `clone` (`child_exit_clone`), before its first user
//! instruction. A child that needs probes of its own is stopped there by the attach layer's
//! stops (`discovery.rs`).

use aya_ebpf::{
    EbpfContext,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use tracer_common::{
    EventHeader, PROC_NAME_LEN, PendingChild, ProcEvent, counter, kind, proc_event,
};

use crate::{
    discovery::{LINKED, process_exited, report_forked, report_new_leader},
    maps::{
        EVENTS, FRAMES, TRACED, bump, current_ids, exec_filename_off, exec_old_pid_off,
        exec_pid_off, exit_group_dead_off, in_pid_namespace, is_traced, kernel_tid,
        newtask_flags_off, newtask_pid_off, trace_all,
    },
};

/// Children of traced processes between `task_newtask` and their own return from `clone`,
/// by kernel thread id.
#[map]
static PENDING_CHILD: HashMap<u32, PendingChild> = HashMap::with_max_entries(4096, 0);

const CLONE_VFORK: u64 = 0x0000_4000;
const CLONE_THREAD: u64 = 0x0001_0000;
/// Syscall exit tracepoint layout: `ret` at 16.
const RET: usize = 16;

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
    // The tracepoint runs in the parent: its tgid decides, whichever thread forks.
    let (parent, parent_tid) = current_ids()?;
    if trace_all() {
        if !in_pid_namespace() {
            inherit_python(ctx, parent);
        }
        return None;
    }
    unsafe { TRACED.get(&parent) }?;
    let clone_flags: u64 = unsafe { ctx.read_at(newtask_flags_off() as usize) }.ok()?;
    if clone_flags & CLONE_THREAD != 0 {
        return None;
    }
    // The kernel's pid of the child.
    let child: i32 = unsafe { ctx.read_at(newtask_pid_off() as usize) }.ok()?;
    if !in_pid_namespace() {
        crate::stacks::inherit(parent, child as u32);
        crate::identity::inherit(parent, child as u32);
    }
    // A vfork child only runs until its exec (its calls before it are not traced); any
    // other child inherits the parent's breakpoints and needs its own probes first.
    let stop = clone_flags & CLONE_VFORK == 0 && unsafe { LINKED.get(&parent) }.is_some();
    let mut pending = PendingChild {
        parent_pid: parent,
        parent_tid,
        ts_ns: unsafe { bpf_ktime_get_ns() },
        register: u32::from(in_pid_namespace()),
        stop: u32::from(stop),
        comm: [0; 16],
    };
    if let Ok(comm) = bpf_get_current_comm() {
        pending.comm = comm;
    }
    if pending.register == 0 {
        if TRACED.insert(&(child as u32), &1, 0).is_err() {
            // The child goes untraced: say so rather than drop it silently, and give it no
            // probes of its own (per-process links skip the traced-process lookup).
            bump(counter::TRACED_FULL);
            pending.stop = 0;
        }
        emit_fork(&pending, child as u32);
    }
    if (pending.register != 0 || pending.stop != 0)
        && PENDING_CHILD.insert(&(child as u32), &pending, 0).is_err()
    {
        // The child would go untraced (not registered) or without its own probes.
        bump(counter::TRACED_FULL);
    }
    Some(())
}

/// A traced process's child returning from `clone` (or `clone3`, `fork`, `vfork`) in its
/// own context, before its first user instruction (x86-64: `ret_from_fork` ends through the
/// syscall exit path).
#[tracepoint]
pub fn child_exit_clone(ctx: TracePointContext) -> u32 {
    let ret: i64 = match unsafe { ctx.read_at(RET) } {
        Ok(ret) => ret,
        Err(_) => return 0,
    };
    if ret == 0 {
        let _ = child_first_seen();
    }
    0
}

/// The same child on its first return to user space where that return passes no syscall
/// exit (arm64: `ret_from_fork` goes to `ret_to_user`): the kernel marks a new task's
/// restartable sequence for update when it first wakes it, so a child whose parent
/// registered one (glibc 2.35 and later do, for every thread) updates it before its first
/// user instruction. Fires for every task with a restartable sequence after a preemption or
/// a migration: one lookup that misses.
#[tracepoint]
pub fn child_rseq_update(_ctx: TracePointContext) -> u32 {
    let _ = child_first_seen();
    0
}

/// A child with a pending entry (`task_newtask`), in its own context for the first time:
/// registered in the loader's pid namespace where needed, and stopped for its own probes.
#[inline(always)]
fn child_first_seen() -> Option<()> {
    let key = kernel_tid();
    let pending = *unsafe { PENDING_CHILD.get(&key) }?;
    let _ = PENDING_CHILD.remove(&key);
    let (tgid, tid) = current_ids()?;
    if pending.register != 0 {
        // Only now can the child be named in the loader's pid namespace.
        let registered = TRACED.insert(&tgid, &1, 0).is_ok();
        crate::stacks::inherit(pending.parent_pid, tgid);
        crate::identity::inherit(pending.parent_pid, tgid);
        emit_fork(&pending, tgid);
        if !registered {
            // Untraced, and counted: no probes of its own (see `task_newtask`).
            bump(counter::TRACED_FULL);
            return None;
        }
    }
    if pending.stop != 0 {
        report_forked((tgid, tid), pending.parent_pid);
    }
    Some(())
}

/// `--all`: a new child process of `parent` has its interpreter (`--stacks`).
#[inline(always)]
fn inherit_python(ctx: &TracePointContext, parent: u32) {
    let Ok(clone_flags) = (unsafe { ctx.read_at::<u64>(newtask_flags_off() as usize) }) else {
        return;
    };
    if clone_flags & CLONE_THREAD != 0 {
        return;
    }
    if let Ok(child) = unsafe { ctx.read_at::<i32>(newtask_pid_off() as usize) } {
        crate::stacks::inherit(parent, child as u32);
        crate::identity::inherit(parent, child as u32);
    }
}

/// Reports a traced process's new child.
#[inline(always)]
fn emit_fork(pending: &PendingChild, child: u32) {
    let comm = pending.comm;
    emit(
        (pending.parent_pid, pending.parent_tid),
        pending.ts_ns,
        proc_event::FORK,
        child,
        |name| name[..16].copy_from_slice(&comm),
    );
}

fn try_sched_process_exec(ctx: &TracePointContext) -> Option<()> {
    // A child not seen yet (a `vfork` child on arm64: it shares its parent's memory, so no
    // restartable sequence of its own) is registered before its exec is reported.
    let _ = child_first_seen();
    let ids = current_ids()?;
    // Under --all too, nothing once tracing has stopped.
    if !is_traced(ids.0) {
        return None;
    }
    let loc: u32 = unsafe { ctx.read_at(exec_filename_off() as usize) }.ok()?;
    let offset = (loc & 0xffff) as usize;
    let filename = unsafe { (ctx.as_ptr() as *const u8).add(offset) };
    emit(
        ids,
        unsafe { bpf_ktime_get_ns() },
        proc_event::EXEC,
        0,
        |name| {
            let _ = unsafe { bpf_probe_read_kernel_str_bytes(filename, name) };
        },
    );
    // Nor does it run the interpreter of the old one.
    crate::stacks::forget(ids.0);
    crate::identity::forget(ids.0);
    // The new image maps nothing yet: its forks need no stop until it maps a library.
    if unsafe { LINKED.get(&ids.0) }.is_some() {
        let _ = LINKED.remove(&ids.0);
        let old_pid_off = exec_old_pid_off();
        if old_pid_off != 0 {
            let pid: i32 = unsafe { ctx.read_at(exec_pid_off() as usize) }.ok()?;
            let old_pid: i32 = unsafe { ctx.read_at(old_pid_off as usize) }.ok()?;
            if pid != old_pid {
                // A thread other than the leader exec'd and became the leader: probes
                // made for the old leader no longer apply.
                report_new_leader(ids);
            }
        }
    }
    Some(())
}

fn try_sched_process_exit(ctx: &TracePointContext) -> Option<()> {
    // A child that ran and ends without having been seen in its own context got neither
    // its registration nor its stop: its calls may be missing, and that is counted. A
    // pending child is a process's first thread: other threads' exits skip the map.
    let kernel_ids = bpf_get_current_pid_tgid();
    if kernel_ids as u32 == (kernel_ids >> 32) as u32
        && PENDING_CHILD.remove(&(kernel_ids as u32)).is_ok()
    {
        bump(counter::CHILD_UNSEEN);
    }
    let (tgid, tid) = current_ids()?;
    if !is_traced(tgid) {
        return None;
    }
    // A thread that dies mid-call never returns: drop its pending frames.
    let _ = FRAMES.remove(&tid);
    crate::stacks::thread_exited(tid);
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
    process_exited(tgid);
    crate::stacks::forget(tgid);
    crate::identity::forget(tgid);
    emit(
        (tgid, tid),
        unsafe { bpf_ktime_get_ns() },
        proc_event::EXIT,
        0,
        |name| {
            if let Ok(comm) = bpf_get_current_comm() {
                name[..16].copy_from_slice(&comm);
            }
        },
    );
    Some(())
}

#[inline(always)]
fn emit(
    (pid, tid): (u32, u32),
    ts_ns: u64,
    what: u32,
    child_pid: u32,
    fill_name: impl FnOnce(&mut [u8; PROC_NAME_LEN]),
) {
    let Some(mut entry) = EVENTS.reserve::<ProcEvent>(0) else {
        bump(counter::PROC_RING_FULL);
        return;
    };
    let out = entry.as_mut_ptr();
    unsafe {
        (*out).header = EventHeader {
            kind: kind::PROC,
            flags: 0,
            ts_ns,
            pid,
            tid,
        };
        (*out).what = what;
        (*out).child_pid = child_pid;
        (*out).name = [0; PROC_NAME_LEN];
        fill_name(&mut (*out).name);
    }
    entry.submit(0);
}
