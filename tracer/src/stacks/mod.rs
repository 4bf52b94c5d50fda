//! `run --stacks`: each call of the chosen families with the Python stack it was made from,
//! read by the probes from CPython's own structures (`tracer-ebpf/src/stacks/`;
//! docs/python-stacks.md says how and why). Which calls get stacks is the probes' choice
//! (`probes::stack_selection`); this stage reads what the loaded object hands it.
//!
//! | file | |
//! |---|---|
//! | `interpreters.rs` | each process's interpreter: found, checked, given to the probes (`PYPROC`), said once |
//! | `elf.rs` | an interpreter file: `_PyRuntime`, `PyCode_Type`, its version, its debug offsets |
//! | `check.rs` | a layout checked against the process's own objects before the probes use it |
//! | `layout.rs` | where each version keeps what the probes read: one table, a row per field |
//! | `debug_offsets.rs` | CPython's own `_Py_DebugOffsets` (3.13+), laid over the table |
//! | `dwarf.rs` | an interpreter's DWARF (its file's or its debug file's): the structs' member offsets, preferred to the table |
//! | `btf.rs` | the kernel's `task_struct.thread.fsbase` offset, from its BTF |
//! | `resolve.rs` | stack and code records into `stack` lines and the calls' `stack` |
//! | `linetable.rs` | a code object's line table: the line of an instruction |
//! | `fault_in.rs` | a code object the probe could not read whole: its pages faulted in for the next call |
//! | `long_linetable.rs` | a line table over a code record's 16 KiB: read from the process, under the code object's identity |

mod btf;
mod check;
mod debug_offsets;
mod dwarf;
mod elf;
mod fault_in;
mod interpreters;
mod layout;
mod linetable;
mod long_linetable;
mod resolve;

use std::path::Path;

use aya::maps::{MapData, PerCpuArray};
use tracer_common::{
    AttachEvent, attach_event, flags,
    stacks::{CodeHead, RawPyFrame, StackEvent, code_flags, stack_counter, stack_status},
};

pub use btf::thread_pointer_offset;
use interpreters::{Found, Interpreters};
pub use resolve::Reason;
use resolve::Resolver;

use crate::{
    probes::{loaded::StackMaps, stack_programs::StackPrograms},
    schema::{CallLine, InterpreterLine, StackLine, StacksFooter},
};

/// Set (hidden, for diagnosis): each code record that cannot name a frame is printed on
/// stderr.
const DEBUG_ENV: &str = "CUDATRACE_STACKS_DEBUG";

/// Where the kernel's BTF is.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The stacks stage of `run`: interpreters looked at as processes stop, records turned into
/// lines, calls given their stacks.
pub struct Stacks {
    interpreters: Interpreters,
    resolver: Resolver,
    counters: PerCpuArray<MapData, u64>,
    /// Kept loaded while tracing runs.
    _programs: StackPrograms,
}

/// Lines the stacks stage has for the trace.
pub enum StackLines {
    Interpreter(InterpreterLine),
    Stack(StackLine),
}

impl Stacks {
    pub fn new(mut maps: StackMaps, quiet: bool) -> Self {
        Stacks {
            interpreters: Interpreters::new(
                maps.interpreters,
                maps.programs
                    .code_freed
                    .take()
                    .map(|program| (program, maps.known_codes)),
                quiet,
            ),
            resolver: Resolver::default(),
            counters: maps.counters,
            _programs: maps.programs,
        }
    }

    /// A process stopped for the attach layer (a library opened, a fork), before it goes
    /// on: its interpreter, if not looked at since its last exec.
    pub fn attach_event(&mut self, event: &AttachEvent) -> Option<InterpreterLine> {
        match event.what {
            attach_event::LIBRARY_OPENED | attach_event::FORKED => self
                .interpreters
                .look_at(event.header.pid, event.header.ts_ns),
            _ => None,
        }
    }

    /// A process traced from the start (`-p`, `--all`).
    pub fn look_at(&mut self, pid: u32, ts_ns: u64) -> Option<InterpreterLine> {
        self.interpreters.look_at(pid, ts_ns)
    }

    /// A process exec'd or exited: its interpreter is forgotten (the probes forgot it).
    pub fn forget(&mut self, pid: u32) {
        self.interpreters.forget(pid);
    }

    /// The stack record just given came in its call's own record.
    pub fn known_in_call(&mut self) {
        self.resolver.footer.stack_records.known_in_call += 1;
    }

