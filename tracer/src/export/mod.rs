//! `cudatrace export TRACE.jsonl`: the trace as a timeline for the Perfetto UI and
//! chrome://tracing (docs/export.md has the mapping), or as Parquet tables for SQL
//! engines (`parquet/`, docs/trace-format.md).
//!
//! Lines are read, analysed (kernel names, live device bytes) and written one at a time:
//! memory holds the launches waiting for their synchronisation and a few entries per
//! process and thread, never the trace.
//!
//! | file | |
//! |---|---|
//! | `args.rs` | the flags and formats |
//! | `exporter/` | trace lines → timeline events: the exporter, its tracks and names (`mod.rs`); calls, flows and NCCL rank slices (`calls.rs`); `--gpu` work (`gpu.rs`); process, lost, driver and power lines (`lines.rs`); `--stacks`: calls' stacks and the layer tracks (`stacks.rs`), stacks as profile samples of calls and GPU time (`samples.rs`) |
//! | `timeline.rs` | tracks, slices, instants; the [`TimelineSink`](timeline::TimelineSink) a format implements |
//! | `arguments/` | a slice's arguments, from any serialisable line (`collect.rs`), without a JSON map |
//! | `call_args.rs` | a call's arguments, read straight from its line |
//! | `chrome.rs`, `perfetto/` (`proto.rs`) | the two formats; Perfetto's writer and its interning (`mod.rs`), the timeline as packets (`sink.rs`), track events encoded by hand (`packet.rs`, `wire.rs`), `--stacks`' interned callstacks and samples (`profile.rs`) |
//! | `flows.rs` | launch → synchronisation arrows |
//! | `power.rs` | `--power` samples as each GPU's counter tracks |
//! | `filters.rs` | `--pid`, `--name`, the time window |
//! | `parquet/` | `--format parquet`: a table per kind of line |
//! | `merge.rs` | several traces of a job in one timeline (`cudatrace merge`): each on the job's clock, its ids kept apart |

mod args;
mod arguments;
mod call_args;
mod chrome;
mod exporter;
mod filters;
mod flows;
pub mod merge;
mod parquet;
mod perfetto;
mod power;
pub mod proto;
mod timeline;

pub use args::{ExportArgs, ExportFormat};
pub use filters::Filters;

use std::{
    fs::File,
    io::{self, BufRead, Write},
    path::{Path, PathBuf},
    time::Instant as Clock,
};

use anyhow::anyhow;

use self::{
    chrome::ChromeWriter,
    exporter::{ExportError, Exporter, no_escapes},
    perfetto::PerfettoWriter,
    timeline::ExportStats,
};
use crate::{
    exit::{ExitCode, Failure},
    output_file::{Input, Output, Writer},
    privileges::{self, TargetUser},
    reader::{ReadError, TraceLines},
    trace_input::{TraceInput, is_stream},
};

/// Exports a whole trace to `out` in `format`.
#[cfg_attr(
    not(test),
    expect(dead_code, reason = "files are read by export_lines")
)]
pub fn export(
    reader: impl BufRead,
    label: &str,
    out: impl Write,
    format: ExportFormat,
    filters: &Filters,
    skip_bad_lines: bool,
) -> Result<ExportStats, ExportError> {
    let lines = TraceLines::prepared(reader, label, skip_bad_lines, no_escapes);
    export_lines(lines, out, format, filters)
}

/// Exports the trace's `lines` to `out` in `format`.
pub fn export_lines(
    lines: TraceLines<impl BufRead, bool>,
    out: impl Write,
    format: ExportFormat,
    filters: &Filters,
) -> Result<ExportStats, ExportError> {
    match format {
        ExportFormat::Chrome => Exporter::new(filters, ChromeWriter::new(out)?).run(lines),
        ExportFormat::Perfetto => Exporter::new(filters, PerfettoWriter::new(out)).run(lines),
        // A folder, not a stream: `parquet::export` writes it.
        ExportFormat::Parquet => Err(ExportError::Write(io::Error::other(
            "Parquet tables are written by export::parquet",
        ))),
    }
}

