//! Where the trace goes: a file (by default `traces/trace_YYYYMMDD_HHMMSS.jsonl`, given to
//! the sudo user) or standard output.

use std::{
    fs::{self, OpenOptions},
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};

use crate::privileges::{self, TargetUser};

/// The trace's destination and its name in messages (`stdout` for `-o -`).
pub fn open_output(
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
