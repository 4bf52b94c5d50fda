//! cudatrace: trace a program's CUDA driver calls with eBPF uprobes.
//!
//! Where to start: `cli.rs` assembles the commands, each a module with one entry function
//! (`run::run`, `summary::run`, `export::run`, `plot::run`, `view::run`, `doctor::run`).
//! The trace format is `schema/`. `cudatrace run` reads top to bottom in `run/`, in phases
//! (check → prepare → start → trace → finish): it plans what to attach (`probes/`, from the
//! `catalog/`), starts, then runs each ring-buffer record through decode (`events/`),
//! enrich (`analysis/`) and the sinks (`sinks/`). The readers go through `reader/` and the
//! same `analysis/`. `run --gpu`'s
//! set-up (libcupti, the injection library) is `inject/`.

mod analysis;
mod catalog;
mod cli;
mod clock;
mod doctor;
mod events;
mod exit;
mod export;
mod flame;
mod format;
mod inject;
mod job_input;
mod keeper;
mod kernel_hooks;
mod merge;
mod output_file;
mod phases;
mod plot;
mod power;
mod privileges;
mod probes;
mod reader;
mod run;
mod schema;
mod selftest;
mod sinks;
mod spawn;
mod stacks;
mod summary;
mod trace_input;
mod view;

/// The hand-written traces of the export and plot CLI tests, for their unit tests too.
#[cfg(test)]
#[path = "../tests/traces/mod.rs"]
mod test_traces;

use clap::Parser;

use crate::cli::{Cli, Command};

/// The readers allocate a few strings per trace line on worker threads and free them in
/// batches: mimalloc's per-thread heaps make that about a third cheaper than glibc's arenas.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Before anything installs a handler: what the traced command is to start with.
    spawn::record_inherited_signals();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(*args),
        Command::Summary(args) => summary::run(args),
        Command::Export(args) => export::run(args),
        Command::Plot(args) => plot::run(args),
        Command::Flame(args) => flame::run(args),
        Command::View(args) => view::run(args),
        Command::Merge(args) => merge::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Selftest(args) => selftest::run(args),
        Command::Keeper(args) => keeper::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(failure) => {
            eprintln!("cudatrace: error: {:#}", failure.error);
            std::process::exit(failure.code as i32);
        }
    }
}
