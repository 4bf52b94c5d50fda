//! Drawing the timeline as SVG text: a title, the stage strip, the GPUs' power under it
//! (`--power` traces), one lane per API family, the device-memory panel, the time axis,
//! then the stage table and the top kernels.

use std::fmt::Write as _;

use super::{
    bins::{Bins, GPU_LANE, Lane, OTHER_LANE},
    canvas::{Canvas, text_width},
    content::Plot,
    tables,
    theme::{
        GLYPH_EM, GRID, LANE_H, MARGIN_LEFT_PX, MARGIN_RIGHT_PX, MEMORY_H, MUTED, POWER_H, STRIP_H,
        TEXT, curve_color, family_color, stage_color,
    },
};
use crate::{
    analysis::stages::ProcessStages,
    format::{format_bytes, format_ns, plural, shorten},
};

/// 1, 2 or 5 times a power of ten, near `rough`.
fn nice_step(rough: f64) -> f64 {
    if rough <= 0.0 || !rough.is_finite() {
        return 1.0;
    }
    let power = 10f64.powf(rough.log10().floor());
    let fraction = rough / power;
    let nice = if fraction < 1.5 {
        1.0
    } else if fraction < 3.5 {
        2.0
    } else if fraction < 7.5 {
        5.0
    } else {
        10.0
    };
    nice * power
}

fn decimals(step: f64) -> usize {
    (-step.log10().floor()).max(0.0) as usize
}

/// The time unit for a span: its name and nanoseconds.
fn time_unit(span_ns: u64) -> (&'static str, f64) {
    match span_ns {
        0..2_000 => ("ns", 1.0),
        2_000..2_000_000 => ("µs", 1e3),
        2_000_000..2_000_000_000 => ("ms", 1e6),
        _ => ("s", 1e9),
    }
}

fn byte_unit(bytes: u64) -> (&'static str, f64) {
    match bytes {
        0..2048 => ("B", 1.0),
        2048..2_097_152 => ("KiB", 1024.0),
        2_097_152..2_147_483_648 => ("MiB", 1_048_576.0),
        _ => ("GiB", 1_073_741_824.0),
    }
}

/// Geometry of the time axis.
struct TimeAxis {
    left: f64,
    width: f64,
    t0: u64,
    span_ns: f64,
}

impl TimeAxis {
    fn x(&self, ts: u64) -> f64 {
        let offset = ts.saturating_sub(self.t0) as f64;
        self.left + (offset / self.span_ns).min(1.0) * self.width
    }
}

