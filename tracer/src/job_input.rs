//! A job's traces read for `summary A B ...` and `merge`: each opened (a pipe copied
//! first, `trace_input`), its header checked, read through the cross-rank analysis'
//! collector. What cannot make one job is refused before anything is read twice: the
//! same trace given twice, a format newer than this cudatrace reads, a file that is not
//! a trace; then traces that are not of one run (`one_run`).

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use anyhow::anyhow;

use crate::{
    analysis::ranks::{JobHeader, JobTrace, collect, first_mismatch},
    exit::{ExitCode, Failure},
    reader::{ReadError, TraceLines},
    trace_input::{TraceInput, empty_note, regular_file},
};

/// A trace of the job, opened and its header read.
pub struct JobFile {
    pub label: String,
    pub input: TraceInput,
    pub header: JobHeader,
}

impl JobFile {
    /// Reads the header of `input` (named `label`): a cudatrace header of a version this
    /// cudatrace reads, with its clocks.
    pub fn new(label: String, input: TraceInput) -> Result<JobFile, Failure> {
        let mut first = Vec::new();
        input
            .pass()
            .and_then(|pass| BufReader::new(pass).read_until(b'\n', &mut first))
            .map_err(ReadError::reading(&label))?;
        // Its version was checked when it was opened (`trace_input`).
        let header = JobHeader::parse(first.trim_ascii_end()).map_err(|message| {
            Failure::new(
                ExitCode::BadInput,
                anyhow!("{label}:1: not a cudatrace trace: {message}"),
            )
        })?;
        Ok(JobFile {
            label,
            input,
            header,
        })
    }
}

/// `--job DIR`: the `*.jsonl` files in DIR, by name.
pub fn files_in(dir: &Path) -> Result<Vec<PathBuf>, Failure> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        Failure::new(
            ExitCode::InputUnreadable,
            anyhow!("cannot read the folder {}: {e}", dir.display()),
        )
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .collect();
    files.sort();
    // A FIFO would wait for a writer, `/dev/zero` never end: regular files only.
    for file in &files {
        regular_file(file)?;
    }
    if files.is_empty() {
        return Err(Failure::new(
            ExitCode::InputUnreadable,
            anyhow!("{} holds no *.jsonl trace", dir.display()),
        ));
    }
    Ok(files)
}

/// Opens `paths` and reads their headers; refuses a trace given twice and formats this
/// cudatrace does not read, and says when the versions differ.
pub fn open(paths: &[PathBuf]) -> Result<Vec<JobFile>, Failure> {
    let mut files: Vec<JobFile> = Vec::with_capacity(paths.len());
    let mut identities: Vec<(u64, u64)> = Vec::new();
    for path in paths {
        let label = path.display().to_string();
        let cannot = ReadError::opening(&label);
        let identity = std::fs::metadata(path).map_err(cannot)?;
        let identity = (identity.dev(), identity.ino());
        let input = TraceInput::open_trace(path)?;
        if input.is_empty() {
            eprintln!(
                "cudatrace: note: {}: a rank with nothing, left out",
                empty_note(&label)
            );
            continue;
        }
        let JobFile {
            label,
            input,
            header,
        } = JobFile::new(label.clone(), input)?;
        let same_file = identities.iter().position(|seen| *seen == identity);
        // A copy of a trace is the same run: same host, same clocks read at its start.
        let same_run = files.iter().position(|f| {
            (
                f.header.host.as_str(),
                f.header.start_wall_ns,
                f.header.start_monotonic_ns,
            ) == (
                header.host.as_str(),
                header.start_wall_ns,
                header.start_monotonic_ns,
            )
        });
        if let Some(index) = same_file.or(same_run) {
            let how = if same_file.is_some() {
                "the same file"
            } else {
                "the same trace (a copy: same host, same start)"
            };
            return Err(Failure::new(
                ExitCode::Usage,
                anyhow!(
                    "{} and {label} are {how}: give each trace once",
                    files[index].label
                ),
            ));
        }
        identities.push(identity);
        files.push(JobFile {
            label,
            input,
            header,
        });
    }
    let versions: BTreeSet<u32> = files.iter().map(|f| f.header.version).collect();
    if versions.len() > 1 {
        let list: Vec<String> = versions.iter().map(u32::to_string).collect();
        eprintln!(
            "cudatrace: the traces are of format versions {}: read alike (NCCL communicators \
             and their collectives' numbers are recomputed where a trace lacks them)",
            list.join(" and ")
        );
    }
    Ok(files)
}

/// Reads each trace for the cross-rank analysis.
pub fn read(files: &[JobFile], skip_bad_lines: bool) -> Result<Vec<JobTrace>, Failure> {
    files
        .iter()
        .map(|file| {
            let pass = file.input.pass().map_err(ReadError::reading(&file.label))?;
            let lines = TraceLines::from_file(pass, &file.label, skip_bad_lines);
            let trace = collect(lines, file.header.clone())?;
            if trace.skipped_lines > 0 {
                eprintln!(
                    "cudatrace: skipped {} malformed lines of {}",
                    trace.skipped_lines, file.label
                );
                for (line, message) in &trace.first_skipped {
                    eprintln!("cudatrace:   {}:{line}: {message}", file.label);
                }
            }
            Ok(trace)
        })
        .collect()
}

/// Refuses traces that are not of one run (exit 65), naming the first two that disagree
/// and why; `remedy` says what to do instead.
pub fn one_run(traces: &[JobTrace], remedy: &str) -> Result<(), Failure> {
    match first_mismatch(traces) {
        Some(why) => Err(Failure::new(ExitCode::BadInput, anyhow!("{why}; {remedy}"))),
        None => Ok(()),
    }
}
