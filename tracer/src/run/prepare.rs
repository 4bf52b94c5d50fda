//! Preparing a run, before any trace file exists, so that what can fail early does: the
//! library files probed from the start (and `--missing-probes` on them), NVML for
//! `--power`, who the command runs as and its path, `--gpu`'s injection library.

use std::{ffi::OsString, path::PathBuf};

use anyhow::anyhow;

use super::missing;
use crate::{
    exit::{ExitCode, Failure},
    inject::{self, GpuInjection},
    power::PowerSetup,
    privileges::{self, TargetUser},
    probes::{
        discovery::{Found, FoundLibrary},
        library::{self, Library, LibraryError},
        plan::{FunctionSelection, MissingProbes, Plan},
        probe_set::{INJECTION, LIBCUDA, PROBE_SETS},
    },
    spawn,
};

/// What preparing is asked for, read from the flags (`run::run`).
pub struct PrepareOptions {
    /// `--libcuda`.
    pub libcuda: Option<PathBuf>,
    /// `--lib`.
    pub libs: Vec<PathBuf>,
    /// `--functions`: what the libraries probed from the start are checked for.
    pub functions: FunctionSelection,
    pub missing_probes: MissingProbes,
    /// `--power`'s period, in milliseconds, and `--nvml`.
    pub power: Option<u32>,
    pub nvml: Option<PathBuf>,
    /// `--as-root`: the command runs as root even under sudo.
    pub as_root: bool,
    /// The command's program, as given (its first word).
    pub program: Option<OsString>,
    /// `--gpu`, and `--cupti`.
    pub gpu: bool,
    pub cupti: Option<PathBuf>,
    /// `-p`: with `--gpu`, the processes the library is put into.
    pub pids: Vec<u32>,
}

/// What the run prepared.
pub struct Prepared {
    /// The library files probed from the start.
    pub libraries: Vec<FoundLibrary>,
    /// `--power`: NVML started, its sampler not yet.
    pub power: Option<PowerSetup>,
    pub command: Command,
}

/// The command, who runs it, and what goes into it: kept until the run ends.
pub struct Command {
    /// The resolved path (`None` for `-p` and `--all`).
    pub program: Option<PathBuf>,
    /// Who the command runs as and who gets the trace: the sudo user, unless `--as-root`.
    pub user: Option<TargetUser>,
    /// `--gpu`: the injection library (its directory goes when this is dropped) and
    /// libcupti.
    pub gpu: Option<GpuInjection>,
}

/// Prepares the run; every failure here happens before the trace file exists.
pub fn prepare(options: &PrepareOptions) -> Result<Prepared, Failure> {
    let mut libraries = start_libraries(options)?;
    // NVML is started before anything else happens, so its absence stops the run early.
    let power = match options.power {
        Some(period_ms) => Some(
            PowerSetup::prepare(options.nvml.as_deref(), period_ms).map_err(|why| {
                Failure::new(
                    ExitCode::NoNvml,
                    anyhow!("--power: {why}; pass --nvml PATH, or run without --power"),
                )
            })?,
        ),
        None => None,
    };
    let user = if options.as_root {
        None
    } else {
        privileges::sudo_user()
    };
    let program = match &options.program {
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
    let gpu = match options.gpu {
        true if !options.pids.is_empty() => {
            // The library's probes are attached as it goes into each process (`start.rs`).
            Some(inject::prepare_late(
                options.cupti.as_deref(),
                &options.pids,
            )?)
        }
        true => {
            let env = privileges::command_env(user.as_ref());
            let injection = inject::prepare(
                options.cupti.as_deref(),
                program.as_deref(),
                &env,
                user.as_ref(),
            )?;
            libraries.push(injection_library(&injection)?);
            Some(injection)
        }
        false => None,
    };
    Ok(Prepared {
        libraries,
        power,
        command: Command { program, user, gpu },
    })
}

/// `--gpu`: the injection library as written for this run, a library like any other.
fn injection_library(injection: &GpuInjection) -> Result<FoundLibrary, Failure> {
    let internal = |e| Failure::new(ExitCode::Internal, e);
    let found = FoundLibrary::open(&INJECTION, injection.library_path(), Found::Written)
        .map_err(internal)?;
    // Probed for its catalog alone: `--functions` is libcuda's.
    let plan = Plan::new(&INJECTION, &found.library, 0, &FunctionSelection::default());
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
fn start_libraries(options: &PrepareOptions) -> Result<Vec<FoundLibrary>, Failure> {
    let unusable = |e: anyhow::Error| Failure::new(ExitCode::NoLibcuda, e);
    let mut found = Vec::new();
    if let Some(path) = &options.libcuda {
        let path = library::find(&LIBCUDA, Some(path)).map_err(|e| unusable(e.into()))?;
        found.push(FoundLibrary::open(&LIBCUDA, &path, Found::Explicit).map_err(unusable)?);
    }
    for path in &options.libs {
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
        check_plan(options, library)?;
    }
    Ok(found)
}

/// `--missing-probes` on a library planned at start; one that exports none of its
/// functions is an error.
fn check_plan(options: &PrepareOptions, found: &FoundLibrary) -> Result<(), Failure> {
    let plan = Plan::new(found.set, &found.library, 0, &options.functions);
    if !plan.unmatched_globs.is_empty() {
        missing::apply(
            options.missing_probes,
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
        missing::apply(
            options.missing_probes,
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