/// The whole picture.
pub fn draw(plot: &Plot<'_>, width: u32) -> String {
    let summary = &plot.report.summary;
    let width = f64::from(width);
    let mut canvas = Canvas::new(width);
    let axis = TimeAxis {
        left: MARGIN_LEFT_PX,
        width: width - MARGIN_LEFT_PX - MARGIN_RIGHT_PX,
        t0: plot.bins.columns.t0,
        span_ns: plot.bins.columns.span_ns as f64,
    };

    // Title and the figures of the whole trace.
    let title = if plot.info.command.is_empty() {
        format!("cudatrace timeline: {}", plot.info.file)
    } else {
        format!("cudatrace timeline: {}", plot.info.command.join(" "))
    };
    let max_title = ((width - 40.0) / (18.0 * GLYPH_EM)) as usize;
    canvas.text(
        20.0,
        30.0,
        &shorten(&title, max_title),
        18.0,
        "start",
        "bold",
        TEXT,
    );
    let mut facts = vec![
        format!(
            "{} ({} errors) in {} over {}",
            plural(summary.calls, "call"),
            summary.errors,
            plural(summary.pids.len() as u64, "process"),
            format_ns(summary.span_ns)
        ),
        format!(
            "{} of {}",
            plural(summary.kernel_launches, "kernel launch"),
            plural(summary.kernels.len() as u64, "kernel")
        ),
    ];
    if let Some(peak) = plot.report.memory.iter().map(|m| m.peak_device_bytes).max() {
        facts.push(format!("device memory peak {}", format_bytes(peak)));
    }
    let gpu = &plot.report.gpu;
    if gpu.work > 0 {
        facts.push(format!(
            "GPU busy {:.1}% ({} kernels)",
            gpu.busy_ns as f64 * 100.0 / gpu.run_ns.max(1) as f64,
            gpu.kernels
        ));
    }
    if let Some(power) = &plot.report.power {
        facts.push(format!(
            "GPU energy {} (mean {:.1} W)",
            format_joules(power.energy_j),
            power.mean_w
        ));
    }
    facts.push(plural(plot.info.lost_events, "lost event"));
    if !plot.info.complete {
        facts.push("TRUNCATED: no footer".into());
    }
    canvas.text(
        20.0,
        52.0,
        &facts.join(" · "),
        13.0,
        "start",
        "normal",
        MUTED,
    );

    let mut y = 72.0;
    let stages = plot.primary_stages();
    let timeline_top = y;
    // `--power`: the GPUs' power right under the stages, inside their bands.
    let power_top = y + STRIP_H + 8.0;
    let power_shown = plot.report.power.is_some();
    let lanes_top = if power_shown {
        power_top + POWER_H + 10.0
    } else {
        y + STRIP_H + 8.0
    };
    let visible_lanes: Vec<_> = plot
        .bins
        .lanes
        .iter()
        .filter(|lane| lane.family != OTHER_LANE || lane.calls > 0)
        .collect();
    let family_lanes_bottom = lanes_top + LANE_H * visible_lanes.len() as f64;
    let lanes_bottom = family_lanes_bottom + LANE_H * plot.bins.gpus.len() as f64;
    let memory_top = lanes_bottom + 14.0;
    let memory_bottom = memory_top + MEMORY_H;

    // Stage bands behind everything, then the strip with their names.
    if let Some(process) = stages {
        draw_stage_bands(&mut canvas, &axis, process, timeline_top, memory_bottom);
    }
    draw_stage_strip(&mut canvas, &axis, stages, y);
    if power_shown {
        draw_power(&mut canvas, &axis, plot, power_top);
    }
    y = lanes_top;

    for (index, lane) in visible_lanes.iter().enumerate() {
        let top = y + LANE_H * index as f64;
        if index % 2 == 1 {
            canvas.rect(axis.left, top, axis.width, LANE_H, "#000", 0.03);
        }
        let baseline = top + LANE_H / 2.0 + 4.0;
        let (name_color, count_color) = if lane.calls > 0 {
            (TEXT, MUTED)
        } else {
            ("#999", "#999")
        };
        canvas.rect(
            20.0,
            baseline - 9.0,
            10.0,
            10.0,
            family_color(lane.family),
            0.9,
        );
        let name = lane.family.replace('_', " ");
        canvas.text(36.0, baseline, &name, 12.0, "start", "normal", name_color);
        canvas.text(
            axis.left - 10.0,
            baseline,
            &plural(lane.calls, "call"),
            11.0,
            "end",
            "normal",
            count_color,
        );
        draw_lane(
            &mut canvas,
            &axis,
            plot.bins,
            index_of(plot.bins, lane.family),
            top,
        );
    }
    // --gpu: a lane per GPU, its work's time per column; the summary's busy share beside.
    for (index, (device, lane)) in plot.bins.gpus.iter().enumerate() {
        let top = family_lanes_bottom + LANE_H * index as f64;
        canvas.line(axis.left, top, axis.left + axis.width, top, GRID);
        let baseline = top + LANE_H / 2.0 + 4.0;
        canvas.rect(
            20.0,
            baseline - 9.0,
            10.0,
            10.0,
            family_color(GPU_LANE),
            0.9,
        );
        // Named as its power curve is (NVML's index) where the two differ (--power).
        let nvml = plot.report.power.as_ref().and_then(|power| {
            let matched = power
                .kernels
                .devices
                .iter()
                .find(|d| d.cuda_device == *device);
            matched.and_then(|d| d.nvml_index)
        });
        let name = match nvml {
            Some(index) if index != *device => format!("GPU {index} (CUDA {device})"),
            _ => format!("GPU {device}"),
        };
        canvas.text(36.0, baseline, &name, 12.0, "start", "bold", TEXT);
        let busy = gpu.devices.iter().find(|d| d.device == *device);
        let share = busy.map_or(0.0, |d| d.share_of_run * 100.0);
        canvas.text(
            axis.left - 10.0,
            baseline,
            &format!("busy {share:.1}%"),
            11.0,
            "end",
            "normal",
            MUTED,
        );
        draw_lane_of(&mut canvas, &axis, plot.bins, lane, top);
    }
    canvas.line(
        axis.left,
        lanes_bottom,
        axis.left + axis.width,
        lanes_bottom,
        GRID,
    );

    draw_memory(&mut canvas, &axis, plot, memory_top);
    let axis_bottom = draw_time_axis(&mut canvas, &axis, memory_bottom);

    // The stages as a table, then the top kernels.
    let tables_top = axis_bottom + 34.0;
    let stages_end = tables::stages(&mut canvas, plot, 20.0, tables_top, 640.0);
    let functions_end = tables::functions(&mut canvas, plot, 720.0, tables_top, width - 740.0);
    let kernels_end = tables::kernels(
        &mut canvas,
        plot,
        20.0,
        stages_end.max(functions_end) + 34.0,
        width - 40.0,
    );
    let height = kernels_end + 20.0;

    canvas.finish(height)
}

