//! `cudatrace export`'s flags.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
#[command(after_help = "\
Calls become slices on their process's and thread's track (launches named by kernel,
copies by direction and size), device memory a counter, fork/exec/exit and lost events
markers, and each launch gets a flow arrow to the synchronisation that waited for it.
Times are microseconds (chrome) or nanoseconds (perfetto) since tracing started. The
output is written while the trace is read: memory does not grow with the trace.
docs/export.md has the whole mapping.

Examples:
  cudatrace export trace.jsonl                     # writes trace.json
  cudatrace export trace.jsonl --format perfetto   # writes trace.pftrace
  cudatrace export trace.jsonl --format parquet -o job/rank0   # job/rank0/calls.parquet, ...
  cudatrace export trace.jsonl --pid 4242 --name cuLaunch --start-ms 1000 --end-ms 1500")]
pub struct ExportArgs {
    /// The JSONL trace written by `cudatrace run`.
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,

    /// `chrome`: Trace Event JSON; `perfetto`: Perfetto's protobuf format, smaller and
    /// faster to open for traces of a million events or more; `parquet`: a folder of
    /// Parquet tables, one per kind of line, for SQL engines (docs/trace-format.md).
    #[arg(long, value_enum, default_value = "chrome")]
    pub format: ExportFormat,

    /// Where to write; `-` for standard output. Default: TRACE with the extension
    /// `.json` (chrome), `.pftrace` (perfetto) or `.parquet` (parquet: a folder, made if
    /// missing, that must be empty or hold only an earlier export's tables). Written whole
    /// or not at all: if the export fails, an earlier file or earlier tables stay as they
    /// were.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// `--format parquet`: write the tables into a folder that holds other files too
    /// (they are left as they are; the tables' files are overwritten).
    #[arg(long)]
    pub force: bool,

    /// Only this process's events. Repeatable.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Only calls whose function or slice name (a kernel's, for launches) contains
    /// SUBSTRING (case-sensitive), and driver events whose name or hook does. Repeatable:
    /// any one matches. Counters and process markers are kept.
    #[arg(long = "name", value_name = "SUBSTRING")]
    pub names: Vec<String>,

    /// Only events from this many milliseconds after tracing started (slices that
    /// overlap the window are kept whole).
    #[arg(long, value_name = "MS")]
    pub start_ms: Option<f64>,

    /// Only events up to this many milliseconds after tracing started.
    #[arg(long, value_name = "MS")]
    pub end_ms: Option<f64>,

    /// `--format perfetto` of a `--stacks --gpu` trace: one GPU-time sample per US
    /// microseconds of a stack's kernels on a thread (default 1). Each sample is some 30
    /// bytes: coarser samples keep the file small when the GPU ran for minutes.
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(1..))]
    pub gpu_sample_us: Option<u64>,

    /// Skip malformed lines (counted and reported) instead of failing with exit code 65.
    #[arg(long)]
    pub skip_bad_lines: bool,
}

/// What `--format` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// Trace Event JSON (chrome://tracing, the Perfetto UI, Speedscope...).
    Chrome,
    /// Perfetto's protobuf TrackEvent format: smaller and faster to load for large traces.
    Perfetto,
    /// A folder of Parquet tables, one per kind of line, for SQL engines.
    Parquet,
}

impl ExportFormat {
    pub fn extension(self) -> &'static str {
        match self {
            ExportFormat::Chrome => "json",
            ExportFormat::Perfetto => "pftrace",
            ExportFormat::Parquet => "parquet",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            ExportFormat::Chrome => "Trace Event JSON",
            ExportFormat::Perfetto => "Perfetto protobuf",
            ExportFormat::Parquet => "Parquet tables",
        }
    }
}
