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
//! | `power_feed.rs` | `--power`: the NVML sampler's lines into the pipeline |
//! | `clock.rs`, `outcome.rs` | the trace clock; how the command ended |
//! | `bpf_stats.rs` | `CUDATRACE_BPF_STATS=1`: the programs' run time and count (benchmarks) |
//!
//! `--gpu`'s set-up (libcupti, the injection library, the command's environment) is in
//! `crate::inject`; its records go down the same pipeline.

mod args;
mod bpf_stats;
pub(crate) mod clock;
mod event_loop;
mod header;
mod loss;
mod outcome;
mod output;
mod pipeline;
mod power_feed;
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
    inject::{self, GpuInjection},
    output_file::Input,
    power::{PowerSetup, sampler::describe_errors},
    privileges,
    probes::{
        discovery::{Found, FoundLibrary},
        library::{self, Library, LibraryError},
        plan::{FunctionSelection, Plan},
        probe_set::{INJECTION, LIBCUDA, PROBE_SETS},
    },
    schema::PowerFooter,
    sinks::jsonl::TraceWriter,
    spawn,
    summary::text::{render_gpu_short, render_short},
};

/// Runs `cudatrace run` and returns the process exit code.
pub fn run(args: RunArgs) -> Result<i32, Failure> {
    privileges::check().map_err(|e| Failure::new(ExitCode::NotPrivileged, e))?;
    bpf_stats::enable();
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
    if args.gpu {
        inject::check_usage(!args.command.is_empty(), &args.pids, args.all)?;
        // The command's environment is ours (with HOME/USER/LOGNAME changed under sudo).
        inject::check_environment(&privileges::command_env(None))?;
    }
    let mut libraries = start_libraries(&args)?;
    // NVML is started before anything else happens, so its absence stops the run early.
    let power = match args.power {
        Some(period_ms) => Some(
            PowerSetup::prepare(args.nvml.as_deref(), period_ms).map_err(|why| {
                Failure::new(
                    ExitCode::NoNvml,
                    anyhow!("--power: {why}; pass --nvml PATH, or run without --power"),
                )
            })?,
        ),
        None => None,
    };
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

    // `--gpu`: everything that can fail does so before the trace file exists.
    let gpu = match args.gpu {
        true => {
            let env = privileges::command_env(user.as_ref());
            let injection = inject::prepare(
                args.cupti.as_deref(),
                program.as_deref(),
                &env,
                user.as_ref(),
            )?;
            libraries.push(injection_library(&injection)?);
            Some(injection)
        }
        false => None,
    };

    let inputs = run_inputs(&libraries, program.as_deref(), gpu.as_ref(), power.as_ref());
    let (output, output_label) = open_output(args.output.as_deref(), user.as_ref(), &inputs)
        .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))?;
    let mut writer = TraceWriter::new(output);
    let started = Instant::now();

    // From here on every failure still completes the trace with a footer.
    let mut analysis = if args.gpu {
        Analysis::with_gpu_linking()
    } else {
        Analysis::default()
    };
    if let Some(setup) = &power {
        analysis.power_header(&setup.info);
    }
    let mut session = Session {
        power_info: power.as_ref().map(|setup| setup.info.clone()),
        power,
        args: &args,
        start: libraries,
        user: user.as_ref(),
        program,
        clocks: Clocks::now(),
        kernel_hooks: None,
        gpu: gpu.as_ref(),
        planned: Default::default(),
        attach: Default::default(),
        loaded_any: false,
    };
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
    writer.footer.gpu = analysis.gpu_footer();
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
    if let Some(reasons) = LossAccount::describe(&footer.lost) {
        // Only what the ring refused grows with a larger ring (not CUPTI's own drops).
        let ring_refused = footer.lost.ring_full
            + footer.lost.process_ring_full
            + footer.lost.driver_ring_full
            + footer.lost.gpu_ring_full.unwrap_or(0);
        let hint = if ring_refused > 0 {
            format!(
                "; try --ring-kib {}",
                args.ring_kib.saturating_mul(4).min(1 << 20)
            )
        } else {
            String::new()
        };
        eprintln!("cudatrace: WARNING: {lost} events lost ({reasons}){hint}");
    }
    if let Some(power) = &footer.power {
        warn_power(power);
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
                .filter(|set| !set.run_private)
                .map(|set| set.library)
                .collect::<Vec<_>>()
                .join(" or ")
        );
    }
    if !args.quiet {
        eprint!("{}", render_short(&report));
        if let Some(gpu) = &footer.gpu {
            eprint!("{}", render_gpu_short(&report.gpu, gpu));
        }
    }
    // Dropping the injection removes its directory; the command is gone by now.
    drop(gpu);
    match (args.export, output_label == "stdout") {
        (Some(_), true) => eprintln!("cudatrace: --export needs a trace file, not -o -"),
        (Some(format), false) => {
            // Written as the invoking user, as the trace was.
            crate::export::after_run(Path::new(&output_label), format, user.as_ref());
        }
        (None, _) => {}
    }
    let code = exit.process_exit_code();
    match footer.gpu.as_ref().map(|gpu| gpu.fatal_errors) {
        Some(fatal) if fatal > 0 && code == 0 => {
            eprintln!(
                "cudatrace: GPU recording failed in {} (see the gpu_error lines): exit code {}",
                crate::format::plural(fatal, "process"),
                ExitCode::GpuRecordingFailed as i32
            );
            Ok(ExitCode::GpuRecordingFailed as i32)
        }
        _ => Ok(code),
    }
}

