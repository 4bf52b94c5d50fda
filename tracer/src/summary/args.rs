//! `cudatrace summary`'s flags.

use std::path::PathBuf;

use clap::Args;

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
