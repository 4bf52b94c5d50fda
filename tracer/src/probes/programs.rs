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

/// Attaches library discovery and the child stops: the exits of `open`, `openat` and
/// `openat2` (libraries opened by traced processes) and of `clone`, `clone3`, `fork` and
/// `vfork` in the child (its own probes before it runs). An open for writing is let be. `openat` and `clone` are needed;
/// the others are attached where the kernel has them. Where the kernel lacks attach
/// cookies, `mmap` and `close` too (the probes are told apart by address).
pub fn attach_discovery(bpf: &mut Ebpf, tracefs: &std::path::Path) -> Result<()> {
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
    Ok(())
}
