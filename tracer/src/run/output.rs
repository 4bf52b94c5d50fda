//! Where the trace goes: a file (by default `traces/trace_YYYYMMDD_HHMMSS.jsonl`, given to
//! the sudo user) or standard output.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::Result;

use crate::{
    output_file::{Input, Writer},
    privileges::TargetUser,
};

/// The trace's destination and its name in messages (`stdout` for `-o -`). Under sudo the
/// file (and a `traces/` folder made for it) is created as the invoking user
/// (`output_file`); none of `inputs` is overwritten.
pub fn open_output(
    requested: Option<&Path>,
    user: Option<&TargetUser>,
    inputs: &[Input],
) -> Result<(Box<dyn Write>, String)> {
    if requested == Some(Path::new("-")) {
        return Ok((Box::new(std::io::stdout()), "stdout".into()));
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
