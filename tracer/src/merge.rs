//! `cudatrace merge TRACE... -o job.pftrace`: one job's traces (one per node or rank) in
//! one timeline. The traces are read twice: first for the cross-rank analysis
//! (`analysis::ranks`: communicators, ranks, and the clock offsets fitted on the
//! collectives' kernel ends), then exported one after the other onto the job's clock
//! (`export::merge`).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    time::Instant as Clock,
};

use anyhow::anyhow;
use clap::Args;
use serde_json::json;

use crate::{
    analysis::ranks::{JobReport, analyse},
    exit::{ExitCode, Failure},
    export::{
        ExportFormat,
        merge::{ClockMarker, MAX_TRACES, TracePlace},
        merge_files,
    },
    format::format_ns,
    job_input::{self, JobFile},
    output_file::{Input, Output, Writer, is_stdout},
    privileges,
    reader::ReadError,
};

#[derive(Debug, Args)]
#[command(after_help = "\
Each trace's processes keep their names, prefixed by host and rank (HOST rank R/N: ...),
its GPUs by host; ids are kept apart so that two hosts' pid 4242 or GPU 0 stay two. The
clocks: each trace's CLOCK_MONOTONIC is put on wall time by its header, then, where
--gpu traces share collectives, moved so that the kernels of each collective end
together on every rank (a collective's last step completes on all ranks at once); each
trace's offset and its uncertainty are printed and marked on the cudatrace track at its
start. Traces with no collective in common stay on their wall clock (NTP's agreement).
Traces of different runs (their times apart by more than 1 s, or a communicator of
different sizes) are refused (exit 65): merge each run's traces on their own.

Examples:
  cudatrace merge traces/node0.jsonl traces/node1.jsonl -o job.pftrace
  cudatrace merge --job traces/ -o job.json")]
pub struct MergeArgs {
    /// The JSONL traces of one job (one per node or rank).
    #[arg(value_name = "TRACE", required_unless_present = "job")]
    pub traces: Vec<PathBuf>,

    /// Every *.jsonl file in DIR too.
    #[arg(long, value_name = "DIR")]
    pub job: Option<PathBuf>,

    /// The merged timeline: `.pftrace` (Perfetto protobuf) or `.json` (Trace Event JSON),
    /// or as --format says; `-` for standard output. Not inside --job's folder. A file is
    /// written whole or not at all: an earlier one stays as it was if the merge fails.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,

    /// The output's format (default: `chrome` for a `.json` output, else `perfetto`).
    #[arg(long, value_enum)]
    pub format: Option<ExportFormat>,

    /// Skip malformed lines (counted and reported) instead of failing with exit code 65.
    #[arg(long)]
    pub skip_bad_lines: bool,
}

/// An output inside the job's folder would be read as one of its traces next time (a
/// `.jsonl`) or sit among them: refused.
fn refuse_output_inside(output: &Path, job: &Path) -> Result<(), Failure> {
    if is_stdout(output) {
        return Ok(());
    }
    let folder = match output.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let (Ok(folder), Ok(job_folder)) = (folder.canonicalize(), job.canonicalize()) else {
        return Ok(()); // a folder that is not there holds no trace; the open says why
    };
    if folder.starts_with(&job_folder) {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!(
                "{} is inside the job folder {}: the merge would sit among the traces it \
                 was made of (and a later `summary --job` would read it): write it elsewhere",
                output.display(),
                job.display()
            ),
        ));
    }
    Ok(())
}

/// Runs `cudatrace merge` and returns the exit code.
pub fn run(args: MergeArgs) -> Result<i32, Failure> {
    let started = Clock::now();
    if let Some(dir) = &args.job {
        refuse_output_inside(&args.output, dir)?;
    }
    let mut paths = match &args.job {
        Some(dir) => job_input::files_in(dir)?,
        None => Vec::new(),
    };
    paths.extend(args.traces.iter().cloned());
    if paths.len() > MAX_TRACES {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!("{} traces: a merge takes {MAX_TRACES} at most", paths.len()),
        ));
    }
    let format = args
        .format
        .unwrap_or(match args.output.extension().and_then(|e| e.to_str()) {
            Some("json") => ExportFormat::Chrome,
            _ => ExportFormat::Perfetto,
        });
    if format == ExportFormat::Parquet {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!(
                "a job's Parquet tables need no merge: export each trace with --format \
                 parquet into a folder of its own, and query them together \
                 ('job/*/calls.parquet')"
            ),
        ));
    }
    let files = job_input::open(&paths)?;
    let traces = job_input::read(&files, args.skip_bad_lines)?;
    job_input::one_run(&traces, "merge each run's traces on their own")?;
    let report = analyse(&traces);
    for note in &report.notes {
        eprintln!("cudatrace: note: {note}");
    }
    let places = places(&files, &report);
    let markers = markers(&files, &report, &places);
    for marker in &markers {
        eprintln!("cudatrace: clock of {}: {}", marker.label, marker.text);
    }

    let inputs: Vec<Input> = files
        .iter()
        .filter_map(|file| Input::of("a trace being merged", &file.input.path()))
        .collect();
    // Under sudo the merge is the invoking user's, written with their permissions.
    let user = privileges::sudo_user();
    let mut out = Writer {
        user: user.as_ref(),
    }
    .output(&args.output, &inputs)
    .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))?;
    let mut passes = Vec::with_capacity(files.len());
    for (file, place) in files.iter().zip(places) {
        let pass = file.input.pass().map_err(ReadError::reading(&file.label))?;
        passes.push((pass, file.label.clone(), place));
    }
    let stats = merge_files(passes, &markers, &mut out, format, args.skip_bad_lines)?;
    out.commit()
        .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))?;
    eprintln!(
        "cudatrace: wrote {} ({}): {} traces, {} slices, {} counter values, {} flows, {} markers in {:.2} s",
        Output::describe(&args.output),
        format.label(),
        files.len(),
        stats.slices,
        stats.counters,
        stats.flows,
        stats.instants,
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}

