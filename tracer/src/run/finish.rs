//! Finishing a run, whatever happened: the footer (also after a failure: a trace opened
//! always ends with one), the closing report, `--export`, the exit code.

use std::{path::Path, time::SystemTime};

use anyhow::anyhow;

use super::{
    Traced,
    loss::LossFigures,
    outcome::Outcome,
    output::Trace,
    prepare::Command,
    report::{self, Closing, ReportFlags},
    signals::take_stop_signal,
    window,
};
use crate::{
    analysis::Report,
    exit::{ExitCode, Failure},
    export::ExportFormat,
    schema::{Footer, GpuFooter, PowerFooter, StacksFooter, StopFigures, WindowFooter},
};

/// What finishing is asked for, from the flags.
pub struct FinishOptions {
    /// `--export`.
    pub export: Option<ExportFormat>,
    pub report: ReportFlags,
}

/// What tracing counted, each stage its own figures: the footer is built from them, here.
#[derive(Default)]
pub struct Figures {
    pub loss: LossFigures,
    /// How long the processes were stopped for attaching.
    pub stops: StopFigures,
    /// `--power`: the sampler's, once it ended.
    pub power: Option<PowerFooter>,
    /// Records the decoder could not decode.
    pub undecodable: u64,
    pub stacks: Option<StacksFooter>,
    pub window: Option<WindowFooter>,
}

/// Completes the trace with its footer, reports, exports, and returns the exit code (or
/// the failure that ended tracing).
pub fn finish(
    options: &FinishOptions,
    command: Command,
    trace: Trace,
    traced: Result<Traced, Failure>,
    figures: Figures,
) -> Result<i32, Failure> {
    let Trace {
        mut writer,
        label,
        analysis,
        started,
    } = trace;
    let (exit, loaded_any, running, error) = match traced {
        Ok(traced) => (traced.outcome, traced.loaded_any, traced.running, None),
        Err(failure) => (Outcome::failed(), false, None, Some(failure)),
    };
    let end_wall = humantime::format_rfc3339_nanos(SystemTime::now()).to_string();
    let duration_ns = started.elapsed().as_nanos() as u64;
    let gpu = analysis.gpu_footer();
    let report = analysis.finish();
    let ending = Ending {
        end_wall,
        duration_ns,
        exit,
        error: error.as_ref().map(|f| format!("{:#}", f.error)),
    };
    writer.footer = footer(&mut writer.footer, figures, ending, &report, gpu);
    let written = writer
        .finish()
        .map_err(|e| Failure::new(ExitCode::OutputNotWritable, anyhow!("writing {label}: {e}")))?;
    let footer = written.footer;
    if let Some(failure) = error {
        return Err(failure);
    }
    report::print(
        options.report,
        &Closing {
            footer: &footer,
            report: &report,
            exit,
            loaded_any,
            output_label: &label,
        },
    );
    export(options.export, &label, &command);
    let exit = match running {
        Some(pid) => wait_for_command(pid, options.report.quiet)?,
        None => exit,
    };
    if let Some(failed) = written.failed {
        // Said at once when it happened; the command ran on to its end untraced.
        return Err(Failure::new(
            ExitCode::OutputNotWritable,
            anyhow!(
                "writing {label} failed ({failed}); the trace ends where it could be written, \
                 with a footer counting {} missing lines{}",
                footer.lost.unwritten.unwrap_or(0),
                exit.describe()
            ),
        ));
    }
    let code = exit.process_exit_code();
    // Dropping the injection removes its directory; the command is gone by now.
    drop(command.gpu);
    Ok(gpu_exit_code(code, &footer))
}

/// How the run ended, as the footer says it.
struct Ending {
    end_wall: String,
    duration_ns: u64,
    exit: Outcome,
    /// The failure that ended tracing, in full.
    error: Option<String>,
}

/// The footer: the writer's counts of the lines it wrote (`written`, taken), the stages'
/// figures, how the run ended, and the analysis's memory and GPU figures.
fn footer(
    written: &mut Footer,
    figures: Figures,
    ending: Ending,
    report: &Report,
    gpu: Option<GpuFooter>,
) -> Footer {
    let Figures {
        loss,
        stops,
        power,
        undecodable,
        stacks,
        window,
    } = figures;
    Footer {
        tag: Default::default(),
        end_wall: ending.end_wall,
        duration_ns: ending.duration_ns,
        events: std::mem::take(&mut written.events),
        calls_by_name: std::mem::take(&mut written.calls_by_name),
        lost: loss.lost,
        entries_seen: loss.entries_seen,
        unmatched_returns: loss.unmatched_returns,
        abandoned_calls: loss.abandoned_calls,
        stops,
        undecodable,
        exit_code: ending.exit.code,
        exit_signal: ending.exit.signal,
        stopped_by: ending.exit.stopped_by,
        error: ending.error,
        memory: Some(report.memory_footer()),
        power,
        gpu,
        stacks,
        window,
    }
}

/// `--export`, beside the trace.
fn export(format: Option<ExportFormat>, label: &str, command: &Command) {
    match (format, label == "stdout") {
        (Some(_), true) => eprintln!("cudatrace: --export needs a trace file, not -o -"),
        (Some(format), false) => {
            // Written as the invoking user, as the trace was.
            crate::export::after_run(Path::new(label), format, command.user.as_ref());
        }
        (None, _) => {}
    }
}

/// The window closed: the trace is complete; the command goes on as if untraced, its
/// parent waiting (whatever became of the trace). Returns how it ended.
fn wait_for_command(pid: u32, quiet: bool) -> Result<Outcome, Failure> {
    if !quiet {
        eprintln!("cudatrace: the window closed; waiting for the command (pid {pid}) to exit");
    }
    let (code, signal) = window::wait_for_command(pid, take_stop_signal)
        .map_err(|e| Failure::new(ExitCode::Internal, e))?;
    Ok(Outcome {
        code,
        signal,
        ..Outcome::default()
    })
}

/// `--gpu`: GPU recording that failed in a process turns a command's 0 into its own code.
fn gpu_exit_code(code: i32, footer: &Footer) -> i32 {
    match footer.gpu.as_ref().map(|gpu| gpu.fatal_errors) {
        Some(fatal) if fatal > 0 && code == 0 => {
            eprintln!(
                "cudatrace: GPU recording failed in {} (see the gpu_error lines): exit code {}",
                crate::format::plural(fatal, "process"),
                ExitCode::GpuRecordingFailed as i32
            );
            ExitCode::GpuRecordingFailed as i32
        }
        _ => code,
    }
}
