//! `cudatrace summary TRACE.jsonl`: read a trace back and print what it means.

use std::io::Write;

use anyhow::anyhow;

mod args;
mod power;
pub mod text;

pub use args::SummaryArgs;

use crate::{
    analysis::summarise::summarise,
    exit::{ExitCode, Failure},
    reader::{ReadError, TraceLines},
    trace_input::TraceInput,
};

use self::text::{SummaryJson, render_text};

/// Runs `cudatrace summary` and returns the exit code.
pub fn run(args: SummaryArgs) -> Result<i32, Failure> {
    let label = args.trace.display().to_string();
    // A `--gpu` trace is read twice: a pipe is copied first (`trace_input`).
    let input = TraceInput::open(&args.trace).map_err(|e| {
        Failure::new(
            ExitCode::NoSuchProcess,
            anyhow!("cannot open the trace {label}: {e}"),
        )
    })?;
    let open = || {
        let file = input.pass().map_err(|source| ReadError::Io {
            file: label.clone(),
            source,
        })?;
        Ok(TraceLines::from_file(file, &label, args.skip_bad_lines))
    };
    let result = summarise(open).map_err(|e| match e {
        ReadError::BadLine { .. } => Failure::new(ExitCode::BadInput, e),
        ReadError::Io { .. } => Failure::new(ExitCode::NoSuchProcess, e),
    })?;

    for (line, message) in &result.skipped {
        eprintln!("cudatrace: skipped {label}:{line}: {message}");
    }
    if result.info.skipped_lines > result.skipped.len() as u64 {
        eprintln!(
            "cudatrace: skipped {} malformed lines in all",
            result.info.skipped_lines
        );
    }
    if !result.info.complete {
        eprintln!(
            "cudatrace: warning: {label} has no footer (the trace was cut short); \
             summarising the {} lines it has",
            result.info.lines
        );
    }
    if let Some(power) = &result.report.power
        && power.read_errors > 0
    {
        eprintln!(
            "cudatrace: warning: {} NVML reads failed while sampling power: those samples \
             lack those fields (see Energy)",
            power.read_errors
        );
    }
    if result.info.lost_events > 0 {
        eprintln!(
            "cudatrace: warning: the tracer lost {} events: counts are lower bounds and \
             memory figures may be off",
            result.info.lost_events
        );
    }

    let text = if args.json {
        let stacks = result
            .report
            .stacks
            .as_ref()
            .map(|profile| profile.summary());
        let json = SummaryJson {
            trace: &result.info,
            summary: &result.report.summary,
            memory: &result.report.memory,
            stages: &result.report.stages,
            driver: &result.report.driver,
            gpu: &result.report.gpu,
            power: result.report.power.as_ref(),
            collectives: &result.report.collectives,
            devices: &result.report.devices,
            stacks: stacks.as_ref(),
        };
        let mut text =
            serde_json::to_string_pretty(&json).map_err(|e| Failure::new(ExitCode::Internal, e))?;
        text.push('\n');
        text
    } else {
        render_text(&result.info, &result.report)
    };
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(0),
        // `cudatrace summary t.jsonl | head` is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(Failure::new(
            ExitCode::OutputNotWritable,
            anyhow!("writing the summary: {e}"),
        )),
    }
}
