//! Every field of every kind of line has a column, or a reason to have none: a field added
//! to a line and not to its table fails here, naming the line and the field.
//!
//! A line's fields are the keys it can write (`schema::testing::written_keys`), nested
//! objects' as `a.b`. A field is carried by the column of its name in its line's tables
//! (`[x,y,z]` by `NAME_x`, `NAME_y`, `NAME_z`), by the column [`RENAMED`] gives it, or
//! not at all for a reason [`NOT_EXPORTED`] gives; kinds of line with no table say why in
//! [`EXPORTS`].

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::tables::schemas;
use crate::schema::{
    CallLine, DriverLine, Footer, GpuCopyLine, GpuErrorLine, GpuGapLine, GpuInfoLine,
    GpuKernelLine, GpuLine, GpuLink, GpuMemsetLine, Header, InterpreterLine, LibraryLine, Line,
    LineType, LostLine, PowerLine, ProcessLine, StackFrame, StackLine, testing::written_keys,
};

/// Where a kind of line goes.
enum Export {
    /// Its fields are columns of these tables.
    Tables(&'static [&'static str]),
    /// It has no table, for this reason.
    Nowhere(
        #[expect(dead_code, reason = "the reason is for people reading the list")] &'static str,
    ),
}

/// Every kind of line, by its `"type"`, and where it goes.
const EXPORTS: &[(&str, Export)] = &[
    ("header", Export::Tables(&["traces"])),
    ("call", Export::Tables(&["calls"])),
    ("process", Export::Tables(&["processes"])),
    ("power", Export::Tables(&["power"])),
    ("gpu_kernel", Export::Tables(&["kernels"])),
    ("gpu_copy", Export::Tables(&["gpu_copies"])),
    ("gpu_memset", Export::Tables(&["gpu_memsets"])),
    ("gpu_gap", Export::Tables(&["gpu_gaps"])),
    ("library", Export::Tables(&["libraries"])),
    ("stack", Export::Tables(&["stacks"])),
    // The footer's figures are not the `traces` columns of their names (`gpu` and `power`
    // there are the header's): those it has are in RENAMED.
    ("footer", Export::Tables(&[])),
    (
        "lost",
        Export::Nowhere("the footer's `lost` counts add them up (`traces.lost`)"),
    ),
    (
        "driver",
        Export::Nowhere("`--kernel`'s NVIDIA-module events are for `summary` and the timeline"),
    ),
    (
        "interpreter",
        Export::Nowhere("it says whether a process's calls have stacks: `calls.stack` does"),
    ),
    (
        "gpu_info",
        Export::Nowhere("how GPU recording went in a process: the trace's own lines say it"),
    ),
    (
        "gpu_error",
        Export::Nowhere("how GPU recording went in a process: the trace's own lines say it"),
    ),
];

/// Fields whose column has another name, or is in another table: `(line, field, table,
/// column)`.
const RENAMED: &[(&str, &str, &str, &str)] = &[
    // Every table's `rank` and `host` are the process's rank and the machine
    // (`calls::column_name`).
    ("call", "rank", "calls", "comm_rank"),
    ("call", "nranks", "calls", "comm_nranks"),
    ("call", "host", "calls", "host_ptr"),
    ("gpu_copy", "async", "gpu_copies", "is_async"),
    ("gpu_memset", "async", "gpu_memsets", "is_async"),
    ("library", "device", "libraries", "file_device"),
    ("header", "version", "traces", "format_version"),
    ("footer", "exit_code", "traces", "exit_code"),
    ("footer", "lost.total", "traces", "lost"),
    // A row per frame, numbered.
    ("stack", "id", "stacks", "stack"),
    ("stack", "frames", "stacks", "frame"),
    ("stack", "frames.file", "stacks", "file"),
    ("stack", "frames.qualname", "stacks", "qualname"),
    ("stack", "frames.line", "stacks", "line"),
    ("stack", "frames.first_line", "stacks", "first_line"),
];

