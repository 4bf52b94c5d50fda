//! `cudatrace plot`'s flags.

use std::path::PathBuf;

use clap::Args;

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
    /// `-` for standard output (SVG). Default: TRACE with the extension `.svg`. A file is
    /// written whole or not at all.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Width of the picture in CSS pixels.
    #[arg(long, default_value_t = 1400, value_name = "PX", value_parser = clap::value_parser!(u32).range(800..=8000))]
    pub width: u32,

    /// Skip malformed lines (counted and reported) instead of failing with exit code 65.
    #[arg(long)]
    pub skip_bad_lines: bool,
}
