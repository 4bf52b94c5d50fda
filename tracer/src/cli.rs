//! Command-line interface: the subcommands, assembled. Each subcommand's flags are its own
//! `Args` struct, in its module (`run::RunArgs`, `summary::SummaryArgs`, ...).

use clap::{Parser, Subcommand};

use crate::{
    doctor::DoctorArgs, export::ExportArgs, flame::FlameArgs, keeper::KeeperArgs, merge::MergeArgs,
    plot::PlotArgs, run::RunArgs, selftest::SelftestArgs, summary::SummaryArgs, view::ViewArgs,
};

/// Trace what a program does with the GPU: its CUDA driver calls (the catalog's, decoded;
/// with --functions all, every exported one), with no change to the program.
#[derive(Debug, Parser)]
#[command(
    name = "cudatrace",
    version,
    after_help = "Examples:\n  \
        sudo cudatrace run -- python3 simple_inference.py\n  \
        sudo cudatrace run -o trace.jsonl -- ./my_cuda_app --size 4096\n  \
        sudo cudatrace run --gpu -- python3 train.py   # also what the GPU ran, kernel by kernel\n  \
        sudo cudatrace run -p 12345            # attach to a running process\n  \
        sudo cudatrace run --all               # every process that uses libcuda, until Ctrl-C\n  \
        sudo cudatrace run --power -- python3 infer.py   # and GPU power and energy every 20 ms\n  \
        sudo cudatrace run --functions all -- ./app    # every exported cu* function\n  \
        cudatrace summary trace.jsonl          # kernels, memory, stages, latencies\n  \
        cudatrace export trace.jsonl           # trace.json for the Perfetto UI or chrome://tracing\n  \
        cudatrace export --format parquet trace.jsonl   # trace.parquet/: tables for DuckDB\n  \
        cudatrace plot trace.jsonl -o timeline.svg\n  \
        srun cudatrace run -o 'traces/%h-%r.jsonl' -- python3 train.py   # a trace per rank\n  \
        cudatrace summary traces/*.jsonl        # who waited for whom across the ranks\n  \
        cudatrace merge traces/*.jsonl -o job.pftrace   # one timeline, clocks aligned\n\n\
        cudatrace flame trace.jsonl            # Python stacks as a pprof profile (run --stacks)\n\n\
        Exit codes: the traced command's own, or 2 usage, 65 malformed or mismatched traces,\n\
        66 no such process (-p), 69 unusable --libcuda/--lib, 70 internal error, 72 no usable\n\
        NVML (--power), 73 output not writable, 74 trace not readable (no such file, a\n\
        directory, a device, no permission, a pipe past its copy limit), 75 port 9001 in use\n\
        (view), 77 not privileged, 78 probes missing (--missing-probes error), 80 no libcupti\n\
        (--gpu), 81 CUDA_INJECTION64_PATH already set (--gpu), 82 GPU recording failed\n\
        (--gpu), 83 cannot attach (-p PID --gpu), 126 command not executable, 127 command not found; stopped by a signal: 129\n\
        SIGHUP, 130 SIGINT, 131 SIGQUIT, 143 SIGTERM."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command (or attach to processes) and record its CUDA driver calls as JSONL.
    Run(Box<RunArgs>),
    /// Summarise a trace: time per function, kernels, copies, device memory and leaks,
    /// and the stages of the run.
    Summary(SummaryArgs),
    /// Convert a trace for the Perfetto UI (ui.perfetto.dev) or chrome://tracing, or into
    /// Parquet tables for SQL engines (DuckDB, pandas, Spark).
    Export(ExportArgs),
    /// Merge one job's traces (one per node or rank) into one timeline for the Perfetto
    /// UI: hosts and ranks named, clocks aligned on the collectives' kernel ends.
    Merge(MergeArgs),
    /// Draw a trace's timeline as an SVG or PNG picture, for reports.
    Plot(PlotArgs),
    /// Write a `--stacks` trace's Python stacks as a profile (pprof, or folded text for
    /// flame graphs), weighted by GPU time, time in calls, calls or bytes.
    Flame(FlameArgs),
    /// Open a trace in the Perfetto UI: exported if it is JSONL, served once on
    /// 127.0.0.1:9001, opened in your browser (or the URL printed).
    View(ViewArgs),
    /// Say what this machine allows: uprobes, uprobe_multi, kprobes, fentry, BTF,
    /// tracepoints, the NVIDIA module, libcuda and privileges. Each check loads and
    /// attaches a real program. Exits 0 when `run` can trace here, 1 otherwise.
    Doctor(DoctorArgs),
    /// Check that uprobes, the ring buffer and aya-log work here (used by the tests).
    #[command(hide = true)]
    Selftest(SelftestArgs),
    /// Started by `run`: continues what its probes stopped if it is killed (`keeper.rs`).
    #[command(hide = true)]
    Keeper(KeeperArgs),
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::{exit::ExitCode, probes::plan::MissingProbes};
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The numbers in `text`.
    fn numbers(text: &str) -> Vec<i32> {
        text.split(|c: char| !c.is_ascii_digit())
            .filter_map(|word| word.parse().ok())
            .collect()
    }

    #[test]
    fn every_exit_code_is_in_the_help_and_the_readme() {
        let help = Cli::command().get_after_help().unwrap().to_string();
        let (_, in_help) = help.split_once("Exit codes:").unwrap();
        let in_help = numbers(in_help);
        // The README's table: a row per code (or two), the codes in its first cell.
        let readme = include_str!("../../README.md");
        let (_, table) = readme.split_once("| code | meaning |").unwrap();
        let in_readme: Vec<i32> = table
            .lines()
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .flat_map(|line| numbers(line.split('|').nth(1).unwrap()))
            .collect();
        for code in ExitCode::ALL {
            let code = code as i32;
            assert!(in_help.contains(&code), "{code} is not in --help");
            assert!(in_readme.contains(&code), "{code} is not in the README");
        }
    }

    #[test]
    fn run_takes_the_command_after_dashes() {
        let cli = Cli::try_parse_from([
            "cudatrace",
            "run",
            "-q",
            "-o",
            "-",
            "--",
            "python3",
            "-c",
            "x",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.command, ["python3", "-c", "x"]);
        assert_eq!(args.output, Some(PathBuf::from("-")));
        assert!(args.quiet);
        assert_eq!(args.missing_probes, MissingProbes::Warn);
    }

    #[test]
    fn summary_takes_a_trace_and_flags() {
        let cli = Cli::try_parse_from([
            "cudatrace",
            "summary",
            "t.jsonl",
            "--json",
            "--skip-bad-lines",
        ])
        .unwrap();
        let Command::Summary(args) = cli.command else {
            panic!("not summary")
        };
        assert_eq!(args.traces, [PathBuf::from("t.jsonl")]);
        assert!(args.json && args.skip_bad_lines);
        assert!(Cli::try_parse_from(["cudatrace", "summary"]).is_err());
    }

    #[test]
    fn export_and_plot_take_a_trace_and_filters() {
        let cli = Cli::try_parse_from([
            "cudatrace",
            "export",
            "t.jsonl",
            "--format",
            "perfetto",
            "--pid",
            "4",
            "--pid",
            "5",
            "--name",
            "cuLaunch",
            "--start-ms",
            "1.5",
            "-o",
            "-",
        ])
        .unwrap();
        let Command::Export(args) = cli.command else {
            panic!("not export")
        };
        assert_eq!(args.format, crate::export::ExportFormat::Perfetto);
        assert_eq!(args.pids, [4, 5]);
        assert_eq!(args.names, ["cuLaunch"]);
        assert_eq!((args.start_ms, args.end_ms), (Some(1.5), None));
        assert_eq!(args.output, Some(PathBuf::from("-")));

        let cli = Cli::try_parse_from(["cudatrace", "plot", "t.jsonl", "-o", "t.png"]).unwrap();
        let Command::Plot(args) = cli.command else {
            panic!("not plot")
        };
        assert_eq!(
            (args.width, args.output),
            (1400, Some(PathBuf::from("t.png")))
        );
        assert!(Cli::try_parse_from(["cudatrace", "plot", "t.jsonl", "--width", "10"]).is_err());
    }

    #[test]
    fn ring_size_must_be_a_power_of_two() {
        assert!(Cli::try_parse_from(["cudatrace", "run", "--ring-kib", "3", "--", "x"]).is_err());
        assert!(Cli::try_parse_from(["cudatrace", "run", "--ring-kib", "4", "--", "x"]).is_err());
        assert!(Cli::try_parse_from(["cudatrace", "run", "--ring-kib", "8", "--", "x"]).is_ok());
    }
}
