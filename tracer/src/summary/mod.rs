//! `cudatrace summary TRACE.jsonl`: read a trace back and print what it means.

use std::{
    collections::{BTreeSet, HashMap},
    io::Write,
    path::PathBuf,
};

use anyhow::anyhow;

mod args;
mod power;
pub mod text;

pub use args::SummaryArgs;

use crate::{
    analysis::{
        nccl::CollectivesSummary,
        ranks::{JobReport, JobTrace, analyse, runs},
        summarise::summarise,
    },
    exit::{ExitCode, Failure},
    job_input::{self, JobFile},
    reader::{ReadError, TraceLines, cut_warning},
    trace_input::{TraceInput, empty_note},
};

use self::text::{SummaryJson, render_communicators, render_job, render_text};

/// Runs `cudatrace summary` and returns the exit code.
pub fn run(args: SummaryArgs) -> Result<i32, Failure> {
    let mut paths = match &args.job {
        Some(dir) => job_input::files_in(dir)?,
        None => Vec::new(),
    };
    paths.extend(args.traces.iter().cloned());
    if paths.len() > 1 {
        return job(&args, &paths);
    }
    let path = &paths[0];
    let label = path.display().to_string();
    // A `--gpu` trace is read twice: a pipe is copied first (`trace_input`).
    let input = TraceInput::open_trace(path)?;
    let empty = input.is_empty();
    let open = || {
        let file = input.pass().map_err(ReadError::reading(&label))?;
        Ok(TraceLines::from_file(file, &label, args.skip_bad_lines))
    };
    let result = summarise(open)?;

    for (line, message) in &result.skipped {
        eprintln!("cudatrace: skipped {label}:{line}: {message}");
    }
    if result.info.skipped_lines > result.skipped.len() as u64 {
        eprintln!(
            "cudatrace: skipped {} malformed lines in all",
            result.info.skipped_lines
        );
    }
    if empty {
        eprintln!("cudatrace: note: {}", empty_note(&label));
    } else if !result.info.complete {
        eprintln!(
            "cudatrace: warning: {label} has no footer (the trace was cut short); \
             summarising the {} lines it has",
            result.info.lines
        );
    }
    if let Some(line) = result.info.cut_line {
        eprintln!("cudatrace: warning: {}", cut_warning(&label, line));
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
    for lost in &result.info.libraries_not_attached {
        eprintln!(
            "cudatrace: warning: {} was not attached{}: its calls are missing",
            lost.library,
            lost.pid
                .map_or(String::new(), |pid| format!(" in pid {pid}"))
        );
    }

    // Several ranks of one communicator in this trace: who waited for whom among them.
    let ranks = if several_ranks(&result.report.collectives) {
        ranks_of_one(&label, input, args.skip_bad_lines)?
    } else {
        None
    };
    let text = if args.json {
        let stacks = result
            .report
            .stacks
            .as_ref()
            .map(|profile| profile.summary());
        let json = SummaryJson {
            ranks: ranks.as_ref(),
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
        let mut text = render_text(&result.info, &result.report);
        if let Some(ranks) = &ranks {
            render_communicators(&mut text, ranks);
        }
        text
    };
    print(&text)
}

/// Whether a communicator has two ranks or more in the trace.
fn several_ranks(collectives: &CollectivesSummary) -> bool {
    let mut ranks: HashMap<&str, BTreeSet<i32>> = HashMap::new();
    for row in &collectives.rows {
        if let Some(rank) = row.rank {
            ranks.entry(&row.communicator).or_default().insert(rank);
        }
    }
    ranks.values().any(|ranks| ranks.len() > 1)
}

/// The cross-rank report of a single trace (its own clock: nothing to align); none when
/// its header has no clocks (hand-written traces).
fn ranks_of_one(
    label: &str,
    input: TraceInput,
    skip_bad_lines: bool,
) -> Result<Option<JobReport>, Failure> {
    let file = match JobFile::new(label.to_owned(), input) {
        Ok(file) => file,
        Err(failure) => {
            eprintln!("cudatrace: no cross-rank section: {:#}", failure.error);
            return Ok(None);
        }
    };
    let traces = job_input::read(std::slice::from_ref(&file), skip_bad_lines)?;
    Ok(Some(analyse(&traces)))
}

/// `cudatrace summary A B ...`: the job's cross-rank report alone.
fn job(args: &SummaryArgs, paths: &[PathBuf]) -> Result<i32, Failure> {
    let files = job_input::open(paths)?;
    let traces = job_input::read(&files, args.skip_bad_lines)?;
    if args.separate_runs {
        return separate_runs(args, traces);
    }
    job_input::one_run(
        &traces,
        "pass --separate-runs to summarise each run on its own",
    )?;
    let report = analyse(&traces);
    for note in &report.notes {
        eprintln!("cudatrace: note: {note}");
    }
    let text = if args.json {
        let mut text = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::new(ExitCode::Internal, e))?;
        text.push('\n');
        text
    } else {
        render_job(&report)
    };
    print(&text)
}

/// `--separate-runs`: the traces grouped into runs (`analysis::ranks::runs`), each
/// analysed on its own.
fn separate_runs(args: &SummaryArgs, traces: Vec<JobTrace>) -> Result<i32, Failure> {
    let groups = runs(&traces);
    let mut traces: Vec<Option<JobTrace>> = traces.into_iter().map(Some).collect();
    let reports: Vec<JobReport> = groups
        .iter()
        .map(|group| {
            let run: Vec<JobTrace> = group.iter().filter_map(|&i| traces[i].take()).collect();
            analyse(&run)
        })
        .collect();
    for (number, report) in reports.iter().enumerate() {
        for note in &report.notes {
            eprintln!("cudatrace: note: run {}: {note}", number + 1);
        }
    }
    let text = if args.json {
        let mut text = serde_json::to_string_pretty(&serde_json::json!({ "runs": reports }))
            .map_err(|e| Failure::new(ExitCode::Internal, e))?;
        text.push('\n');
        text
    } else {
        let mut text = String::new();
        for (number, report) in reports.iter().enumerate() {
            if number > 0 {
                text.push('\n');
            }
            text.push_str(&format!("Run {} of {}\n", number + 1, reports.len()));
            text.push_str(&render_job(report));
        }
        text
    };
    print(&text)
}

fn print(text: &str) -> Result<i32, Failure> {
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