/// Exports several traces (each file with its label and place) into one timeline on
/// `out` (`cudatrace merge`), then the clock markers.
pub fn merge_files(
    files: Vec<(File, String, merge::TracePlace)>,
    markers: &[merge::ClockMarker<'_>],
    out: impl Write,
    format: ExportFormat,
    skip_bad_lines: bool,
) -> Result<ExportStats, Failure> {
    let traces = files
        .into_iter()
        .map(|(file, label, place)| {
            let lines = TraceLines::from_file_prepared(file, &label, skip_bad_lines, no_escapes);
            (lines, place)
        })
        .collect();
    let stats = match format {
        ExportFormat::Chrome => merge_into(
            ChromeWriter::new(out).map_err(ExportError::from)?,
            traces,
            markers,
        )?,
        ExportFormat::Perfetto => merge_into(PerfettoWriter::new(out), traces, markers)?,
        // Refused by `cudatrace merge`: each trace's tables are queried together.
        ExportFormat::Parquet => {
            return Err(
                ExportError::Write(io::Error::other("Parquet tables are not merged")).into(),
            );
        }
    };
    Ok(stats)
}

/// An export's error with its exit code.
impl From<ExportError> for Failure {
    fn from(error: ExportError) -> Self {
        match error {
            ExportError::Read(error) => error.into(),
            ExportError::Write(_) => Failure::new(ExitCode::OutputNotWritable, error),
        }
    }
}

fn merge_into<S: timeline::TimelineSink, R: BufRead>(
    mut sink: S,
    traces: Vec<(TraceLines<R, bool>, merge::TracePlace)>,
    markers: &[merge::ClockMarker<'_>],
) -> Result<ExportStats, ExportError> {
    let filters = Filters::default();
    let mut total = ExportStats::default();
    for (index, (lines, place)) in traces.into_iter().enumerate() {
        let trace_sink = merge::MergeSink {
            inner: &mut sink,
            place: &place,
            first: index == 0,
        };
        let stats = Exporter::new(&filters, trace_sink).run(lines)?;
        total.add(&stats);
    }
    merge::finish(&mut sink, markers, &mut total)?;
    Ok(total)
}

/// `TRACE.jsonl` → `TRACE.json` / `TRACE.pftrace`.
fn default_output(trace: &Path, format: ExportFormat) -> PathBuf {
    trace.with_extension(format.extension())
}

/// `path` for writing (`-`: stdout), as `user` (the invoking user under sudo); never over
/// `trace` (`output_file`).
fn open_output<'a>(
    path: &Path,
    trace: &File,
    user: Option<&'a TargetUser>,
) -> Result<Output<'a>, Failure> {
    let inputs: Vec<Input> = Input::of_file("the trace being exported", trace)
        .into_iter()
        .collect();
    Writer { user }
        .output(path, &inputs)
        .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))
}

fn window_ns(ms: Option<f64>, flag: &str) -> Result<Option<u64>, Failure> {
    match ms {
        None => Ok(None),
        Some(ms) if ms.is_finite() && ms >= 0.0 => Ok(Some((ms * 1e6).round() as u64)),
        Some(ms) => Err(Failure::new(
            ExitCode::Usage,
            anyhow!("{flag} {ms}: give milliseconds since the trace start, 0 or more"),
        )),
    }
}

/// Runs `cudatrace export` and returns the exit code.
pub fn run(args: ExportArgs) -> Result<i32, Failure> {
    let filters = Filters {
        pids: args.pids.clone(),
        names: args.names.clone(),
        start_ns: window_ns(args.start_ms, "--start-ms")?,
        end_ns: window_ns(args.end_ms, "--end-ms")?,
        gpu_sample_us: args.gpu_sample_us,
    };
    if let (Some(start), Some(end)) = (filters.start_ns, filters.end_ns)
        && start > end
    {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!("--start-ms is after --end-ms: the window is empty"),
        ));
    }
    if args.format == ExportFormat::Parquet {
        return run_parquet(&args, &filters);
    }
    let output = match &args.output {
        Some(output) => output.clone(),
        None if !is_stream(&args.trace) => default_output(&args.trace, args.format),
        None => {
            return Err(Failure::new(
                ExitCode::Usage,
                anyhow!(
                    "{} is not a file, so there is no name to write beside it: pass -o FILE \
                     (or -o - for standard output)",
                    args.trace.display()
                ),
            ));
        }
    };
    // Under sudo the export is the invoking user's, written with their permissions.
    let user = privileges::sudo_user();
    export_file(
        &args.trace,
        &output,
        args.format,
        &filters,
        args.skip_bad_lines,
        user.as_ref(),
    )?;
    Ok(0)
}

