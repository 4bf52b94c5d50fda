//! Command-line interface.

use std::{ffi::OsString, path::PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::probes::MissingProbes;

/// Trace what a program does with the GPU: every CUDA driver call, with no change to
/// the program.
#[derive(Debug, Parser)]
#[command(
    name = "cudatrace",
    version,
    after_help = "Examples:\n  \
        sudo cudatrace run -- python3 simple_inference.py\n  \
        sudo cudatrace run -o trace.jsonl -- ./my_cuda_app --size 4096\n  \
        sudo cudatrace run -p 12345            # attach to a running process\n  \
        sudo cudatrace run --all               # every process that uses libcuda, until Ctrl-C\n  \
        cudatrace summary trace.jsonl          # kernels, memory, stages, latencies\n  \
        cudatrace export trace.jsonl           # trace.json for the Perfetto UI or chrome://tracing\n  \
        cudatrace plot trace.jsonl -o timeline.svg\n\n\
        Exit codes: the traced command's own, or 2 usage, 65 malformed trace line,\n\
        66 no such process or trace file, 69 no libcuda, 70 internal error, 73 output not\n\
        writable, 77 not privileged, 78 probes missing (--missing-probes error), 126 command\n\
        not executable, 127 command not found."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command (or attach to processes) and record its CUDA driver calls as JSONL.
    Run(RunArgs),
    /// Summarise a trace: time per function, kernels, copies, device memory and leaks,
    /// and the stages of the run.
    Summary(SummaryArgs),
    /// Convert a trace for the Perfetto UI (ui.perfetto.dev) or chrome://tracing.
    Export(ExportArgs),
    /// Draw a trace's timeline as an SVG or PNG picture, for reports.
    Plot(PlotArgs),
    /// Say what this machine allows: uprobes, uprobe_multi, kprobes, fentry, BTF,
    /// tracepoints, the NVIDIA module, libcuda and privileges. Each check loads and
    /// attaches a real program. Exits 0 when `run` can trace here, 1 otherwise.
    Doctor(crate::doctor::DoctorArgs),
    /// Check that uprobes, the ring buffer and aya-log work here (used by the tests).
    #[command(hide = true)]
    Selftest(crate::selftest::SelftestArgs),
}

#[derive(Debug, Args)]
#[command(after_help = "\
The command starts suspended: probes are attached before its first instruction, so cuInit
is seen. Its children (fork, exec, Python multiprocessing, torchrun workers) are traced
too; other processes are not, unless --all is given.

Under sudo the command runs as the invoking user (SUDO_UID/SUDO_GID, with their groups)
and the trace file belongs to them; --as-root keeps root.

When the command exits, cudatrace detaches, drains the ring buffer, writes the footer
and exits with the command's exit code. Ctrl-C (SIGINT) and SIGTERM do the same and
exit 130/143; SIGTERM is passed on to the command.")]
pub struct RunArgs {
    /// Attach to a running process (and the children it starts from now on). Repeatable.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Trace every process that calls libcuda, not only the command's tree.
    #[arg(long)]
    pub all: bool,

    /// Where to write the trace; `-` for standard output (the command's stdout then goes
    /// to stderr). Default: traces/trace_YYYYMMDD_HHMMSS.jsonl.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// The libcuda to probe. Default: the ldconfig cache, LD_LIBRARY_PATH, then
    /// /usr/local/nvidia/lib64, /usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/lib/wsl/lib.
    #[arg(long, value_name = "PATH")]
    pub libcuda: Option<PathBuf>,

    /// What to do when a catalog function is not exported by libcuda or fails to attach.
    #[arg(long, value_enum, default_value = "warn", value_name = "POLICY")]
    pub missing_probes: MissingProbes,

    /// Run the command as root even under sudo.
    #[arg(long)]
    pub as_root: bool,

    /// No progress on stderr (errors and the final line still print).
    #[arg(short, long)]
    pub quiet: bool,

    /// Ring buffer size in KiB (a power of two, at least 4). Larger rides out bursts.
    #[arg(long, default_value_t = 16384, value_name = "KIB", value_parser = parse_ring_kib)]
    pub ring_kib: u32,

    /// Also record what the NVIDIA kernel module does for the traced processes: ioctls
    /// (escape code, RM control command or class), mmaps of /dev/nvidia*, Xid errors.
    #[arg(long)]
    pub kernel: bool,

    /// How --kernel hooks the driver: `auto` (kprobes where the kernel has them and the
    /// module is loaded, else the syscall tracepoints), `tracepoint`, `kprobe`, or a
    /// comma-separated list of kernel functions to kprobe (old names such as nvidia_ioctl
    /// are accepted as aliases of their replacements).
    #[arg(long, default_value = "auto", value_name = "HOW")]
    pub kernel_hooks: crate::kernel_hooks::HookChoice,

