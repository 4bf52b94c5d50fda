//! Where the trace goes: a file (by default `traces/trace_YYYYMMDD_HHMMSS.jsonl`, given to
//! the sudo user) or standard output; and the trace while it is written.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Result, anyhow};

use super::{
    output_name::{self, NameContext},
    prepare::Command,
};
use crate::{
    analysis::Analysis,
    exit::{ExitCode, Failure},
    output_file::{Input, Writer},
    power::PowerSetup,
    privileges::TargetUser,
    probes::discovery::FoundLibrary,
    sinks::jsonl::TraceWriter,
};

/// The trace while it is written: from its opening on, every way out completes it with a
/// footer.
pub struct Trace {
    pub writer: TraceWriter,
    /// Its name in messages (`stdout` for `-o -`).
    pub label: String,
    /// The enrich stage, which the footer and the closing report read at the end.
    pub analysis: Analysis,
    pub started: Instant,
}

impl Trace {
    /// Opens the trace at `output` (`-o`; written as `user`, never over one of `inputs`),
    /// its analysis knowing `--gpu` and `--power`.
    pub fn open(
        output: Option<&Path>,
        gpu: bool,
        user: Option<&TargetUser>,
        power: Option<&PowerSetup>,
        inputs: &[Input],
    ) -> Result<Self, Failure> {
        let requested = match output {
            Some(path) if path != Path::new("-") => Some(
                output_name::expand(path, &NameContext::current())
                    .map_err(|e| Failure::new(ExitCode::Usage, anyhow!(e)))?,
            ),
            other => other.map(Path::to_path_buf),
        };
        let (writer, label) = open_output(requested.as_deref(), user, inputs)
            .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))?;
        let started = Instant::now();
        let mut analysis = if gpu {
            Analysis::with_gpu_linking()
        } else {
            Analysis::default()
        };
        if let Some(setup) = power {
            analysis.power_header(&setup.info);
        }
        Ok(Trace {
            writer,
            label,
            analysis,
            started,
        })
    }
}

/// The files the trace must not overwrite: the libraries probed from the start, the
/// command itself, `--gpu`'s libcupti and `--power`'s NVML.
pub fn inputs(
    libraries: &[FoundLibrary],
    command: &Command,
    power: Option<&PowerSetup>,
) -> Vec<Input> {
    let mut inputs: Vec<Input> = libraries
        .iter()
        .filter_map(|found| {
            let what = format!("{}, a library this run probes", found.set.library);
            Input::of_file(what, &found.file)
        })
        .collect();
    let program = command.program.as_deref();
    inputs.extend(program.and_then(|path| Input::of("the traced command", path)));
    let cupti = command.gpu.as_ref().map(|gpu| gpu.cupti.path.as_path());
    inputs.extend(cupti.and_then(|path| Input::of("--gpu's libcupti", path)));
    if let Some(power) = power {
        let nvml = Path::new(&power.info.nvml.path);
        inputs.extend(Input::of("--power's NVML library", nvml));
    }
    inputs
}

/// The trace's destination and its name in messages (`stdout` for `-o -`). Under sudo the
/// file (and a `traces/` folder made for it) is created as the invoking user
/// (`output_file`); none of `inputs` is overwritten.
fn open_output(
    requested: Option<&Path>,
    user: Option<&TargetUser>,
    inputs: &[Input],
) -> Result<(TraceWriter, String)> {
    if requested == Some(Path::new("-")) {
        let stdout = TraceWriter::new(Box::new(std::io::stdout()));
        return Ok((stdout, "stdout".into()));
    }
    let writer = Writer { user };
    let path = match requested {
        Some(path) => path.to_owned(),
        None => {
            let dir = PathBuf::from("traces");
            writer.create_dir(&dir)?;
            dir.join(default_trace_name())
        }
    };
    let file = writer.create(&path, inputs)?;
    Ok((TraceWriter::for_file(file), path.display().to_string()))
}

/// `trace_YYYYMMDD_HHMMSS.jsonl` in local time.
fn default_trace_name() -> String {
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r fills `tm` from `now`.
    unsafe { libc::localtime_r(&now, &mut tm) };
    format!(
        "trace_{:04}{:02}{:02}_{:02}{:02}{:02}.jsonl",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}