/// Each trace's place: its shift onto the job's clock (time 0: the earliest start) and
/// its processes' ranks on their largest communicator.
fn places(files: &[JobFile], report: &JobReport) -> Vec<TracePlace> {
    let starts: Vec<i128> = files
        .iter()
        .zip(&report.traces)
        .map(|(file, trace)| {
            i128::from(file.header.start_wall_ns) + i128::from(trace.clock.offset_ns)
        })
        .collect();
    let zero = starts.iter().copied().min().unwrap_or(0);
    // (trace, pid) → (nranks, label) of its largest communicator.
    let mut ranks: HashMap<(usize, u32), (i32, String)> = HashMap::new();
    for comm in &report.communicators {
        let nranks = comm.nranks.unwrap_or(0);
        for rank in &comm.ranks {
            let Some(trace) = report.traces.iter().position(|t| t.file == rank.file) else {
                continue;
            };
            let label = match comm.nranks {
                Some(n) => format!("rank {}/{n}", rank.rank),
                None => format!("rank {}", rank.rank),
            };
            let entry = ranks
                .entry((trace, rank.pid))
                .or_insert((nranks, label.clone()));
            if nranks > entry.0 {
                *entry = (nranks, label);
            }
        }
    }
    files
        .iter()
        .enumerate()
        .map(|(index, file)| TracePlace {
            index,
            shift_ns: (starts[index] - zero) as u64,
            host: if file.header.host.is_empty() {
                Path::new(&file.label)
                    .file_name()
                    .map_or(file.label.clone(), |n| n.to_string_lossy().into_owned())
            } else {
                file.header.host.clone()
            },
            ranks: ranks
                .iter()
                .filter(|((trace, _), _)| *trace == index)
                .map(|((_, pid), (_, label))| (*pid, label.clone()))
                .collect(),
        })
        .collect()
}

/// The clock markers: one per trace, at its start.
fn markers<'a>(
    files: &'a [JobFile],
    report: &JobReport,
    places: &[TracePlace],
) -> Vec<ClockMarker<'a>> {
    files
        .iter()
        .zip(&report.traces)
        .zip(places)
        .map(|((file, trace), place)| {
            let clock = &trace.clock;
            let sign = if clock.offset_ns < 0 { "-" } else { "+" };
            let offset = format!("{sign}{}", format_ns(clock.offset_ns.unsigned_abs()));
            let text = match clock.method {
                "reference" => format!("{}: the reference clock", place.host),
                "collectives" => format!(
                    "{}: offset {offset} ± {} (fitted on {} collectives' kernel ends, to {})",
                    place.host,
                    clock.uncertainty_ns.map_or("?".into(), format_ns),
                    clock.collectives_used,
                    clock
                        .aligned_to
                        .map_or("?", |i| report.traces[i].file.as_str())
                ),
                _ => format!(
                    "{}: its wall clock (no --gpu collective shared with the others; NTP's \
                     agreement)",
                    place.host
                ),
            };
            let mut fields = serde_json::Map::new();
            fields.insert("host".into(), json!(place.host));
            fields.insert("offset_ns".into(), json!(clock.offset_ns));
            fields.insert("method".into(), json!(clock.method));
            fields.insert("collectives_used".into(), json!(clock.collectives_used));
            if let Some(uncertainty) = clock.uncertainty_ns {
                fields.insert("uncertainty_ns".into(), json!(uncertainty));
            }
            ClockMarker {
                label: &file.label,
                shift_ns: place.shift_ns,
                text,
                fields,
            }
        })
        .collect()
}
