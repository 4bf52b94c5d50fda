//! `cudatrace flame TRACE`: a `--stacks` trace's Python stacks as a profile, weighted by
//! GPU time, time in calls, calls or bytes: pprof's format (`pprof.rs`, for `pprof`,
//! speedscope, Perfetto, Pyroscope) or folded text (`folded.rs`, for flamegraph scripts).
//! The figures are `summary`'s own (`analysis/stacks`): a profile's flat value at a
//! Python line is the summary's row for that line.
//!
//! | file | |
//! |---|---|
//! | `pprof.rs` | profile.proto's messages, the profile built and gzipped |
//! | `folded.rs` | one `outer;...;inner weight` line per stack |

mod folded;
mod pprof;

use std::path::{Path, PathBuf};

use anyhow::anyhow;
use clap::{Args, ValueEnum};

use crate::{
    analysis::{
        stacks::{StackFigures, StackProfile},
        summarise::summarise,
    },
    exit::{ExitCode, Failure},
    format::plural,
    output_file::{Input, Output, Writer},
    privileges,
    reader::{ReadError, TraceLines, cut_warning},
    trace_input::{TraceInput, is_stream},
};

/// The outermost frame of a stack cut at the frame budget.
pub const CUT: &str = "(cut at the frame budget)";

/// What a stack weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Weight {
    /// GPU time of the kernels the calls launched (`--gpu` traces), ns.
    Gpu,
    /// Time in the calls, ns.
    Time,
    /// Calls.
    Calls,
    /// Device bytes allocated.
    Bytes,
    /// Bytes copied.
    Copied,
    /// Device bytes still allocated at the end (leaks).
    Live,
    /// Kernel launches.
    Launches,
}

impl Weight {
    /// Every weight, in the profile's `sample_type` order.
    pub const ALL: [Weight; 7] = [
        Weight::Gpu,
        Weight::Time,
        Weight::Calls,
        Weight::Bytes,
        Weight::Copied,
        Weight::Live,
        Weight::Launches,
    ];

    pub fn of(self, figures: &StackFigures) -> u64 {
        match self {
            Weight::Gpu => figures.gpu_ns,
            Weight::Time => figures.time_ns,
            Weight::Calls => figures.calls,
            Weight::Bytes => figures.allocated_bytes,
            Weight::Copied => figures.copied_bytes,
            Weight::Live => figures.live_bytes,
            Weight::Launches => figures.launches,
        }
    }

