//! Decoding a process event (fork, exec, exit of a traced process) into a
//! [`ProcessLine`].

use tracer_common::{ProcEvent, proc_event};

use super::raw::c_string;
use crate::schema::{ProcessEvent, ProcessLine};

pub fn decode(event: &ProcEvent) -> ProcessLine {
    let text = c_string(&event.name);
    let (what, child_pid, comm, filename) = match event.what {
        proc_event::FORK => (ProcessEvent::Fork, Some(event.child_pid), Some(text), None),
        proc_event::EXEC => (ProcessEvent::Exec, None, None, Some(text)),
        _ => (ProcessEvent::Exit, None, Some(text), None),
    };
    ProcessLine {
        event: what,
        pid: event.header.pid,
        tid: event.header.tid,
        ts_ns: event.header.ts_ns,
        child_pid,
        comm,
        filename,
        ..ProcessLine::default()
    }
}
