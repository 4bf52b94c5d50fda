//! The eBPF object's programs by name, and attaching tracepoint programs (each named after
//! its event), including the process-tree ones every `run` uses.

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    programs::{Program, ProgramError, TracePoint},
};

/// The program `name` of the object, as its type.
pub fn program<'a, P>(bpf: &'a mut Ebpf, name: &str) -> Result<&'a mut P>
where
    &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    let program = bpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing"))?;
    Ok(program.try_into()?)
}

/// Loads and attaches tracepoint programs; each program is named after its event.
pub fn attach_tracepoints(bpf: &mut Ebpf, events: &[(&str, &str)]) -> Result<()> {
    for (category, event) in events {
        let program: &mut TracePoint = program(bpf, event)?;
        program.load().with_context(|| format!("loading {event}"))?;
        program
            .attach(category, event)
            .with_context(|| format!("attaching tracepoint {category}:{event}"))?;
    }
    Ok(())
}

/// Attaches the process-tree tracepoints: a traced process's children are traced too.
pub fn attach_process_tracking(bpf: &mut Ebpf) -> Result<()> {
    attach_tracepoints(
        bpf,
        &[
            ("task", "task_newtask"),
            ("sched", "sched_process_exec"),
            ("sched", "sched_process_exit"),
        ],
    )
}

/// How a traced process's fork child is caught in its own context before its first user
/// instruction (to be stopped for its own probes, or named in cudatrace's pid namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildHook {
    /// Its `clone` (`clone3`, `fork`, `vfork`) returning 0: x86-64.
    SyscallExit,
    /// Its first `rseq:rseq_update`: arm64, whose `ret_from_fork` passes no syscall exit
    /// ([`tracer_common::arch::Arch::fork_child_passes_syscall_exit`]).
    Rseq,
    /// Not caught: each child that needed it is counted when it ends (`child_unseen`).
    None,
}

/// Picks another child hook than the architecture's, for tests on one machine:
/// `syscall_exit`, `rseq` or `none`.
pub const CHILD_HOOK_ENV: &str = "CUDATRACE_CHILD_HOOK";

impl ChildHook {
    /// The architecture's hook, or the one [`CHILD_HOOK_ENV`] names.
    pub fn chosen() -> Result<ChildHook> {
        match std::env::var(CHILD_HOOK_ENV).ok().as_deref() {
            None | Some("") => Ok(
                if tracer_common::arch::TARGET.fork_child_passes_syscall_exit {
                    ChildHook::SyscallExit
                } else {
                    ChildHook::Rseq
                },
            ),
            Some("syscall_exit") => Ok(ChildHook::SyscallExit),
            Some("rseq") => Ok(ChildHook::Rseq),
            Some("none") => Ok(ChildHook::None),
            Some(other) => {
                anyhow::bail!("{CHILD_HOOK_ENV}={other}: expected syscall_exit, rseq or none")
            }
        }
    }

    /// The tracepoint (`group/event`) this hook attaches to, if any.
    pub fn event(self) -> Option<&'static str> {
        match self {
            ChildHook::SyscallExit => Some("syscalls/sys_exit_clone"),
            ChildHook::Rseq => Some("rseq/rseq_update"),
            ChildHook::None => None,
        }
    }

    /// Whether this kernel has the hook's tracepoint (under `tracefs`).
    pub fn available(self, tracefs: &std::path::Path) -> bool {
        self.event()
            .is_some_and(|event| tracefs.join("events").join(event).is_dir())
    }
}

/// Attaches library discovery and the child stops: the exits of `open`, `openat` and
/// `openat2` (libraries opened by traced processes) and the child's hook ([`ChildHook`]:
/// the exits of `clone`, `clone3`, `fork` and `vfork` in the child, or its first
/// `rseq:rseq_update`), where a child gets its own probes before it runs. An open for
/// writing is let be. `openat` and `clone` are needed; the others are attached where the
/// kernel has them. Where the kernel lacks attach cookies, `mmap` and `close` too (the
/// probes are told apart by address).
pub fn attach_discovery(bpf: &mut Ebpf, tracefs: &std::path::Path, quiet: bool) -> Result<()> {
    let hook = ChildHook::chosen()?;
    let exists = |event: &str| tracefs.join("events/syscalls").join(event).is_dir();
    for (program_name, events) in [
        ("lib_enter_openat", &["sys_enter_openat"][..]),
        ("lib_enter_openat2", &["sys_enter_openat2"][..]),
        ("lib_enter_open", &["sys_enter_open"][..]),
        (
            "lib_exit_open",
            &["sys_exit_openat", "sys_exit_open", "sys_exit_openat2"][..],
        ),
        (
            "child_exit_clone",
            &[
                "sys_exit_clone",
                "sys_exit_clone3",
                "sys_exit_fork",
                "sys_exit_vfork",
            ][..],
        ),
        // Kernels without attach cookies: where planned libraries are mapped.
        ("map_enter_mmap", &["sys_enter_mmap"][..]),
        ("map_exit_mmap", &["sys_exit_mmap"][..]),
        ("map_enter_close", &["sys_enter_close"][..]),
    ] {
        if program_name.starts_with("map_") && !super::helpers::cookies_missing() {
            continue;
        }
        if program_name == "child_exit_clone" && hook != ChildHook::SyscallExit {
            continue;
        }
        let program: &mut TracePoint = program(bpf, program_name)?;
        program
            .load()
            .with_context(|| format!("loading {program_name}"))?;
        for event in events {
            let needed = matches!(
                *event,
                "sys_enter_openat"
                    | "sys_exit_openat"
                    | "sys_exit_clone"
                    | "sys_enter_mmap"
                    | "sys_exit_mmap"
                    | "sys_enter_close"
            );
            if !needed && !exists(event) {
                continue;
            }
            program
                .attach("syscalls", event)
                .with_context(|| format!("attaching tracepoint syscalls:{event}"))?;
        }
    }
    match hook {
        ChildHook::Rseq => attach_child_rseq(bpf, tracefs, quiet),
        ChildHook::SyscallExit | ChildHook::None => Ok(()),
    }
}

/// [`ChildHook::Rseq`]: the child is caught on its first `rseq:rseq_update`. Without that
/// event (a kernel built without `CONFIG_RSEQ`)
/// such children are not stopped for their own probes: said once, and each one that ends
/// so is counted (`child_unseen`).
fn attach_child_rseq(bpf: &mut Ebpf, tracefs: &std::path::Path, quiet: bool) -> Result<()> {
    if !ChildHook::Rseq.available(tracefs) {
        if !quiet {
            eprintln!(
                "cudatrace: WARNING: this kernel has no rseq:rseq_update tracepoint: on {} a \
                 fork child is caught there before it runs, so children that call the driver \
                 without an exec may miss calls (counted as lost child_unseen)",
                tracer_common::arch::TARGET.name
            );
        }
        return Ok(());
    }
    let program: &mut TracePoint = program(bpf, "child_rseq_update")?;
    program.load().context("loading child_rseq_update")?;
    program
        .attach("rseq", "rseq_update")
        .context("attaching tracepoint rseq:rseq_update")?;
    Ok(())
}