fn index_of(bins: &Bins, family: &str) -> usize {
    bins.lanes
        .iter()
        .position(|lane| lane.family == family)
        .unwrap_or(0)
}

fn draw_stage_bands(
    canvas: &mut Canvas,
    axis: &TimeAxis,
    process: &ProcessStages,
    top: f64,
    bottom: f64,
) {
    for (index, stage) in process.stages.iter().enumerate() {
        if stage.duration_ns == 0 {
            continue;
        }
        let x0 = axis.x(stage.start_ns);
        let x1 = axis.x(stage.start_ns.saturating_add(stage.duration_ns));
        canvas.rect(
            x0,
            top,
            (x1 - x0).max(0.5),
            bottom - top,
            stage_color(index),
            0.18,
        );
    }
}

fn draw_stage_strip(canvas: &mut Canvas, axis: &TimeAxis, stages: Option<&ProcessStages>, y: f64) {
    let Some(process) = stages else {
        canvas.text(
            axis.left - 10.0,
            y + 17.0,
            "stages",
            12.0,
            "end",
            "bold",
            TEXT,
        );
        canvas.text(
            axis.left + 6.0,
            y + 17.0,
            "no calls",
            12.0,
            "start",
            "normal",
            MUTED,
        );
        return;
    };
    canvas.text(
        axis.left - 10.0,
        y + 17.0,
        &format!("stages, pid {}", process.pid),
        12.0,
        "end",
        "bold",
        TEXT,
    );
    for (index, stage) in process.stages.iter().enumerate() {
        if stage.duration_ns == 0 {
            continue;
        }
        let x0 = axis.x(stage.start_ns);
        let x1 = axis.x(stage.start_ns.saturating_add(stage.duration_ns));
        let band = (x1 - x0).max(0.5);
        canvas.rect(x0, y, band, STRIP_H, stage_color(index), 0.85);
        // Inside when it fits; the table below names every stage anyway.
        let full = format!("{} {}", stage.name, format_ns(stage.duration_ns));
        for text in [full.as_str(), stage.name] {
            if text_width(text, 11.0) + 8.0 <= band {
                canvas.text(
                    x0 + band / 2.0,
                    y + 17.0,
                    text,
                    11.0,
                    "middle",
                    "normal",
                    TEXT,
                );
                break;
            }
        }
    }
}

fn draw_lane(canvas: &mut Canvas, axis: &TimeAxis, bins: &Bins, lane: usize, top: f64) {
    draw_lane_of(canvas, axis, bins, &bins.lanes[lane], top);
}

fn draw_lane_of(canvas: &mut Canvas, axis: &TimeAxis, bins: &Bins, lane: &Lane, top: f64) {
    let color = family_color(lane.family);
    let fractions = lane.busy_fractions(&bins.columns);
    let column_w = axis.width / bins.columns.count as f64;
    let inner = LANE_H - 6.0;
    // Height: share of the column's time in calls; a short call still gets a tick.
    let height_of = |column: usize| -> f64 {
        if lane.starts[column] == 0 && fractions[column] <= 0.0 {
            return 0.0;
        }
        let share = fractions[column].clamp(0.0, 1.0);
        ((3.0 + share * (inner - 3.0)) * 2.0).round() / 2.0
    };
    // Runs of columns with one height become one rectangle.
    let mut column = 0;
    while column < bins.columns.count {
        let height = height_of(column);
        let mut end = column + 1;
        while end < bins.columns.count && height_of(end) == height {
            end += 1;
        }
        if height > 0.0 {
            let x = axis.left + column as f64 * column_w;
            let w = ((end - column) as f64 * column_w).max(1.0);
            canvas.rect(x, top + LANE_H - 3.0 - height, w, height, color, 0.9);
        }
        column = end;
    }
}

