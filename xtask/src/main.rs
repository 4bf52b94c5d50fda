//! Developer tasks for cudatrace, run as `cargo xtask <command>`.

mod arm64;
mod bench;
mod binfmt;
mod cmd;
mod ebpf;
mod imports;
mod pythons;
mod standin;
mod tasks;
mod toolchain;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    about = "cudatrace developer tasks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the eBPF programs (tracer-ebpf) for bpfel-unknown-none.
    BuildEbpf(ebpf::BuildEbpfOptions),
    /// Run every test: unit, root (real probes), and root again on 5.10, 6.1 and 6.12 in QEMU.
    Test(tasks::TestOptions),
    /// Check that no crate has an import circle among sibling modules (files or folders).
    CheckImports,
    /// Build everything and record a demo trace into traces/demo.jsonl.
    Demo,
    /// Run root tests in QEMU guests on Debian's 5.10, 6.1 and 6.12 kernels (needs root).
    VmTest(vm::VmTestOptions),
    /// Writes the README's kernel table from the last runs' records (target/vm/support/:
    /// `cargo xtask test` keeps the host's, `vm-test` each guest's). CI fails where the
    /// README's table is not the one its run makes.
    KernelTable,
    /// Build `cudatrace` for aarch64-unknown-linux-gnu (installs the Rust target and
    /// gcc-aarch64-linux-gnu where missing).
    BuildArm64,
    /// Benchmarks against the stand-in libcuda (needs root): per-call overhead beside the
    /// tracefs floor and bpftrace, sustained rate, tracer RSS and CPU, summary/export speed.
    Bench(bench::BenchOptions),
    /// Make the interpreters the --stacks root tests trace beyond the machine's own (as
    /// `test` does): Debian trixie's CPython 3.13 and sid's 3.14; with `--free-threaded`
    /// also a free-threaded 3.13t built from Debian's source (needs root; 5 to 16 minutes
    /// on 2 cores, once; not in CI for its time: docs/python-stacks.md).
    Pythons {
        #[arg(long)]
        free_threaded: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::BuildEbpf(opts) => ebpf::build_ebpf(&opts),
        Command::Test(opts) => tasks::test(&opts),
        Command::CheckImports => imports::check_imports(),
        Command::Demo => tasks::demo(),
        Command::VmTest(opts) => vm::vm_test(&opts),
        Command::KernelTable => vm::support::write(&cmd::workspace_root()),
        Command::BuildArm64 => arm64::build_arm64(),
        Command::Bench(opts) => bench::bench(&opts),
        Command::Pythons { free_threaded } => pythons::ensure_all(free_threaded),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
