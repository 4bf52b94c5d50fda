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
