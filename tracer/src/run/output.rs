//! Where the trace goes: a file (by default `traces/trace_YYYYMMDD_HHMMSS.jsonl`, given to
//! the sudo user) or standard output; and the trace while it is written.

use std::{
    fs::{self, OpenOptions},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context, Result};

use super::args::RunArgs;
use crate::{
    analysis::Analysis,
    exit::{ExitCode, Failure},
    power::PowerSetup,
    privileges::{self, TargetUser},
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
    /// Opens the trace (given to `user`), its analysis knowing `--gpu` and `--power`.
    pub fn open(
        args: &RunArgs,
        user: Option<&TargetUser>,
        power: Option<&PowerSetup>,
    ) -> Result<Self, Failure> {
        let (output, label) = open_output(args.output.as_deref(), user)
            .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))?;
        let writer = TraceWriter::new(output);
        let started = Instant::now();
        let mut analysis = if args.gpu {
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

/// The trace's destination and its name in messages (`stdout` for `-o -`).
fn open_output(
    requested: Option<&Path>,
    user: Option<&TargetUser>,
) -> Result<(Box<dyn Write>, String)> {
    if requested == Some(Path::new("-")) {
        return Ok((Box::new(std::io::stdout()), "stdout".into()));
    }
    let path = match requested {
        Some(path) => path.to_owned(),
        None => {
            let dir = PathBuf::from("traces");
            if !dir.is_dir() {
                fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
                if let Some(user) = user {
                    privileges::chown_to(&dir, user)
                        .with_context(|| format!("giving {} to {}", dir.display(), user.name))?;
                }
            }
            dir.join(default_trace_name())
        }
    };
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&path)
        .with_context(|| format!("cannot write the trace to {}", path.display()))?;
    if let Some(user) = user {
        privileges::chown_to(&path, user)
            .with_context(|| format!("giving {} to {}", path.display(), user.name))?;
    }
    Ok((Box::new(file), path.display().to_string()))
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