    /// A stack record: lines to write before the call's (its process's interpreter line if
    /// it was not looked at yet, a new stack).
    pub fn stack(&mut self, event: &StackEvent, frames: &[RawPyFrame]) -> Vec<StackLines> {
        let mut lines = Vec::new();
        let pid = event.header.pid;
        if self.interpreters.found(pid).is_none()
            && let Some(line) = self.interpreters.look_at(pid, event.header.ts_ns)
        {
            // A process no stop showed (a fork child under --all): looked at now.
            lines.push(StackLines::Interpreter(line));
        }
        if event.status == stack_status::OK
            && let Some(line) = self.interpreters.recheck(pid, event.header.ts_ns)
        {
            // Its check had no frame to read at first; its layout fails now.
            lines.push(StackLines::Interpreter(line));
        }
        if event.status == stack_status::OK {
            self.interpreters.first_stack(pid);
        }
        let (no_interpreter, refused) = match self.interpreters.found(pid) {
            Some(Found::Unsupported) => (Reason::UnsupportedPython, true),
            _ => (Reason::NotPython, false),
        };
        // Walked with a layout refused since: no frame of it is used.
        let event = &StackEvent {
            status: if refused {
                stack_status::NO_INTERPRETER
            } else {
                event.status
            },
            ..*event
        };
        if let Some(line) = self.resolver.stack(event, frames, no_interpreter) {
            lines.push(StackLines::Stack(line));
        }
        lines
    }

    /// A code record.
    pub fn code(&mut self, head: &CodeHead, data: &[u8]) {
        if head.flags != 0 && std::env::var_os(DEBUG_ENV).is_some() {
            // For diagnosis: which code object could not name a frame, and why.
            eprintln!(
                "cudatrace: --stacks: pid {} code object {:#x}: flags {:#x}, objects {:x?}",
                head.header.pid, head.code, head.flags, head.objects
            );
        }
        if head.flags & code_flags::READ_FAULT != 0 {
            fault_in::fault_in(head);
        }
        let long_table = (head.flags == code_flags::LINETABLE_TOO_LONG)
            .then(|| self.interpreters.layout(head.header.pid))
            .flatten()
            .and_then(|py| long_linetable::read(head, &py));
        self.resolver.code_with_table(head, data, long_table);
    }

    /// A call line whose probe has stacks: its `stack`, or its reason counted.
    /// `left_out`: `--stack-every` or `--stack-rate` skipped its walk (the call record's
    /// flags say which), so no record was sent for it.
    /// The footer counts it only when `written` (a window's lines alone are).
    pub fn call(&mut self, call: &mut CallLine, left_out: Option<Reason>, written: bool) {
        call.stack = match left_out {
            Some(reason) => {
                if written {
                    reason.count(&mut self.resolver.footer.without);
                }
                None
            }
            None => self.resolver.take(call.tid, call.ts_ns, written),
        };
    }

    /// The footer's `stacks` object.
    pub fn footer(&self) -> StacksFooter {
        let mut footer = self.resolver.footer.clone();
        footer.frames_walked = self
            .counters
            .get(&stack_counter::FRAMES, 0)
            .map_or(0, |per_cpu| per_cpu.iter().sum());
        footer.memory_reads = self
            .counters
            .get(&stack_counter::MEMORY_READS, 0)
            .map_or(0, |per_cpu| per_cpu.iter().sum());
        footer.memory_read_faults = self
            .counters
            .get(&stack_counter::READ_FAULTS, 0)
            .map_or(0, |per_cpu| per_cpu.iter().sum());
        footer.memory_read_bytes = self
            .counters
            .get(&stack_counter::MEMORY_READ_BYTES, 0)
            .map_or(0, |per_cpu| per_cpu.iter().sum());
        footer.code_free_probes = self.interpreters.free_counts();
        footer
    }
}

/// Why a call record's flags say it has no stack by design: `--stack-every`'s draw or
/// `--stack-rate`'s limit skipped its walk.
pub fn left_out(call_flags: u32) -> Option<Reason> {
    if call_flags & flags::STACK_SAMPLED_OUT != 0 {
        Some(Reason::SampledOut)
    } else if call_flags & flags::STACK_RATE_LIMITED != 0 {
        Some(Reason::RateLimited)
    } else {
        None
    }
}

/// Whether `--stacks` can work on this kernel: the offset of a thread's thread pointer
/// (x86-64's `fs` base, arm64's `tpidr_el0`) in its task, from the kernel's BTF.
pub fn kernel_fsbase() -> Result<u32, String> {
    thread_pointer_offset(Path::new(KERNEL_BTF)).ok_or_else(|| {
        format!(
            "{KERNEL_BTF} is missing or has no task_struct.{}: cudatrace cannot find a \
             thread's Python thread state without it",
            tracer_common::arch::TARGET.thread_pointer.join(".")
        )
    })
}