fn draw_memory(canvas: &mut Canvas, axis: &TimeAxis, plot: &Plot<'_>, top: f64) {
    let bottom = top + MEMORY_H;
    canvas.text(
        20.0,
        top + 12.0,
        "device memory",
        12.0,
        "start",
        "bold",
        TEXT,
    );
    let peak = plot
        .bins
        .memory
        .iter()
        .filter_map(|curve| plot.memory_of(curve.pid))
        .map(|m| m.peak_device_bytes)
        .max()
        .unwrap_or(0);
    canvas.line(axis.left, bottom, axis.left + axis.width, bottom, MUTED);
    if peak == 0 {
        canvas.text(
            axis.left + 8.0,
            top + MEMORY_H / 2.0,
            "no device memory allocated",
            12.0,
            "start",
            "normal",
            MUTED,
        );
        return;
    }
    // Y axis in binary units with round steps.
    let (unit, unit_bytes) = byte_unit(peak);
    let step = nice_step(peak as f64 / unit_bytes / 4.0);
    let top_value = (peak as f64 / unit_bytes / step).ceil() * step;
    let plot_top = top + 30.0;
    let y_of = |bytes: f64| bottom - bytes / unit_bytes / top_value * (bottom - plot_top);
    let mut tick = 0.0;
    while tick <= top_value + step / 2.0 {
        let y = y_of(tick * unit_bytes);
        canvas.line(axis.left, y, axis.left + axis.width, y, GRID);
        canvas.text(
            axis.left - 6.0,
            y + 4.0,
            &format!("{:.*} {unit}", decimals(step), tick),
            11.0,
            "end",
            "normal",
            MUTED,
        );
        tick += step;
    }
    let column_w = axis.width / plot.bins.columns.count as f64;
    let mut legend_x = axis.left + 8.0;
    for (index, curve) in plot.bins.memory.iter().enumerate() {
        let color = curve_color(index);
        let levels = curve.levels();
        let mut path = format!("M{:.2},{:.2}", axis.left, bottom);
        for (column, level) in levels.iter().enumerate() {
            let y = y_of(*level as f64);
            let x0 = axis.left + column as f64 * column_w;
            let _ = write!(path, " L{x0:.2},{y:.2} L{:.2},{y:.2}", x0 + column_w);
        }
        let _ = write!(path, " L{:.2},{bottom:.2} Z", axis.left + axis.width);
        canvas.path(&path, color, if index == 0 { 0.22 } else { 0.08 });
        let Some(memory) = plot.memory_of(curve.pid) else {
            continue;
        };
        // The peak the summary reports, where it reports it.
        let x = axis.x(memory.peak_ts_ns);
        let y = y_of(memory.peak_device_bytes as f64);
        canvas.dot(x, y, color);
        let legend = format!(
            "pid {}: peak {} at +{}, final {}",
            curve.pid,
            format_bytes(memory.peak_device_bytes),
            format_ns(memory.peak_ts_ns.saturating_sub(axis.t0)),
            format_bytes(memory.final_device_bytes)
        );
        canvas.rect(legend_x, top + 3.0, 10.0, 10.0, color, 0.9);
        canvas.text(
            legend_x + 14.0,
            top + 12.0,
            &legend,
            12.0,
            "start",
            "normal",
            TEXT,
        );
        legend_x += text_width(&legend, 12.0) + 34.0;
    }
}

/// J with a sensible precision.
fn format_joules(joules: f64) -> String {
    if joules.abs() >= 100.0 {
        format!("{joules:.0} J")
    } else {
        format!("{joules:.2} J")
    }
}

