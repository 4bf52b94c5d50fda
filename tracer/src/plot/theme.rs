//! The picture's look: font, colours and the sizes of its parts, in CSS pixels.

pub const FONT: &str = "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif";
/// Average glyph width of the font, in ems, to tell whether a label fits.
pub const GLYPH_EM: f64 = 0.6;

pub const MARGIN_LEFT_PX: f64 = 200.0;
pub const MARGIN_RIGHT_PX: f64 = 40.0;
/// The stage strip above the lanes.
pub const STRIP_H: f64 = 26.0;
/// One API family's lane.
pub const LANE_H: f64 = 28.0;
/// The GPU power panel (`--power` traces).
pub const POWER_H: f64 = 110.0;
/// The device-memory panel.
pub const MEMORY_H: f64 = 150.0;
/// One row of a table.
pub const ROW_H: f64 = 19.0;
/// Kernels listed under the timeline.
pub const TOP_KERNELS: usize = 10;
/// Functions listed by time in calls.
pub const TOP_FUNCTIONS: usize = 6;
/// Processes whose memory is drawn.
pub const MEMORY_CURVES: usize = 6;

pub const TEXT: &str = "#222";
pub const MUTED: &str = "#666";
pub const GRID: &str = "#ddd";

/// Each API family's colour, in the lanes and the kernel bars.
pub fn family_color(family: &str) -> &'static str {
    match family {
        "init" => "#8c564b",
        "context" => "#9467bd",
        "memory" => "#2ca02c",
        "virtual_memory" => "#17becf",
        "copy" => "#1f77b4",
        "memset" => "#bcbd22",
        "launch" => "#d62728",
        "sync" => "#ff7f0e",
        "module" => "#7f7f7f",
        // `--gpu`: the GPU lanes.
        "gpu" => "#006d2c",
        _ => "#e377c2",
    }
}

/// The `index`th stage's band.
pub fn stage_color(index: usize) -> &'static str {
    [
        "#bdbdbd", "#fdae6b", "#9ecae1", "#a1d99b", "#bcbddc", "#fc9272",
    ][index % 6]
}

/// The `index`th process's memory curve.
pub fn curve_color(index: usize) -> &'static str {
    [
        "#2ca02c", "#1f77b4", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    ][index % MEMORY_CURVES]
}
