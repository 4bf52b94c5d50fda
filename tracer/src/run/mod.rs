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

use self::{clock::Clocks, outcome::Outcome, output::open_output, session::Session};
use crate::{
    analysis::Analysis,
    exit::{ExitCode, Failure},
    privileges,
    probes::{
        discovery::{Found, FoundLibrary},
        library::{self, Library, LibraryError},
        plan::Plan,
        probe_set::{LIBCUDA, PROBE_SETS},
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
    let libraries = start_libraries(&args)?;
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
        start: libraries,
        user: user.as_ref(),
        program,
        clocks: Clocks::now(),
        kernel_hooks: None,
        planned: Default::default(),
        attach: Default::default(),
        loaded_any: false,
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
    let loaded_any = session.loaded_any;
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
    if lost > 0 {
        eprintln!(
            "cudatrace: WARNING: {lost} events lost (calls: ring full {}, nesting {}, frame \
             table {}; process events {}); try --ring-kib {}",
            footer.lost.ring_full,
            footer.lost.too_deep,
            footer.lost.frames_full,
            footer.lost.process_ring_full,
            args.ring_kib.saturating_mul(4).min(1 << 20)
        );
    }
    if footer.abandoned_calls > 0 {
        eprintln!(
            "cudatrace: {} calls never returned (longjmp or an exception through the library): \
             they have no line",
            footer.abandoned_calls
        );
    }
    if !loaded_any {
        eprintln!(
            "cudatrace: WARNING: no traced process loaded {}: nothing to trace. Does the \
             program use the GPU? A library under another name can be given with --lib PATH",
            PROBE_SETS
                .iter()
                .map(|set| set.library)
                .collect::<Vec<_>>()
                .join(" or ")
        );
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

/// The library files probed from the start: `--libcuda`, `--lib`, and for each probe set
/// given no file, the one the default search finds (none is no error: libraries are also
/// found as the traced processes load them). `--missing-probes` applies to each; a file
/// given by path that cannot be used is an error.
fn start_libraries(args: &RunArgs) -> Result<Vec<FoundLibrary>, Failure> {
    let unusable = |e: anyhow::Error| Failure::new(ExitCode::NoLibcuda, e);
    let mut found = Vec::new();
    if let Some(path) = &args.libcuda {
        let path = library::find(&LIBCUDA, Some(path)).map_err(|e| unusable(e.into()))?;
        found.push(FoundLibrary::open(&LIBCUDA, &path, Found::Explicit).map_err(unusable)?);
    }
    for path in &args.libs {
        let file = std::fs::File::open(path)
            .map_err(|e| unusable(LibraryError::LibUnreadable(path.clone(), e).into()))?;
        let set = library::identify(&file, path).map_err(|e| unusable(e.into()))?;
        let library = Library::read(set, &file, path).map_err(|e| unusable(e.into()))?;
        found.push(FoundLibrary {
            set,
            library,
            file,
            found: Found::Explicit,
            pid: None,
            ts_ns: None,
        });
    }
    for set in PROBE_SETS {
        if found.iter().any(|f| std::ptr::eq(f.set, *set)) {
            continue;
        }
        if let Ok(path) = library::find(set, None)
            && let Ok(library) = FoundLibrary::open(set, &path, Found::Search)
        {
            found.push(library);
        }
    }
    for library in &found {
        check_plan(args, library)?;
    }
    Ok(found)
}

/// `--missing-probes` on a library planned at start; one that exports none of its
/// functions is an error.
fn check_plan(args: &RunArgs, found: &FoundLibrary) -> Result<(), Failure> {
    let plan = Plan::new(found.set, &found.library, 0, 0);
    if !plan.missing.is_empty() {
        args.missing_probes.apply(
            &format!("not exported by {}", plan.set.library),
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
    Ok(())
}