    /// pprof's sample type and unit.
    pub fn type_and_unit(self) -> (&'static str, &'static str) {
        match self {
            Weight::Gpu => ("gpu", "nanoseconds"),
            Weight::Time => ("time", "nanoseconds"),
            Weight::Calls => ("calls", "count"),
            Weight::Bytes => ("allocated", "bytes"),
            Weight::Copied => ("copied", "bytes"),
            Weight::Live => ("live", "bytes"),
            Weight::Launches => ("launches", "count"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FlameFormat {
    /// pprof's protobuf, gzipped.
    Pprof,
    /// `outer;...;inner weight` lines.
    Folded,
}

#[derive(Debug, Args)]
#[command(after_help = "\
The trace must have Python stacks (`cudatrace run --stacks`). Each stack weighs what its
calls did, as `cudatrace summary` counts it; calls and kernels without a stack weigh under
`(no stack)`, so the profile's total is the trace's. A pprof profile carries every weight
(`-sample_index` picks another); folded text the one chosen.

Examples:
  cudatrace flame trace.jsonl                          # trace.pb.gz, by GPU time (--gpu)
  go tool pprof -top -lines trace.pb.gz
  cudatrace flame trace.jsonl --weight time -o trace.folded
  flamegraph.pl trace.folded > flame.svg")]
pub struct FlameArgs {
    /// A JSONL trace written by `cudatrace run --stacks`.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    /// What a stack weighs. Default: `gpu` for a `--gpu` trace, else `time`.
    #[arg(long, value_enum)]
    pub weight: Option<Weight>,

    /// `pprof` (gzipped protobuf) or `folded` text. Default: `folded` for an output named
    /// `*.folded` or `*.txt`, else `pprof`.
    #[arg(long, value_enum)]
    pub format: Option<FlameFormat>,

    /// Where to write; `-` for standard output. Default: TRACE with the extension `.pb.gz`
    /// (`.folded`). A file is written whole or not at all: an earlier one stays as it was
    /// if this run fails.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Skip malformed lines (counted and reported) instead of failing with exit code 65.
    #[arg(long)]
    pub skip_bad_lines: bool,
}

/// The stacks of the trace at `path`, as `summary` reads them.
fn read(path: &Path, label: &str, skip_bad_lines: bool) -> Result<StackProfile, Failure> {
    // A `--gpu` trace is read twice: a pipe is copied first (`trace_input`).
    let input = TraceInput::open_trace(path)?;
    let open = || {
        input
            .pass()
            .map(|file| TraceLines::from_file(file, label, skip_bad_lines))
            .map_err(ReadError::reading(label))
    };
    let summarised = summarise(open)?;
    if summarised.info.skipped_lines > 0 {
        eprintln!(
            "cudatrace: skipped {} malformed lines of {label}",
            summarised.info.skipped_lines
        );
    }
    if let Some(line) = summarised.info.cut_line {
        eprintln!("cudatrace: warning: {}", cut_warning(label, line));
    }
    summarised.report.stacks.ok_or_else(|| {
        Failure::new(
            ExitCode::BadInput,
            anyhow!("{label} has no Python stacks: record it with `cudatrace run --stacks`"),
        )
    })
}

/// Runs `cudatrace flame` and returns the exit code.
pub fn run(args: FlameArgs) -> Result<i32, Failure> {
    let label = args.trace.display().to_string();
    let folded_name = |path: &Path| {
        path.extension().is_some_and(|ext| {
            ext.eq_ignore_ascii_case("folded") || ext.eq_ignore_ascii_case("txt")
        })
    };
    let format = args.format.unwrap_or(match &args.output {
        Some(output) if folded_name(output) => FlameFormat::Folded,
        _ => FlameFormat::Pprof,
    });
    let output = match &args.output {
        Some(output) => output.clone(),
        None if !is_stream(&args.trace) => args.trace.with_extension(match format {
            FlameFormat::Pprof => "pb.gz",
            FlameFormat::Folded => "folded",
        }),
        None => {
            return Err(Failure::new(
                ExitCode::Usage,
                anyhow!(
                    "{label} is not a file, so there is no name to write beside it: pass -o FILE"
                ),
            ));
        }
    };
    let stacks = read(&args.trace, &label, args.skip_bad_lines)?;
    let weight = args.weight.unwrap_or(if stacks.gpu {
        Weight::Gpu
    } else {
        Weight::Time
    });
    if weight == Weight::Gpu && !stacks.gpu {
        eprintln!(
            "cudatrace: warning: {label} has no GPU lines (record with `run --gpu`): every \
             stack weighs 0"
        );
    }
    let bytes = match format {
        FlameFormat::Pprof => pprof::encode(&pprof::profile(&stacks, weight))
            .map_err(|e| Failure::new(ExitCode::Internal, e))?,
        FlameFormat::Folded => folded::folded(&stacks, weight).into_bytes(),
    };
    // Under sudo the profile is the invoking user's, written with their permissions.
    let user = privileges::sudo_user();
    let inputs: Vec<Input> = Input::of("the trace being profiled", &args.trace)
        .into_iter()
        .collect();
    Writer {
        user: user.as_ref(),
    }
    .write_output(&output, &inputs, &bytes)
    .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))?;
    let total = weight.of(&stacks.total);
    let (kind, unit) = weight.type_and_unit();
    eprintln!(
        "cudatrace: wrote {} ({}, {} stacks, {kind} {total} {unit})",
        Output::describe(&output),
        match format {
            FlameFormat::Pprof => "pprof",
            FlameFormat::Folded => "folded",
        },
        stacks.table.stacks().len(),
    );
    let counts = &stacks.counts;
    if counts.unknown_stack > 0 {
        eprintln!(
            "cudatrace: warning: {} of {label} named a stack the trace does not have: they \
             weigh under (no stack)",
            plural(counts.unknown_stack, "call")
        );
    }
    if counts.duplicate_stack_ids > 0 {
        eprintln!(
            "cudatrace: warning: {} of {label} repeated an id seen before: the first line of \
             each id was kept",
            plural(counts.duplicate_stack_ids, "stack line")
        );
    }
    if stacks.every > 1 {
        eprintln!(
            "cudatrace: sampled (--stack-every {every}): a call's stack was read at random, 1 \
             in {every}; each stack weighs an estimate ({every} times what its sampled calls \
             did) and (no stack) the rest of the total",
            every = stacks.every
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests;
