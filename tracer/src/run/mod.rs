//! `cudatrace run`: plan the libraries, open the trace, trace (`session.rs`), then finish
//! cleanly on every exit path: a footer, a closing report, the exit code.
//!
//! | file | |
//! |---|---|
//! | `args.rs` | the flags |
//! | `session.rs` | set-up: load, attach, spawn, header; then the event loop |
//! | `header.rs` | the header line |
//! | `output.rs` | the trace file (or stdout) |
//! | `event_loop.rs` | ring, exit, signals and ticks until tracing ends |
//! | `pipeline.rs` | source → decode → enrich → sinks, for each record |
//! | `loss.rs` | the kernel's drop counters as `lost` lines and footer figures |
//! | `clock.rs`, `outcome.rs` | the trace clock; how the command ended |

mod args;
mod clock;
mod event_loop;
mod header;
mod loss;
mod outcome;
mod output;
mod pipeline;
mod session;

pub use args::RunArgs;

use std::{
    path::Path,
    time::{Instant, SystemTime},
};

use anyhow::anyhow;

use self::{
    clock::Clocks, loss::LossAccount, outcome::Outcome, output::open_output, session::Session,
};
use crate::{
    analysis::Analysis,
    exit::{ExitCode, Failure},
    privileges,
    probes::{
        library::{self, Library},
        plan::Plans,
        probe_set::LIBCUDA,
    },
    sinks::jsonl::TraceWriter,
    spawn,
    summary::text::render_short,
};

/// Runs `cudatrace run` and returns the process exit code.
pub fn run(args: RunArgs) -> Result<i32, Failure> {
    privileges::check().map_err(|e| Failure::new(ExitCode::NotPrivileged, e))?;
    if args.command.is_empty() && args.pids.is_empty() && !args.all {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!("nothing to trace: give a command after --, -p PID, or --all"),
        ));
    }
    for pid in &args.pids {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(Failure::new(
                ExitCode::NoSuchProcess,
                anyhow!("no process with pid {pid}"),
            ));
        }
    }
    let plans = plan_libraries(&args)?;
    let user = if args.as_root {
        None
    } else {
        privileges::sudo_user()
    };
    let program = match args.command.first() {
        Some(program) => {
            let path_var = std::env::var_os("PATH");
            let resolved = spawn::resolve(program, path_var.as_deref()).map_err(|e| {
                let code = match e {
                    spawn::SpawnError::NotExecutable(_) => ExitCode::NotExecutable,
                    _ => ExitCode::CommandNotFound,
                };
                Failure::new(code, e)
            })?;
            Some(resolved)
        }
        None => None,
    };

    let (output, output_label) = open_output(args.output.as_deref(), user.as_ref())
        .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))?;
    let mut writer = TraceWriter::new(output);
    let started = Instant::now();

    // From here on every failure still completes the trace with a footer.
    let mut session = Session {
        args: &args,
        plans: &plans,
        user: user.as_ref(),
        program,
        clocks: Clocks::now(),
        kernel_hooks: None,
        probe_mechanism: String::new(),
        uprobe_multi_fallback: None,
    };
    let mut analysis = Analysis::default();
    let (exit, error) = match session.trace(&mut writer, &mut analysis) {
        Ok(exit) => (exit, None),
        Err(failure) => {
            if !writer.header_written() {
                let _ = writer.header(&session.header(&[], Vec::new()));
            }
            (Outcome::failed(), Some(failure))
        }
    };
    writer.footer.end_wall = humantime::format_rfc3339_nanos(SystemTime::now()).to_string();
    writer.footer.duration_ns = started.elapsed().as_nanos() as u64;
    writer.footer.exit_code = exit.code;
    writer.footer.exit_signal = exit.signal;
    writer.footer.stopped_by = exit.stopped_by;
    writer.footer.error = error.as_ref().map(|f| format!("{:#}", f.error));
    let report = analysis.finish();
    writer.footer.memory = Some(report.memory_footer());
    let footer = writer.finish().map_err(|e| {
        Failure::new(
            ExitCode::OutputNotWritable,
            anyhow!("writing {output_label}: {e}"),
        )
    })?;
    if let Some(failure) = error {
        return Err(failure);
    }
    let lost = footer.lost.total;
    eprintln!(
        "cudatrace: {} calls, {} lost, {} process events -> {output_label}{}",
        footer.events.call,
        lost,
        footer.events.process,
        exit.describe()
    );
    if let Some(reasons) = LossAccount::describe(&footer.lost) {
        let hint = if footer.lost.ring_full + footer.lost.process_ring_full > 0 {
            format!(
                "; try --ring-kib {}",
                args.ring_kib.saturating_mul(4).min(1 << 20)
            )
        } else {
            String::new()
        };
        eprintln!("cudatrace: WARNING: {lost} events lost ({reasons}){hint}");
    }
    if !args.quiet {
        eprint!("{}", render_short(&report));
    }
    match (args.export, output_label == "stdout") {
        (Some(_), true) => eprintln!("cudatrace: --export needs a trace file, not -o -"),
        (Some(format), false) => {
            let exported = crate::export::after_run(Path::new(&output_label), format);
            if let (Some(path), Some(user)) = (exported, user.as_ref()) {
                let _ = privileges::chown_to(&path, user);
            }
        }
        (None, _) => {}
    }
    Ok(exit.process_exit_code())
}

/// Finds libcuda and plans its probes; a function it lacks is reported by
/// `--missing-probes`, a library with none of them is an error.
fn plan_libraries(args: &RunArgs) -> Result<Plans, Failure> {
    let no_libcuda = |e| Failure::new(ExitCode::NoLibcuda, e);
    let path = library::find(&LIBCUDA, args.libcuda.as_deref()).map_err(no_libcuda)?;
    let library = Library::open(&LIBCUDA, &path).map_err(no_libcuda)?;
    let mut plans = Plans::default();
    let plan = plans.add(&LIBCUDA, &library, &args.functions);
    if !plan.unmatched_globs.is_empty() {
        args.missing_probes.apply(
            &format!(
                "patterns of --functions match no {} export",
                plan.set.library
            ),
            &plan
                .unmatched_globs
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )?;
    }
    if !plan.missing.is_empty() {
        args.missing_probes.apply(
            &format!("functions not exported by {}", plan.set.library),
            &plan.missing,
        )?;
    }
    if plan.probes.is_empty() {
        return Err(Failure::new(
            ExitCode::NoLibcuda,
            anyhow!(
                "{} exports none of the {} cudatrace probes",
                plan.library.path.display(),
                plan.set.functions
            ),
        ));
    }
    Ok(plans)
}
