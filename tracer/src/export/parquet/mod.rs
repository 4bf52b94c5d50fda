//! `cudatrace export TRACE --format parquet -o OUTDIR`: the trace as Parquet tables, one
//! file per kind of line (`calls.parquet`, `kernels.parquet`, ...), for SQL engines
//! (DuckDB, ClickHouse, Spark, Trino). Every table starts with `trace`, `host` and
//! `rank`, so the tables of a job's traces concatenate
//! (`SELECT ... FROM 'job/*/calls.parquet'`). docs/trace-format.md describes each table
//! and column.
//!
//! Lines are read once, in order; each row goes into its table's Arrow arrays, and every
//! few thousand rows the batch goes to a thread that encodes it into the table's file
//! (`writer.rs`). Memory holds a batch and an encoded row group per table, a few batches
//! in flight, the collectives waiting for their kernels and the analysis's handles,
//! never the trace. A pass ahead of the export reads each process's rank (`ranks.rs`), so
//! that its first rows have it too.
//!
//! | file | |
//! |---|---|
//! | `columns.rs` | column kinds: integer widths, dictionary strings, lists, `[x,y,z]` |
//! | `table.rs` | a table's columns declared once (`table!`), and its file written a batch at a time |
//! | `tables.rs` | every table but `calls` declared, and the set an export writes, listed once |
//! | `calls.rs` | the `calls` table, whose columns follow from the call line's fields (`call_fields!`) |
//! | `link.rs` | the link columns the GPU tables end with, from the lines' `GpuLink` |
//! | `collectives.rs` | NCCL collectives: one row per collective asked for, numbered on its communicator, with its kernels' GPU time |
//! | `ranks.rs` | each process's rank, from the communicators it made |
//! | `exporter.rs` | lines → rows |
//! | `writer.rs` | the encoding into Parquet, on a thread of its own |
//!
//! `stack` lines are the `stacks` table, a row per frame, keyed to the calls that name
//! the stack by `(trace, stack)`. A test checks that every field of every kind of line
//! has a column, or is listed with the reason it has none (`coverage.rs`).

mod calls;
mod collectives;
mod columns;
mod exporter;
mod link;
mod ranks;
mod table;
mod tables;
mod writer;

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::anyhow;

use self::{
    exporter::{ParquetExportError, ParquetExporter, ReadFigures, header_extra},
    ranks::Ranks,
    tables::{TABLE_NAMES, TABLES, Tables},
};
use crate::{
    exit::{ExitCode, Failure},
    output_file::{Input, Replacement, Writer, as_user},
    privileges::TargetUser,
    reader::{ReadError, TraceLines},
    trace_input::TraceInput,
};

/// The rows written to each table, in [`TABLE_NAMES`]' order.
pub type Rows = [u64; TABLES];

/// Exports `trace` into the folder `outdir` (made if missing) as `user`. An `outdir`
/// holding anything but a parquet export's tables is refused unless `force`.
pub fn export(
    trace: &Path,
    outdir: &Path,
    force: bool,
    skip_bad_lines: bool,
    user: Option<&TargetUser>,
) -> Result<Rows, Failure> {
    let started = Instant::now();
    let label = trace.display().to_string();
    let input = TraceInput::open_trace(trace)?;
    let not_writable = |e: anyhow::Error| Failure::new(ExitCode::OutputNotWritable, e);
    let writer = Writer { user };
    make_folder(outdir, force, &writer).map_err(not_writable)?;
    let unreadable = ReadError::reading(&label);
    let ranks = Ranks::read(&mut input.pass().map_err(unreadable)?).map_err(unreadable)?;
    let trace_file = input.pass().map_err(unreadable)?;
    let inputs: Vec<Input> = Input::of_file("the trace being exported", &trace_file)
        .into_iter()
        .collect();
    let paths: Vec<PathBuf> = TABLE_NAMES
        .iter()
        .map(|name| outdir.join(format!("{name}.parquet")))
        .collect();
    // The folder is held against a second export; each table is written under a temporary
    // name, and all are renamed into place once every one is whole: a failed export leaves
    // the folder's earlier tables as they were.
    let _held = writer
        .lock_dir(outdir)
        .map_err(|e| not_writable(e.into()))?;
    let replacements = create(&paths, &inputs, &writer).map_err(not_writable)?;
    let files = replacements
        .iter()
        .map(Replacement::file)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| not_writable(anyhow!("cannot write {}: {e}", outdir.display())))?;
    let tables = Tables::open(files).map_err(|e| not_writable(e.into()))?;
    let lines = TraceLines::from_file_prepared(trace_file, &label, skip_bad_lines, header_extra);
    let (rows, figures) = ParquetExporter::new(tables, ranks, &label)
        .run(lines)
        .map_err(|e| match e {
            ParquetExportError::Read(e) => e.into(),
            ParquetExportError::Write(_) => not_writable(e.into()),
        })?;
    for replacement in replacements {
        replacement.commit().map_err(|e| not_writable(e.into()))?;
    }
    report(&label, outdir, &rows, &figures, started);
    Ok(rows)
}