/// Fields deliberately without a column: `(line, field, why)`. A field stands for the
/// fields inside it too.
const NOT_EXPORTED: &[(&str, &str, &str)] = &[
    (
        "gpu_kernel",
        "cupti_kernel",
        "CUPTI's stale name for a reused function handle: `kernel` is the launch's",
    ),
    ("header", "format", "always `cudatrace`"),
    (
        "header",
        "job_ids",
        "the launcher's job variables, a map: the readers' one-run check reads them from the \
         JSONL; a job's tables are one export per trace, in its own folder",
    ),
    (
        "header",
        "clock",
        "always `CLOCK_MONOTONIC`, as the format doc says",
    ),
    (
        "header",
        "kernel",
        "the machine's kernel release: for people reading the trace",
    ),
    (
        "header",
        "functions",
        "the probe selection as given: `probes` says what came of it",
    ),
    (
        "header",
        "launch_entry_only",
        "`calls` rows without `dur_ns` show it",
    ),
    (
        "header",
        "libcuda",
        "the `libraries` table has every library probed",
    ),
    (
        "header",
        "attach",
        "how the probes were attached: for `doctor` and people",
    ),
    ("header", "ring_bytes", "a setting of the run"),
    (
        "header",
        "probes",
        "each call's `name` and `family` carry what a probe gives",
    ),
    (
        "header",
        "missing_functions",
        "what was not probed: for people",
    ),
    ("header", "aliases", "symbol aliases: for people"),
    (
        "header",
        "attach_failures",
        "what was not probed: for people",
    ),
    (
        "header",
        "kernel_hooks",
        "`--kernel`: driver lines have no table",
    ),
    (
        "header",
        "window",
        "`--window`'s span: the rows' times show it",
    ),
    (
        "header",
        "stacks",
        "`--stacks`' settings: the `stacks` table has the stacks",
    ),
    (
        "library",
        "missing_functions",
        "what was not probed in it: for people",
    ),
    ("library", "aliases", "symbol aliases: for people"),
    (
        "library",
        "attach_failures",
        "what was not probed in it: for people",
    ),
    (
        "footer",
        "end_wall",
        "the end: the last rows' times show it",
    ),
    (
        "footer",
        "duration_ns",
        "the end: the last rows' times show it",
    ),
    ("footer", "events", "lines by type: each table's `count(*)`"),
    (
        "footer",
        "calls_by_name",
        "calls by name: `calls` grouped by `name`",
    ),
    (
        "footer",
        "lost",
        "losses by cause: `traces.lost` is their total",
    ),
    (
        "footer",
        "entries_seen",
        "the tracer's own figures, for `doctor` and people",
    ),
    (
        "footer",
        "unmatched_returns",
        "the tracer's own figures, for `doctor` and people",
    ),
    (
        "footer",
        "abandoned_calls",
        "the tracer's own figures, for `doctor` and people",
    ),
    (
        "footer",
        "stops",
        "the tracer's own figures, for `doctor` and people",
    ),
    (
        "footer",
        "undecodable",
        "the tracer's own figures, for `doctor` and people",
    ),
    (
        "footer",
        "exit_signal",
        "how the program ended: `exit_code` is the usual answer",
    ),
    ("footer", "stopped_by", "what ended the run: for people"),
    ("footer", "error", "why the run failed: for people"),
    (
        "footer",
        "memory",
        "the analysis's own figures: `summary` gives them",
    ),
    (
        "footer",
        "power",
        "the sampler's own figures: the `power` rows are the samples",
    ),
    (
        "footer",
        "gpu",
        "GPU recording's own figures: the GPU tables are the records",
    ),
    (
        "footer",
        "stacks",
        "the stack walker's own figures: `stacks` has the stacks",
    ),
    ("footer", "window", "`--window`'s figures: for people"),
];

// Every variant of `Line` and `GpuLine` has its line in `every_line`: a kind of line
// added fails to compile here until it is listed there and in `EXPORTS`.
const _: fn(&Line) = |line| match line {
    Line::Header(_)
    | Line::Call(_)
    | Line::Process(_)
    | Line::Lost(_)
    | Line::Driver(_)
    | Line::Power(_)
    | Line::Library(_)
    | Line::Stack(_)
    | Line::Interpreter(_)
    | Line::Footer(_)
    | Line::Unknown => {}
    Line::Gpu(gpu) => match **gpu {
        GpuLine::Kernel(_)
        | GpuLine::Copy(_)
        | GpuLine::Memset(_)
        | GpuLine::Info(_)
        | GpuLine::Error(_)
        | GpuLine::Gap(_) => {}
    },
};

/// Each kind of line and the keys it can write.
fn every_line() -> Vec<(&'static str, BTreeSet<String>)> {
    fn keys<L: LineType + Serialize>(line: &L) -> (&'static str, BTreeSet<String>) {
        (L::TYPE, written_keys(line))
    }
    let (kernel, copy, memset) = gpu_work();
    vec![
        keys(&Header::default()),
        keys(&CallLine::default()),
        keys(&ProcessLine::default()),
        keys(&LostLine::default()),
        keys(&DriverLine::default()),
        keys(&PowerLine::default()),
        keys(&kernel),
        keys(&copy),
        keys(&memset),
        keys(&GpuInfoLine::default()),
        keys(&GpuErrorLine::default()),
        keys(&GpuGapLine::default()),
        keys(&LibraryLine::default()),
        keys(&StackLine {
            frames: vec![StackFrame::default()],
            ..StackLine::default()
        }),
        keys(&InterpreterLine::default()),
        keys(&Footer::default()),
    ]
}