/// `cudatrace export --format parquet`: a folder of tables; SQL does what the timeline
/// filters do.
fn run_parquet(args: &ExportArgs, filters: &Filters) -> Result<i32, Failure> {
    if filters != &Filters::default() {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!(
                "--pid, --name, --start-ms and --end-ms cut the timeline formats; the Parquet \
                 tables hold the whole trace (select in SQL)"
            ),
        ));
    }
    let outdir = match &args.output {
        Some(output) if output == Path::new("-") => {
            return Err(Failure::new(
                ExitCode::Usage,
                anyhow!("-o -: Parquet tables are a folder, not a stream: pass -o OUTDIR"),
            ));
        }
        Some(output) => output.clone(),
        None if !is_stream(&args.trace) => default_output(&args.trace, ExportFormat::Parquet),
        None => {
            return Err(Failure::new(
                ExitCode::Usage,
                anyhow!(
                    "{} is not a file, so there is no name to write beside it: pass -o OUTDIR",
                    args.trace.display()
                ),
            ));
        }
    };
    let user = privileges::sudo_user();
    parquet::export(
        &args.trace,
        &outdir,
        args.force,
        args.skip_bad_lines,
        user.as_ref(),
    )?;
    Ok(0)
}

/// `cudatrace run --export FORMAT`: the trace just written, exported beside it
/// (`TRACE.json` or `TRACE.pftrace`) as `user`, who owns the trace. The trace is complete
/// whatever happens here, so a failure is a warning. Returns the export's path.
pub fn after_run(trace: &Path, format: ExportFormat, user: Option<&TargetUser>) -> Option<PathBuf> {
    let output = default_output(trace, format);
    let exported = match format {
        ExportFormat::Parquet => parquet::export(trace, &output, false, false, user).map(|_| ()),
        _ => export_file(trace, &output, format, &Filters::default(), false, user).map(|_| ()),
    };
    match exported {
        Ok(()) => Some(output),
        Err(failure) => {
            eprintln!(
                "cudatrace: warning: the trace is complete but exporting it failed: {:#}",
                failure.error
            );
            None
        }
    }
}

/// Exports `trace` to `output` (`-`: stdout) and says what was written on stderr.
pub fn export_file(
    trace: &Path,
    output: &Path,
    format: ExportFormat,
    filters: &Filters,
    skip_bad_lines: bool,
    user: Option<&TargetUser>,
) -> Result<ExportStats, Failure> {
    let label = trace.display().to_string();
    let input = TraceInput::open_trace(trace)?;
    let file = input.pass().map_err(ReadError::opening(&label))?;
    if output == trace {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!("the output would overwrite the trace {label}: pass -o"),
        ));
    }
    export_opened(file, &label, output, format, filters, skip_bad_lines, user)
}

/// As [`export_file`], the trace already open (`label` names it); the output is never
/// the trace's own file, whatever its path.
pub fn export_opened(
    file: File,
    label: &str,
    output: &Path,
    format: ExportFormat,
    filters: &Filters,
    skip_bad_lines: bool,
    user: Option<&TargetUser>,
) -> Result<ExportStats, Failure> {
    let started = Clock::now();
    // The writers gather their output in blocks of their own.
    let mut out = open_output(output, &file, user)?;
    let stats = export_lines(
        TraceLines::from_file_prepared(file, label, skip_bad_lines, no_escapes),
        &mut out,
        format,
        filters,
    )?;
    out.commit()
        .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))?;
    if stats.skipped_lines > 0 {
        eprintln!(
            "cudatrace: skipped {} malformed lines of {label}",
            stats.skipped_lines
        );
    }
    if let Some(cut) = &stats.cut_warning {
        eprintln!("cudatrace: warning: {cut}");
    }
    if stats.unknown_lines > 0 {
        eprintln!(
            "cudatrace: {} lines of types this version does not know were left out",
            stats.unknown_lines
        );
    }
    if stats.flows_dropped > 0 {
        eprintln!(
            "cudatrace: {} launches got no flow arrow: more than {} waited on one stream",
            stats.flows_dropped,
            flows::MAX_PENDING_PER_STREAM
        );
    }
    if stats.layer_launches_without_kernel > 0 {
        eprintln!(
            "cudatrace: {} launches of Python layer entries had no kernel when their entry \
             was drawn: their layers' gpu_ns leaves those out",
            stats.layer_launches_without_kernel
        );
    }
    if stats.call_samples + stats.gpu_samples > 0 {
        eprintln!(
            "cudatrace: stack samples: {} calls, {} of GPU time (a sample per {} µs; {} ns of \
             GPU time below a whole sample per thread and stack)",
            stats.call_samples,
            stats.gpu_samples,
            filters.gpu_sample_ns() / 1_000,
            stats.gpu_ns_unsampled
        );
    }
    let destination = Output::describe(output);
    eprintln!(
        "cudatrace: wrote {destination} ({}): {} slices, {} counter values, {} flows, {} markers{} in {:.2} s",
        format.label(),
        stats.slices,
        stats.counters,
        stats.flows,
        stats.instants,
        match stats.filtered {
            0 => String::new(),
            n => format!(", {n} events filtered out"),
        },
        started.elapsed().as_secs_f64()
    );
    Ok(stats)
}

#[cfg(test)]
mod tests;
