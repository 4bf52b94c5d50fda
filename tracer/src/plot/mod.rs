//! `cudatrace plot TRACE.jsonl`: a static timeline picture for reports.
//!
//! The trace is read twice: first through `cudatrace summary`'s own analysis (so every
//! figure in the picture is the summary's), then to bin the calls (and `--gpu` work) into
//! pixel columns.
//! Memory is that of the summary plus the bins, whatever the trace's length.

mod args;
mod bins;
mod canvas;
mod content;
mod png;
mod svg;
mod tables;
mod theme;

use std::{
    io::BufRead,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::anyhow;

pub use self::args::PlotArgs;
use self::{
    bins::{Bins, Columns},
    content::Plot,
};
use crate::{
    analysis::{
        Analysis, Report,
        families::Families,
        summarise::{TraceInfo, summarise},
    },
    exit::{ExitCode, Failure},
    output_file::{Input, Output, Writer},
    privileges,
    reader::{ReadError, TraceLines, cut_warning},
    schema::{Line, ProcessMemory},
    trace_input::{TraceInput, is_stream},
};

/// The picture of a trace, and what went into it.
pub struct Rendered {
    pub svg: String,
    pub info: TraceInfo,
    pub report: Report,
}

/// Reads the trace at `path` twice (a pipe's bytes are kept for the second pass) and
/// draws it `width` CSS pixels wide.
#[cfg(test)]
pub fn render(
    path: &Path,
    label: &str,
    width: u32,
    skip_bad_lines: bool,
) -> Result<Rendered, ReadError> {
    let input = TraceInput::open(path).map_err(|e| ReadError::Open {
        file: label.to_owned(),
        error: std::io::Error::other(e.to_string()),
    })?;
    render_input(&input, label, width, skip_bad_lines)
}

/// As [`render`], the trace opened (`trace_input`: read twice, a pipe copied first).
pub fn render_input(
    input: &TraceInput,
    label: &str,
    width: u32,
    skip_bad_lines: bool,
) -> Result<Rendered, ReadError> {
    let open = || {
        input
            .pass()
            .map(|file| TraceLines::from_file(file, label, skip_bad_lines))
            .map_err(ReadError::reading(label))
    };
    let summarised = summarise(open)?;
    let summary = &summarised.report.summary;
    let gpu = &summarised.report.gpu;
    let plot_width = f64::from(width) - theme::MARGIN_LEFT_PX - theme::MARGIN_RIGHT_PX;
    // A --gpu trace's run spans its GPU work too.
    let (t0, span) = if gpu.work > gpu.untimed {
        (gpu.run_start_ns, gpu.run_ns)
    } else {
        (summary.first_ts_ns, summary.span_ns)
    };
    let columns = Columns::new(t0, span, plot_width as usize);
    let bins = bin(open()?, columns, &summarised.report)?;
    let svg = svg::draw(
        &Plot {
            info: &summarised.info,
            report: &summarised.report,
            bins: &bins,
        },
        width,
    );
    Ok(Rendered {
        svg,
        info: summarised.info,
        report: summarised.report,
    })
}

/// The second pass: every call into its family's lane, device bytes into the curves of
/// the processes with the highest peaks.
fn bin(
    mut lines: TraceLines<impl BufRead>,
    columns: Columns,
    report: &Report,
) -> Result<Bins, ReadError> {
    let mut peaks: Vec<&ProcessMemory> = report.memory.iter().collect();
    peaks.sort_by_key(|m| (std::cmp::Reverse(m.peak_device_bytes), m.pid));
    let mut pids: Vec<u32> = Vec::new();
    for memory in peaks {
        if memory.peak_device_bytes > 0 && !pids.contains(&memory.pid) {
            pids.push(memory.pid);
        }
    }
    pids.truncate(theme::MEMORY_CURVES);

    let gpus: Vec<u32> = report.gpu.devices.iter().map(|d| d.device).collect();
    let mut bins = Bins::new(columns, &pids, &gpus);
    let mut families = Families::default();
    // Traces written before kernel names and live bytes existed get them here.
    let mut analysis = Analysis::default();
    while let Some(line) = lines.next_line()? {
        match line {
            Line::Header(header) => families = Families::from_header(header),
            Line::Library(library) => families.add_library(library),
            Line::Call(record) => {
                analysis.annotate(record);
                // A call probed at entry alone counts, and takes no time.
                bins.call(
                    families.of(&record.name),
                    record.ts_ns,
                    record.dur_or_zero(),
                );
                if let Some(bytes) = record.live_bytes {
                    let end = record.ts_ns.saturating_add(record.dur_or_zero());
                    bins.memory(record.pid, end, bytes);
                }
            }
            Line::Process(process) => analysis.process_event(process.pid, process.event.clone()),
            Line::Power(power) => {
                if let Some(mw) = power.best_power_mw() {
                    bins.power(power.device, power.ts_ns, mw);
                }
            }
            Line::Gpu(gpu) => {
                if let Some(work) = gpu.work()
                    && work.link.timed()
                {
                    bins.gpu(work.device, work.ts_ns, work.dur_ns);
                }
            }
            Line::Lost(_)
            | Line::Driver(_)
            | Line::Stack(_)
            | Line::Interpreter(_)
            | Line::Footer(_)
            | Line::Unknown => {}
        }
    }
    Ok(bins)
}

fn default_output(trace: &Path) -> PathBuf {
    trace.with_extension("svg")
}

/// Runs `cudatrace plot` and returns the exit code.
pub fn run(args: PlotArgs) -> Result<i32, Failure> {
    let started = Instant::now();
    let label = args.trace.display().to_string();
    let output = match &args.output {
        Some(output) => output.clone(),
        None if !is_stream(&args.trace) => default_output(&args.trace),
        None => {
            return Err(Failure::new(
                ExitCode::Usage,
                anyhow!(
                    "{label} is not a file, so there is no name to write beside it: pass -o FILE"
                ),
            ));
        }
    };
    let as_png = output
        .extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case("png"));
    let input = TraceInput::open_trace(&args.trace)?;
    let rendered = render_input(&input, &label, args.width, args.skip_bad_lines)?;
    if rendered.info.skipped_lines > 0 {
        eprintln!(
            "cudatrace: skipped {} malformed lines of {label}",
            rendered.info.skipped_lines
        );
    }
    if !rendered.info.complete {
        eprintln!("cudatrace: warning: {label} has no footer (the trace was cut short)");
    }
    if let Some(line) = rendered.info.cut_line {
        eprintln!("cudatrace: warning: {}", cut_warning(&label, line));
    }
    let bytes = if as_png {
        let png = png::rasterise(&rendered.svg).map_err(|e| Failure::new(ExitCode::Internal, e))?;
        if !png.fonts {
            eprintln!(
                "cudatrace: warning: no system fonts found: the PNG has no text (write .svg, \
                 or install fonts-dejavu-core)"
            );
        }
        png.data
    } else {
        rendered.svg.into_bytes()
    };
    // Under sudo the picture is the invoking user's, written with their permissions.
    let user = privileges::sudo_user();
    let inputs: Vec<Input> = Input::of("the trace being plotted", &args.trace)
        .into_iter()
        .collect();
    Writer {
        user: user.as_ref(),
    }
    .write_output(&output, &inputs, &bytes)
    .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))?;
    eprintln!(
        "cudatrace: wrote {} ({} calls, {:.2} s)",
        Output::describe(&output),
        rendered.report.summary.calls,
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}

#[cfg(test)]
mod tests;