/// A kernel, a copy and a memset with every field set. serde names the fields a line
/// leaves out only where it writes the line as a struct, and these are written as maps
/// (their link is flattened): each field is set here, and one added fails to compile here
/// until it is.
fn gpu_work() -> (GpuKernelLine, GpuCopyLine, GpuMemsetLine) {
    let link = GpuLink {
        correlation_id: 1,
        graph_id: Some(2),
        graph_node_id: Some(3),
        call_tid: Some(4),
        call_ts_ns: Some(5),
        capture_call_tid: Some(6),
        capture_call_ts_ns: Some(7),
        queued_ns: Some(8),
        unlinked: Some("no_call".into()),
        warnings: vec!["no_clock".into()],
    };
    let kernel = GpuKernelLine {
        tag: Default::default(),
        pid: 1,
        device: 2,
        context: 3,
        stream: 4,
        ts_ns: 5,
        dur_ns: 6,
        kernel: "k".into(),
        kernel_mangled: Some("_Z1kv".into()),
        cupti_kernel: Some("k2".into()),
        grid: [1, 2, 3],
        block: [4, 5, 6],
        static_shared_mem: 7,
        dynamic_shared_mem: 8,
        registers_per_thread: 9,
        link: link.clone(),
    };
    let copy = GpuCopyLine {
        tag: Default::default(),
        pid: 1,
        device: 2,
        context: 3,
        stream: 4,
        ts_ns: 5,
        dur_ns: 6,
        kind: "HtoD".into(),
        bytes: 7,
        src_kind: "pinned".into(),
        dst_kind: "device".into(),
        is_async: true,
        link: link.clone(),
    };
    let memset = GpuMemsetLine {
        tag: Default::default(),
        pid: 1,
        device: 2,
        context: 3,
        stream: 4,
        ts_ns: 5,
        dur_ns: 6,
        bytes: 7,
        value: 8,
        memory: "device".into(),
        is_async: true,
        link,
    };
    (kernel, copy, memset)
}

/// Whether `columns` carry field `key`: the column of its name, or `[x,y,z]`'s three.
fn carries(columns: &BTreeSet<String>, key: &str) -> bool {
    columns.contains(key)
        || ["x", "y", "z"]
            .iter()
            .all(|axis| columns.contains(&format!("{key}_{axis}")))
}

/// Each table's columns, by name.
type Columns = BTreeMap<&'static str, BTreeSet<String>>;

/// What is wrong with `line`'s `keys` going to tables `names`: a field without a column
/// nor a reason, a column RENAMED gives that is not there, a field NOT_EXPORTED that has
/// a column.
fn uncarried(line: &str, keys: &BTreeSet<String>, names: &[&str], tables: &Columns) -> Vec<String> {
    let mut problems = Vec::new();
    for key in keys {
        // The table is the line's type.
        if key == "type" {
            continue;
        }
        let renamed = RENAMED.iter().find(|(l, k, ..)| *l == line && k == key);
        let carried = match renamed {
            Some((_, _, table, column)) => tables[table].contains(*column),
            None => names.iter().any(|table| carries(&tables[table], key)),
        };
        let excused = NOT_EXPORTED
            .iter()
            .find(|(l, k, _)| *l == line && (key == k || key.starts_with(&format!("{k}."))));
        match (carried, excused, renamed) {
            (true, Some((_, field, _)), _) if field == key => problems.push(format!(
                "{line} line's `{key}` has a column: take it off NOT_EXPORTED"
            )),
            (false, None, Some((_, _, table, column))) => problems.push(format!(
                "{line} line's `{key}`: its column `{table}.{column}` (RENAMED) is missing"
            )),
            (false, None, None) => problems.push(format!(
                "{line} line's `{key}`: no column carries it (in {names:?}; add one, or list \
                 it in NOT_EXPORTED with the reason)"
            )),
            _ => {}
        }
    }
    problems
}

/// RENAMED and NOT_EXPORTED entries for a field its line does not have (any more).
fn stale(lines: &[(&str, BTreeSet<String>)]) -> Vec<String> {
    let entries = RENAMED
        .iter()
        .map(|(line, key, ..)| (line, key, "RENAMED"))
        .chain(
            NOT_EXPORTED
                .iter()
                .map(|(line, key, _)| (line, key, "NOT_EXPORTED")),
        );
    let mut problems = Vec::new();
    for (line, key, list) in entries {
        let keys = lines.iter().find(|(l, _)| l == line).map(|(_, keys)| keys);
        if !keys.is_some_and(|keys| keys.contains(*key)) {
            problems.push(format!(
                "{list} names {line} line's `{key}`, which it does not have"
            ));
        }
    }
    problems
}

#[test]
fn every_field_of_every_line_has_a_column_or_a_reason_not_to() {
    let tables: Columns = schemas()
        .into_iter()
        .map(|(name, schema)| {
            let columns = schema.fields().iter().map(|f| f.name().clone()).collect();
            (name, columns)
        })
        .collect();
    let lines = every_line();
    let mut listed: Vec<&str> = EXPORTS.iter().map(|(line, _)| *line).collect();
    let mut known: Vec<&str> = lines.iter().map(|(line, _)| *line).collect();
    listed.sort();
    known.sort();
    assert_eq!(listed, known, "EXPORTS lists each kind of line once");

    let mut problems = Vec::new();
    for (line, keys) in &lines {
        let (_, export) = EXPORTS.iter().find(|(l, _)| l == line).unwrap();
        if let Export::Tables(names) = export {
            problems.extend(uncarried(line, keys, names, &tables));
        }
    }
    problems.extend(stale(&lines));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
