//! `cudatrace summary`'s flags.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
#[command(after_help = "\
The trace is read line by line; memory grows with the number of distinct functions,
kernels and live allocations, not with its length. A trace without its footer (the
tracer was killed) is summarised with a warning. Kernel names and live device bytes are
recomputed from the calls when the trace lacks them. docs/trace-format.md (\"Analysis
fields\") says how stages are detected and what counts as device memory.

With several traces (or --job DIR), the job's collectives are matched across ranks by
communicator and order (each NCCL call's comm_id and comm_seq), the traces' clocks put on
one (their headers' wall clock, refined by the kernel ends of --gpu collectives), and each
collective's last rank named with the wait it caused on the others (docs/nccl.md). The
traces must be of one run: their times overlap (within 1 s, for the hosts' clocks) and
they give each communicator they share one number of ranks; else they are refused (exit
65) or, with --separate-runs, summarised run by run. An empty trace is a rank with
nothing (said); a trace cut mid-line is read up to the cut (said). A
single trace holding several ranks of a communicator (JAX, torchrun with several
processes per node) gets the same section after its summary.")]
pub struct SummaryArgs {
    /// The JSONL trace written by `cudatrace run`. Several traces of one job (one per
    /// node or rank): who waited for whom in each collective, across them.
    #[arg(value_name = "TRACE", required_unless_present = "job")]
    pub traces: Vec<PathBuf>,

    /// The traces of one job: every *.jsonl file in DIR (with any TRACE given).
    #[arg(long, value_name = "DIR")]
    pub job: Option<PathBuf>,

    /// Print the summary as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,

    /// Skip malformed lines (counted and reported) instead of failing with exit code 65.
    #[arg(long)]
    pub skip_bad_lines: bool,

    /// Several traces that are not of one run (their times do not overlap, or they give a
    /// communicator different numbers of ranks): summarise each run on its own instead of
    /// refusing them (exit 65). With --json: {"runs": [report, ...]}.
    #[arg(long)]
    pub separate_runs: bool,
}
