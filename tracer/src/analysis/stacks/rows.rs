//! The summary's view of the stacks: their figures rolled up by layer (the innermost
//! Module forward, named by its class), by Python line (the innermost frame) and by the
//! user's line (the innermost frame outside the libraries). Each table has a row for the
//! calls and kernels without a stack, and the layers' and users' tables one for stacks
//! without a layer or user frame, so each column adds up to the trace's total.

use foldhash::HashMap;
use serde::Serialize;

use super::{StackCounts, StackFigures, StackProfile, frames::StackTable};
use crate::schema::{StackRecordCounts, StacklessCounts};

/// The row of calls and kernels without a stack.
pub const NO_STACK: &str = "(no stack)";
/// The layers' row of stacks with no Module forward.
pub const NO_LAYER: &str = "(no layer)";
/// The users' row of stacks whose every frame is a library's.
pub const NO_USER_FRAME: &str = "(no user frame)";
/// The lines' row of stacks without frames.
pub const NO_FRAME: &str = "(no frame)";

/// One row: a layer or a line, and what its calls did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StackRow {
    /// The layer's class, `FILE:LINE` of a line, or one of the rows above.
    pub name: String,
    /// The function: a layer's `forward`, a line's function.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// A line's line (absent where CPython had none for the instruction).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Where the function is defined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_line: Option<u32>,
    #[serde(flatten)]
    pub figures: StackFigures,
}

/// `summary`'s stacks section (`--json`'s `stacks`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StacksSummary {
    /// Distinct stacks.
    pub stacks: u64,
    #[serde(flatten)]
    pub counts: StackCounts,
    /// The footer's `stacks.without`: the calls of the chosen families without a stack, by
    /// why (`sampled_out` by `--stack-every`); absent where the trace has no footer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub without: Option<StacklessCounts>,
    /// The footer's `stacks.stack_records`: how the probes sent the stacks (known to them,
    /// or whole); absent where the trace's footer has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_records: Option<StackRecordCounts>,
    /// The trace has `--gpu` lines: the GPU columns are the kernels' time.
    pub gpu: bool,
    /// `--stack-every N` (absent when 1): a call's stack was walked with a chance of 1 in N,
    /// so the rows by layer and line are estimates, N times their sampled calls' figures,
    /// and "(no stack)" the rest of the totals; the totals and the counts are exact.
    #[serde(skip_serializing_if = "is_one")]
    pub every: u32,
    /// Every figure summed (the trace's totals).
    pub total: StackFigures,
    /// By layer; most GPU time first (without `--gpu`, most time in calls), then
    /// "(no layer)" and "(no stack)".
    pub layers: Vec<StackRow>,
    /// By Python line (the innermost frame), then "(no stack)".
    pub lines: Vec<StackRow>,
    /// By the user's line (the innermost frame outside torch, the installed packages and
    /// the standard library), then "(no user frame)" and "(no stack)".
    pub user_lines: Vec<StackRow>,
}

fn is_one(every: &u32) -> bool {
    *every == 1
}

/// What a row is keyed by: a function (layers) or a frame (lines), or none.
type Key = Option<u32>;

fn rows(
    profile: &StackProfile,
    key_of: impl Fn(&StackTable, usize) -> Key,
    row_of: impl Fn(&StackTable, u32) -> StackRow,
    none: &str,
) -> Vec<StackRow> {
    let mut by_key: HashMap<Key, StackFigures> = HashMap::default();
    for (index, figures) in profile.per_stack.iter().enumerate() {
        by_key
            .entry(key_of(&profile.table, index))
            .or_default()
            .add(figures);
    }
    let without = by_key.remove(&None);
    let mut rows: Vec<StackRow> = by_key
        .into_iter()
        .filter_map(|(key, figures)| {
            let mut row = row_of(&profile.table, key?);
            row.figures = figures;
            Some(row)
        })
        .collect();
    rows.sort_by(|a, b| {
        let rank = |row: &StackRow| (row.figures.gpu_ns, row.figures.time_ns, row.figures.calls);
        rank(b)
            .cmp(&rank(a))
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| a.file.cmp(&b.file))
            .then_with(|| a.line.cmp(&b.line))
    });
    if let Some(figures) = without {
        rows.push(special(none, figures));
    }
    if profile.no_stack != StackFigures::default() {
        rows.push(special(NO_STACK, profile.no_stack));
    }
    rows
}

fn special(name: &str, figures: StackFigures) -> StackRow {
    StackRow {
        name: name.to_owned(),
        function: None,
        file: None,
        line: None,
        first_line: None,
        figures,
    }
}

/// A line's row: `FILE:LINE` (`FILE` alone where the frame has no line).
fn line_row(table: &StackTable, frame: u32) -> StackRow {
    let line = table.frame(frame).line;
    let function = table.function_of(frame);
    StackRow {
        name: match line {
            Some(line) => format!("{}:{line}", function.file),
            None => function.file.clone(),
        },
        function: Some(function.qualname.clone()),
        file: Some(function.file.clone()),
        line,
        first_line: Some(function.first_line),
        figures: StackFigures::default(),
    }
}

impl StackProfile {
    /// The summary's tables.
    pub fn summary(&self) -> StacksSummary {
        let frame_at = |table: &StackTable, index: usize, position: Option<usize>| {
            let stack = &table.stacks()[index];
            position.and_then(|at| stack.frames.get(at).copied())
        };
        let layers = rows(
            self,
            |table, index| {
                let frame = frame_at(table, index, table.stacks()[index].layer)?;
                Some(table.frame(frame).function)
            },
            |table, function| {
                let forward = table.function(function);
                StackRow {
                    name: forward.layer_name(),
                    function: Some(forward.qualname.clone()),
                    file: Some(forward.file.clone()),
                    line: None,
                    first_line: Some(forward.first_line),
                    figures: StackFigures::default(),
                }
            },
            NO_LAYER,
        );
        let lines = rows(
            self,
            |table, index| frame_at(table, index, Some(0)),
            line_row,
            NO_FRAME,
        );
        let user_lines = rows(
            self,
            |table, index| frame_at(table, index, table.stacks()[index].user),
            line_row,
            NO_USER_FRAME,
        );
        StacksSummary {
            stacks: self.table.stacks().len() as u64,
            counts: self.counts,
            without: self.without,
            stack_records: self.records,
            gpu: self.gpu,
            every: self.every,
            total: self.total,
            layers,
            lines,
            user_lines,
        }
    }
}