/// The files the trace must not overwrite: the libraries probed from the start, libcupti,
/// NVML and the command itself.
fn run_inputs(
    libraries: &[FoundLibrary],
    program: Option<&Path>,
    gpu: Option<&GpuInjection>,
    power: Option<&PowerSetup>,
) -> Vec<Input> {
    let mut inputs: Vec<Input> = libraries
        .iter()
        .filter_map(|found| {
            let what = format!("{}, a library this run probes", found.set.library);
            Input::of_file(what, &found.file)
        })
        .collect();
    inputs.extend(program.and_then(|path| Input::of("the traced command", path)));
    inputs.extend(gpu.and_then(|gpu| Input::of("--gpu's libcupti", &gpu.cupti.path)));
    if let Some(power) = power {
        let nvml = Path::new(&power.info.nvml.path);
        inputs.extend(Input::of("--power's NVML library", nvml));
    }
    inputs
}

/// `--gpu`: the injection library as written for this run, a library like any other.
fn injection_library(injection: &GpuInjection) -> Result<FoundLibrary, Failure> {
    let internal = |e| Failure::new(ExitCode::Internal, e);
    let found = FoundLibrary::open(&INJECTION, injection.library_path(), Found::Written)
        .map_err(internal)?;
    // Probed for its catalog alone: `--functions` is libcuda's.
    let plan = Plan::new(
        &INJECTION,
        &found.library,
        0,
        0,
        &FunctionSelection::default(),
    );
    if plan.probes.is_empty() {
        return Err(Failure::new(
            ExitCode::Internal,
            anyhow!(
                "the injection library {} lacks {}: rebuild cudatrace",
                plan.library.path.display(),
                tracer_common::GPU_RECORDS_SYMBOL
            ),
        ));
    }
    Ok(found)
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
    for set in PROBE_SETS.iter().filter(|set| !set.run_private) {
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
    let plan = Plan::new(found.set, &found.library, 0, 0, &args.functions);
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
    Ok(())
}

/// `--power`: what the sampler could not do, on stderr (also in the footer and summary).
fn warn_power(power: &PowerFooter) {
    if let Some(error) = &power.error {
        eprintln!("cudatrace: WARNING: --power: {error}");
    }
    if !power.read_errors.is_empty() {
        eprintln!(
            "cudatrace: WARNING: --power: NVML errors while sampling (those fields are missing \
             from those samples): {}",
            describe_errors(&power.read_errors)
        );
    }
    if power.dropped_samples > 0 {
        eprintln!(
            "cudatrace: WARNING: --power: {} samples dropped: the event loop fell behind",
            power.dropped_samples
        );
    }
    if power.skipped_ticks > 0 {
        eprintln!(
            "cudatrace: --power: {} ticks skipped: reading NVML took longer than the period \
             (up to {} µs a GPU)",
            power.skipped_ticks,
            power.read_ns_max / 1000
        );
    }
}
