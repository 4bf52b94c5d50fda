//! Part 4, trace tools: `cudatrace summary` and `cudatrace export` timed on a generated
//! trace of the demo's calls repeated (10M calls by default).

use std::{collections::BTreeMap, fs, path::Path, process::Command, time::Instant};

use anyhow::{Result, ensure};
use serde::{Deserialize, Serialize};

use super::{
    cudatrace::cudatrace_run,
    env::Env,
    generated_trace::generate_trace,
    process::{Finished, run_measured},
    stats::Stats,
};

/// Below this much free disk the generated trace is scaled down.
const MIN_FREE_BYTES: u64 = 5_000_000_000;

/// A `cudatrace` command timed on the generated trace (its path goes last).
pub struct Tool {
    /// Its key under `trace.tools` in results.json.
    pub key: &'static str,
    pub args: &'static [&'static str],
    /// A folder under target/bench the command writes into (`-o`), emptied after each run.
    pub folder: Option<&'static str>,
}

/// The tools, in the table's order.
pub const TOOLS: &[Tool] = &[
    Tool {
        key: "summary",
        args: &["summary"],
        folder: None,
    },
    Tool {
        key: "export_chrome",
        args: &["export", "--format", "chrome", "-o", "/dev/null"],
        folder: None,
    },
    Tool {
        key: "export_perfetto",
        args: &["export", "--format", "perfetto", "-o", "/dev/null"],
        folder: None,
    },
    // Tables are a folder: written for real (a few percent of the trace's size).
    Tool {
        key: "export_parquet",
        args: &["export", "--format", "parquet"],
        folder: Some("parquet"),
    },
];

impl Tool {
    /// `cudatrace summary`, as the table names it.
    pub fn label(&self) -> String {
        match self.folder {
            Some(folder) => format!("cudatrace {} -o target/bench/{folder}", self.args.join(" ")),
            None => format!("cudatrace {}", self.args.join(" ")),
        }
    }
}

/// `trace` in results.json.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TraceToolResults {
    /// Call lines in the generated trace.
    pub events: u64,
    /// `--trace-events`; more than `events` where the disk was too small.
    pub requested_events: u64,
    pub scaled_note: Option<String>,
    pub bytes: u64,
    /// Call lines in the demo trace that were repeated.
    pub source_calls: usize,
    pub generate_s: f64,
    pub free_bytes_before: u64,
    pub page_cache: String,
    /// By tool key.
    pub tools: BTreeMap<String, ToolResults>,
    /// The generated trace's path with `--keep-trace`.
    pub kept: Option<String>,
}

/// One tool's runs.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ToolResults {
    pub wall_s: Stats,
    pub cpu_s: Stats,
    pub peak_rss_mib: Stats,
    /// From the median wall time.
    pub events_per_s: Option<f64>,
    pub mb_per_s: Option<f64>,
}

/// Generates a trace of `requested_events` calls (fewer where the disk is small) and runs
/// every tool on it `rounds` times; deletes it afterwards unless `keep`.
pub fn run(
    env: &Env,
    requested_events: u64,
    rounds: usize,
    keep: bool,
) -> Result<TraceToolResults> {
    let demo = env.out.join("demo-source.jsonl");
    let demo_program = env.standin.join("cudatrace-demo");
    run_measured(
        &env.out,
        &mut cudatrace_run(env, &demo, &[], &[&demo_program]),
        None,
    )?
    .ensure_ok("cudatrace run of the demo")?;
    let demo_text = fs::read_to_string(&demo)?;
    let calls: Vec<&str> = demo_text
        .lines()
        .filter(|l| l.starts_with("{\"type\":\"call\""))
        .collect();
    let mean_line =
        calls.iter().map(|l| l.len() as u64 + 1).sum::<u64>() / calls.len().max(1) as u64;
    let free = free_bytes(&env.out)?;
    let mut events = requested_events;
    let mut note = None;
    let estimate = events * mean_line;
    if free < MIN_FREE_BYTES || estimate > free / 2 {
        let fits = (free / 2 / mean_line.max(1)).min(events);
        let scaled = format!(
            "only {:.1} GB free: scaled down from {} to {} events",
            free as f64 / 1e9,
            events,
            fits
        );
        eprintln!("xtask: bench: {scaled}");
        note = Some(scaled);
        events = fits;
    }
    let generated = env.out.join("generated.jsonl");
    let t = Instant::now();
    let bytes = generate_trace(&demo, &generated, events)?;
    let generate_s = t.elapsed().as_secs_f64();
    eprintln!(
        "xtask: bench: generated {events} calls, {:.2} GB in {generate_s:.1} s",
        bytes as f64 / 1e9
    );
    let mut runs: BTreeMap<&str, Vec<Finished>> = BTreeMap::new();
    let mut summary_text = String::new();
    for round in 0..rounds.max(1) {
        for tool in TOOLS {
            let mut command = Command::new(&env.cudatrace);
            command.args(tool.args);
            let folder = tool.folder.map(|folder| env.out.join(folder));
            if let Some(folder) = &folder {
                command.arg("-o").arg(folder);
            }
            command.arg(&generated);
            let run = run_measured(&env.out, &mut command, None)?;
            run.ensure_ok(&tool.label())?;
            if let Some(folder) = &folder {
                eprintln!(
                    "xtask: bench: {} holds {:.1} MB",
                    folder.display(),
                    folder_bytes(folder)? as f64 / 1e6
                );
                fs::remove_dir_all(folder)?;
            }
            eprintln!(
                "xtask: bench: round {}/{} {:16} {:6.2} s, peak RSS {:.1} MiB",
                round + 1,
                rounds,
                tool.key,
                run.wall_s,
                run.max_rss_kib as f64 / 1024.0
            );
            if tool.key == "summary" && summary_text.is_empty() {
                summary_text = run.stdout.clone();
            }
            runs.entry(tool.key).or_default().push(run);
        }
    }
    fs::write(env.out.join("generated-summary.txt"), &summary_text)?;
    if !keep {
        fs::remove_file(&generated)?;
    }
    let tools = runs
        .iter()
        .map(|(key, runs)| {
            let figures =
                |f: &dyn Fn(&Finished) -> f64| Stats::of(&runs.iter().map(f).collect::<Vec<_>>());
            let wall_s = figures(&|r| r.wall_s);
            let median_wall = wall_s.median;
            let tool = ToolResults {
                cpu_s: figures(&|r| r.cpu_s),
                peak_rss_mib: figures(&|r| r.max_rss_kib as f64 / 1024.0),
                events_per_s: median_wall.map(|wall| events as f64 / wall),
                mb_per_s: median_wall.map(|wall| bytes as f64 / 1e6 / wall),
                wall_s,
            };
            ((*key).to_owned(), tool)
        })
        .collect();
    Ok(TraceToolResults {
        events,
        requested_events,
        scaled_note: note,
        bytes,
        source_calls: calls.len(),
        generate_s,
        free_bytes_before: free,
        page_cache: "warm: the trace was just written".into(),
        tools,
        kept: keep.then(|| generated.display().to_string()),
    })
}

/// The bytes of the files in `folder`.
fn folder_bytes(folder: &Path) -> Result<u64> {
    let mut bytes = 0;
    for entry in fs::read_dir(folder)? {
        bytes += entry?.metadata()?.len();
    }
    Ok(bytes)
}

/// Bytes free to unprivileged users on the file system of `path` (what `df` shows).
fn free_bytes(path: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: statvfs is plain data; the path is a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    ensure!(
        rc == 0,
        "statvfs {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}
