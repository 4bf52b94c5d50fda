//! cudatrace: trace a program's CUDA driver calls with eBPF uprobes.

mod analysis;
mod catalog;
mod cli;
mod doctor;
mod events;
mod exit;
mod kernel_hooks;
mod libcuda;
mod privileges;
mod probes;
mod run;
mod selftest;
mod sinks;
mod spawn;
mod summary;
mod uprobe_multi;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Summary(args) => summary::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Selftest(args) => selftest::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(failure) => {
            eprintln!("cudatrace: error: {:#}", failure.error);
            std::process::exit(failure.code as i32);
        }
    }
}