    /// Path prefix of NVIDIA device files (tests point it at stand-in files).
    #[arg(long, hide = true, value_name = "PREFIX")]
    pub kernel_device_prefix: Option<String>,

    /// Also export the trace when tracing ends, beside it: TRACE.json (`chrome`) or
    /// TRACE.pftrace (`perfetto`); see `cudatrace export`. Not with `-o -`.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub export: Option<crate::export::ExportFormat>,

    /// The command to run, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
#[command(after_help = "\
The trace is read line by line; memory grows with the number of distinct functions,
kernels and live allocations, not with its length. A trace without its footer (the
tracer was killed) is summarised with a warning. Kernel names and live device bytes are
recomputed from the calls when the trace lacks them. docs/trace-format.md (\"Analysis
fields\") says how stages are detected and what counts as device memory.")]
pub struct SummaryArgs {
    /// The JSONL trace written by `cudatrace run`.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    /// Print the summary as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,

    /// Skip malformed lines (counted and reported) instead of failing with exit code 65.
    #[arg(long)]
    pub skip_bad_lines: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Calls become slices on their process's and thread's track (launches named by kernel,
copies by direction and size), device memory a counter, fork/exec/exit and lost events
markers, and each launch gets a flow arrow to the synchronisation that waited for it.
Times are microseconds (chrome) or nanoseconds (perfetto) since tracing started. The
output is written while the trace is read: memory does not grow with the trace.
docs/export.md has the whole mapping.

Examples:
  cudatrace export trace.jsonl                     # writes trace.json
  cudatrace export trace.jsonl --format perfetto   # writes trace.pftrace
  cudatrace export trace.jsonl --pid 4242 --name cuLaunch --start-ms 1000 --end-ms 1500")]
pub struct ExportArgs {
    /// The JSONL trace written by `cudatrace run`.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    /// `chrome`: Trace Event JSON; `perfetto`: Perfetto's protobuf format, smaller and
    /// faster to open for traces of a million events or more.
    #[arg(long, value_enum, default_value = "chrome")]
    pub format: crate::export::ExportFormat,

    /// Where to write; `-` for standard output. Default: TRACE with the extension
    /// `.json` (chrome) or `.pftrace` (perfetto).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Only this process's events. Repeatable.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Only calls whose function or slice name (a kernel's, for launches) contains
    /// SUBSTRING (case-sensitive), and driver events whose name or hook does. Repeatable:
    /// any one matches. Counters and process markers are kept.
    #[arg(long = "name", value_name = "SUBSTRING")]
    pub names: Vec<String>,

    /// Only events from this many milliseconds after tracing started (slices that
    /// overlap the window are kept whole).
    #[arg(long, value_name = "MS")]
    pub start_ms: Option<f64>,

    /// Only events up to this many milliseconds after tracing started.
    #[arg(long, value_name = "MS")]
    pub end_ms: Option<f64>,

    /// Skip malformed lines (counted and reported) instead of failing with exit code 65.
    #[arg(long)]
    pub skip_bad_lines: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "\
One lane per API family (the bar's height is the share of time spent in calls; a thin
tick marks calls too short to see), the stages `cudatrace summary` detects as shaded
bands, each process's device memory, and the most launched kernels. Figures are the
summary's own. The trace is read twice, once for the summary and once to bin the calls
into pixel columns: memory does not grow with its length.

Examples:
  cudatrace plot trace.jsonl                  # writes trace.svg
  cudatrace plot trace.jsonl -o timeline.png")]
pub struct PlotArgs {
    /// The JSONL trace written by `cudatrace run`.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    /// Where to write: `.svg`, or `.png` for a bitmap (twice the width in pixels).
    /// Default: TRACE with the extension `.svg`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Width of the picture in CSS pixels.
    #[arg(long, default_value_t = 1400, value_name = "PX", value_parser = clap::value_parser!(u32).range(800..=8000))]
    pub width: u32,

    /// Skip malformed lines (counted and reported) instead of failing with exit code 65.
    #[arg(long)]
    pub skip_bad_lines: bool,
}

fn parse_ring_kib(text: &str) -> Result<u32, String> {
    let kib: u32 = text.parse().map_err(|e| format!("{e}"))?;
    if kib < 4 || !kib.is_power_of_two() || kib > 1 << 20 {
        return Err("must be a power of two between 4 and 1048576".into());
    }
    Ok(kib)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
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
        assert_eq!(args.trace, PathBuf::from("t.jsonl"));
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
        assert!(Cli::try_parse_from(["cudatrace", "run", "--ring-kib", "4", "--", "x"]).is_ok());
    }
}