/// Makes `outdir` (`-o job/rank0`: the folders above too), and refuses one holding
/// anything but a parquet export's tables unless `force`.
fn make_folder(outdir: &Path, force: bool, writer: &Writer) -> anyhow::Result<()> {
    let missing: Vec<&Path> = outdir
        .ancestors()
        .skip(1)
        .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
        .collect();
    for dir in missing.into_iter().rev().chain([outdir]) {
        writer.create_dir(dir)?;
    }
    let others = other_files(outdir, writer.user)
        .map_err(|e| anyhow!("cannot list {}: {e}", outdir.display()))?;
    if !others.is_empty() && !force {
        anyhow::bail!(
            "{} holds files a parquet export does not write ({}): pass --force to write \
             the tables beside them, or -o an empty or new folder",
            outdir.display(),
            others.join(", ")
        );
    }
    Ok(())
}

/// The tables' files, each under its temporary name (removed if dropped uncommitted).
fn create<'a>(
    paths: &[PathBuf],
    inputs: &[Input],
    writer: &Writer<'a>,
) -> anyhow::Result<Vec<Replacement<'a>>> {
    paths
        .iter()
        .map(|path| Ok(writer.replacement(path, inputs)?))
        .collect()
}

/// The closing lines on stderr: lines skipped or left out, and the rows of each table.
fn report(label: &str, outdir: &Path, rows: &Rows, figures: &ReadFigures, started: Instant) {
    if figures.skipped_lines > 0 {
        eprintln!(
            "cudatrace: skipped {} malformed lines of {label}",
            figures.skipped_lines
        );
        for (line, message) in &figures.first_skipped {
            eprintln!("cudatrace:   {label}:{line}: {message}");
        }
    }
    if let Some(cut) = &figures.cut_warning {
        eprintln!("cudatrace: warning: {cut}");
    }
    if figures.unknown_lines > 0 {
        eprintln!(
            "cudatrace: {} lines of types this version does not know were left out",
            figures.unknown_lines
        );
    }
    let counts: Vec<String> = TABLE_NAMES
        .iter()
        .zip(rows)
        .filter(|(_, rows)| **rows > 0)
        .map(|(name, rows)| format!("{name} {rows}"))
        .collect();
    eprintln!(
        "cudatrace: wrote {} (Parquet tables): {} rows ({}) in {:.2} s",
        outdir.display(),
        rows.iter().sum::<u64>(),
        counts.join(", "),
        started.elapsed().as_secs_f64()
    );
}

/// The entries of `outdir` that are not the tables' files, sorted.
fn other_files(outdir: &Path, user: Option<&TargetUser>) -> std::io::Result<Vec<String>> {
    let names = as_user(user, || {
        std::fs::read_dir(outdir)?
            .map(|entry| entry.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<Vec<String>>>()
    })??;
    let mut others: Vec<String> = names
        .into_iter()
        .filter(|name| {
            name.strip_suffix(".parquet")
                .is_none_or(|table| !TABLE_NAMES.contains(&table))
        })
        // A table's temporary file, left by an export that was killed: its own.
        .filter(|name| !(name.starts_with('.') && name.contains(".parquet.cudatrace-")))
        .collect();
    others.sort();
    Ok(others)
}

#[cfg(test)]
mod coverage;
#[cfg(test)]
mod tests;