/// `--power`: each GPU's power (the mean of its samples per column) on a W axis, with the
/// summary's figures as the legend.
fn draw_power(canvas: &mut Canvas, axis: &TimeAxis, plot: &Plot<'_>, top: f64) {
    let bottom = top + POWER_H;
    canvas.text(20.0, top + 12.0, "GPU power", 12.0, "start", "bold", TEXT);
    canvas.line(axis.left, bottom, axis.left + axis.width, bottom, MUTED);
    let curves: Vec<(u32, Vec<Option<f64>>)> = plot
        .bins
        .power
        .iter()
        .map(|curve| (curve.device, curve.watts()))
        .collect();
    let peak = curves
        .iter()
        .flat_map(|(_, watts)| watts.iter().flatten())
        .fold(0.0f64, |peak, w| peak.max(*w));
    if peak <= 0.0 {
        canvas.text(
            axis.left + 8.0,
            top + POWER_H / 2.0,
            "no power sample between the first call and the last",
            12.0,
            "start",
            "normal",
            MUTED,
        );
        return;
    }
    let step = nice_step(peak / 3.0);
    let top_value = (peak / step).ceil() * step;
    let plot_top = top + 30.0;
    let y_of = |watts: f64| bottom - watts / top_value * (bottom - plot_top);
    let mut tick = 0.0;
    while tick <= top_value + step / 2.0 {
        let y = y_of(tick);
        canvas.line(axis.left, y, axis.left + axis.width, y, GRID);
        canvas.text(
            axis.left - 6.0,
            y + 4.0,
            &format!("{:.*} W", decimals(step), tick),
            11.0,
            "end",
            "normal",
            MUTED,
        );
        tick += step;
    }
    let column_w = axis.width / plot.bins.columns.count as f64;
    let mut legend_x = axis.left + 8.0;
    for (index, (device, watts)) in curves.iter().enumerate() {
        let color = curve_color(index);
        let mut path = String::new();
        for (column, value) in watts.iter().enumerate() {
            let Some(value) = value else { continue };
            let x = axis.left + (column as f64 + 0.5) * column_w;
            let command = if path.is_empty() { 'M' } else { 'L' };
            let _ = write!(path, "{command}{x:.2},{:.2} ", y_of(*value));
        }
        if !path.is_empty() {
            canvas.polyline(path.trim_end(), color);
        }
        let figures = plot
            .report
            .power
            .as_ref()
            .and_then(|power| power.devices.iter().find(|d| d.index == *device));
        let legend = match figures {
            Some(d) => format!(
                "GPU {device}: mean {:.1} W, peak {:.1} W, {} ({})",
                d.mean_w,
                d.peak_w,
                format_joules(d.energy_j),
                d.energy_source
            ),
            None => format!("GPU {device}"),
        };
        canvas.rect(legend_x, top + 3.0, 10.0, 10.0, color, 0.9);
        canvas.text(
            legend_x + 14.0,
            top + 12.0,
            &legend,
            12.0,
            "start",
            "normal",
            TEXT,
        );
        legend_x += text_width(&legend, 12.0) + 34.0;
    }
}

/// Ticks and labels under the memory panel; returns the bottom of the axis title.
fn draw_time_axis(canvas: &mut Canvas, axis: &TimeAxis, y: f64) -> f64 {
    let (unit, unit_ns) = time_unit(axis.span_ns as u64);
    let span = axis.span_ns / unit_ns;
    let ticks_wanted = (axis.width / 110.0).max(2.0);
    let step = nice_step(span / ticks_wanted);
    let mut tick = 0.0;
    while tick <= span * (1.0 + 1e-9) {
        let x = axis.left + tick / span * axis.width;
        canvas.line(x, y, x, y + 5.0, MUTED);
        canvas.text(
            x,
            y + 18.0,
            &format!("{:.*}", decimals(step), tick),
            11.0,
            "middle",
            "normal",
            MUTED,
        );
        tick += step;
    }
    canvas.text(
        axis.left + axis.width / 2.0,
        y + 36.0,
        &format!("time since the first call ({unit})"),
        12.0,
        "middle",
        "normal",
        TEXT,
    );
    y + 36.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(0.23), 0.2);
        assert_eq!(nice_step(3.9), 5.0);
        assert_eq!(nice_step(80.0), 100.0);
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(decimals(0.25), 1);
        assert_eq!(decimals(5.0), 0);
        assert_eq!(time_unit(9_400_000_000).0, "s");
        assert_eq!(time_unit(1_500).0, "ns");
        assert_eq!(byte_unit(3 << 30).0, "GiB");
    }
}
