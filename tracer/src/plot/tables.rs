//! The tables under the timeline: the stages, the functions with the most time in calls
//! and the copies, the most launched kernels. Each returns the bottom of what it drew.

use super::{
    canvas::Canvas,
    content::Plot,
    theme::{GLYPH_EM, MUTED, ROW_H, TEXT, TOP_FUNCTIONS, TOP_KERNELS, family_color, stage_color},
};
use crate::format::{format_bytes, format_ns, plural, shorten};

/// Returns the bottom of the table.
pub fn stages(canvas: &mut Canvas, plot: &Plot<'_>, x: f64, y: f64, width: f64) -> f64 {
    let Some(process) = plot.primary_stages() else {
        canvas.text(x, y, "Stages", 13.0, "start", "bold", TEXT);
        canvas.label(x, y + ROW_H, "none: the trace has no calls");
        return y + ROW_H;
    };
    let others = plot.report.stages.len() - 1;
    let heading = match others {
        0 => format!("Stages of pid {}", process.pid),
        n => format!(
            "Stages of pid {} (the process with most calls; {} more in cudatrace summary)",
            process.pid,
            plural(n as u64, "process")
        ),
    };
    canvas.text(
        x,
        y,
        &shorten(&heading, (width / 7.0) as usize),
        13.0,
        "start",
        "bold",
        TEXT,
    );
    let columns = [
        (0.0, "stage", "start"),
        (width * 0.42, "start", "end"),
        (width * 0.60, "duration", "end"),
        (width * 0.76, "calls", "end"),
        (width * 0.92, "launches", "end"),
    ];
    let mut row = y + ROW_H;
    for (offset, title, anchor) in columns {
        let at = if anchor == "start" {
            x + 16.0
        } else {
            x + offset
        };
        canvas.text(at, row, title, 11.0, anchor, "bold", MUTED);
    }
    for (index, stage) in process.stages.iter().enumerate() {
        row += ROW_H;
        canvas.rect(x, row - 10.0, 10.0, 10.0, stage_color(index), 0.9);
        let cells = [
            stage.name.to_owned(),
            format!(
                "+{}",
                format_ns(stage.start_ns.saturating_sub(plot.bins.columns.t0))
            ),
            format_ns(stage.duration_ns),
            stage.calls.to_string(),
            stage.launches.to_string(),
        ];
        for ((offset, _, anchor), cell) in columns.iter().zip(&cells) {
            let at = if *anchor == "start" {
                x + 16.0
            } else {
                x + offset
            };
            canvas.text(at, row, cell, 12.0, anchor, "normal", TEXT);
        }
    }
    row
}

/// The functions with the most time in calls, then the copies by direction; returns the
/// bottom.
pub fn functions(canvas: &mut Canvas, plot: &Plot<'_>, x: f64, y: f64, width: f64) -> f64 {
    let summary = &plot.report.summary;
    canvas.text(
        x,
        y,
        "Time in calls, by function",
        13.0,
        "start",
        "bold",
        TEXT,
    );
    let mut row = y + ROW_H;
    canvas.text(x, row, "function", 11.0, "start", "bold", MUTED);
    canvas.text(x + width * 0.72, row, "calls", 11.0, "end", "bold", MUTED);
    canvas.text(x + width, row, "total", 11.0, "end", "bold", MUTED);
    let max_chars = (width * 0.55 / (12.0 * GLYPH_EM)) as usize;
    for function in summary.functions.iter().take(TOP_FUNCTIONS) {
        row += ROW_H;
        canvas.label(x, row, &shorten(&function.name, max_chars));
        let cells = [
            (x + width * 0.72, function.count.to_string()),
            (x + width, format_ns(function.total_ns)),
        ];
        for (at, cell) in cells {
            canvas.text(at, row, &cell, 12.0, "end", "normal", TEXT);
        }
    }
    if summary.functions.is_empty() {
        row += ROW_H;
        canvas.label(x, row, "no calls");
    }
    row += ROW_H * 1.6;
    canvas.text(x, row, "Copies, by direction", 13.0, "start", "bold", TEXT);
    if summary.copies.is_empty() {
        row += ROW_H;
        canvas.label(x, row, "none");
    }
    for copy in &summary.copies {
        row += ROW_H;
        canvas.label(x, row, &copy.kind);
        let cells = [
            (x + width * 0.72, plural(copy.count, "call")),
            (x + width, format_bytes(copy.bytes)),
        ];
        for (at, cell) in cells {
            canvas.text(at, row, &cell, 12.0, "end", "normal", TEXT);
        }
    }
    row
}

/// Returns the bottom of the list.
pub fn kernels(canvas: &mut Canvas, plot: &Plot<'_>, x: f64, y: f64, width: f64) -> f64 {
    let summary = &plot.report.summary;
    let mut heading = format!(
        "Top kernels: {} of {}",
        plural(summary.kernel_launches, "launch"),
        plural(summary.kernels.len() as u64, "kernel")
    );
    if summary.graph_launches > 0 {
        heading.push_str(&format!(
            ", plus {}",
            plural(summary.graph_launches, "graph launch")
        ));
    }
    canvas.text(x, y, &heading, 13.0, "start", "bold", TEXT);
    if summary.kernels.is_empty() {
        canvas.label(x, y + ROW_H, "no kernel launches");
        return y + ROW_H;
    }
    let bar_w = 120.0;
    let most = summary.kernels[0].launches.max(1) as f64;
    let name_x = x + bar_w + 125.0;
    let max_chars = ((x + width - name_x) / (12.0 * GLYPH_EM)).max(10.0) as usize;
    let mut row = y;
    for kernel in summary.kernels.iter().take(TOP_KERNELS) {
        row += ROW_H;
        let w = (kernel.launches as f64 / most * bar_w).max(1.0);
        canvas.rect(x, row - 10.0, w, 11.0, family_color("launch"), 0.75);
        canvas.text(
            x + bar_w + 60.0,
            row,
            &format!("×{}", kernel.launches),
            12.0,
            "end",
            "normal",
            TEXT,
        );
        canvas.text(
            x + bar_w + 112.0,
            row,
            &format!("{:.1}%", kernel.share * 100.0),
            12.0,
            "end",
            "normal",
            MUTED,
        );
        let name = match kernel.kernel.as_str() {
            "" => "(empty name)",
            name => name,
        };
        canvas.label(name_x, row, &shorten(name, max_chars));
    }
    let more = summary.kernels.len().saturating_sub(TOP_KERNELS);
    if more > 0 {
        row += ROW_H;
        canvas.text(
            name_x,
            row,
            &format!("… {} more", plural(more as u64, "kernel")),
            12.0,
            "start",
            "normal",
            MUTED,
        );
    }
    row
}
