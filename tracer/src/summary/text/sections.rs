//! The full summary's devices, collectives and `--kernel` driver sections.

use std::fmt::Write as _;

use crate::{
    analysis::{devices::DevicesSummary, driver::DriverSummary, nccl::CollectivesSummary},
    format::{format_bytes, format_ns, plural, shorten},
};

use super::json::single_device;

/// The devices section, when calls went to more than one device.
pub(super) fn render_devices(out: &mut String, devices: &DevicesSummary) {
    if single_device(&devices) {
        return;
    }
    let _ = writeln!(out, "\nBy device (the thread's current context)");
    let _ = writeln!(
        out,
        "  {:>6} {:>9} {:>7} {:>11} {:>7} {:>11} {:>7} {:>11} {:>11} {:>11}",
        "device",
        "launches",
        "copies",
        "copied",
        "memsets",
        "set",
        "allocs",
        "allocated",
        "peak live",
        "live at end"
    );
    for row in &devices.rows {
        let _ = writeln!(
            out,
            "  {:>6} {:>9} {:>7} {:>11} {:>7} {:>11} {:>7} {:>11} {:>11} {:>11}",
            row.device,
            row.launches,
            row.copies,
            format_bytes(row.copy_bytes),
            row.memsets,
            format_bytes(row.memset_bytes),
            row.allocations,
            format_bytes(row.allocated_bytes),
            format_bytes(row.peak_live_bytes),
            format_bytes(row.live_bytes),
        );
    }
    if devices.unattributed > 0 {
        let _ = writeln!(
            out,
            "  {} (launches, copies, memsets, allocations) on no known device",
            plural(devices.unattributed, "call")
        );
    }
}

/// The collectives section: per communicator, rank and op.
pub(super) fn render_collectives(out: &mut String, collectives: &CollectivesSummary) {
    if collectives.rows.is_empty() {
        return;
    }
    let gpu = collectives.rows.iter().any(|row| row.gpu_ns.is_some());
    let _ = writeln!(out, "\nNCCL collectives, by communicator and rank");
    let _ = write!(
        out,
        "  {:<22} {:>9} {:>8} {:<14} {:>7} {:>6} {:>11} {:>10}",
        "communicator", "rank", "pid", "op", "calls", "errors", "bytes", "host"
    );
    if gpu {
        let _ = write!(out, " {:>10} {:>11} {:>11}", "gpu", "algbw", "busbw");
    }
    out.push('\n');
    let known = |value: Option<i32>| value.map_or("?".to_owned(), |v| v.to_string());
    for row in &collectives.rows {
        let _ = write!(
            out,
            "  {:<22} {:>9} {:>8} {:<14} {:>7} {:>6} {:>11} {:>10}",
            shorten(&row.communicator, 22),
            format!("{} of {}", known(row.rank), known(row.nranks)),
            row.pid,
            row.op,
            row.calls,
            row.errors,
            format_bytes(row.bytes),
            format_ns(row.host_ns),
        );
        if gpu {
            let rate = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2} GB/s"));
            let _ = write!(
                out,
                " {:>10} {:>11} {:>11}",
                row.gpu_ns.map_or("-".to_owned(), format_ns),
                rate(row.algbw_gb_s),
                rate(row.busbw_gb_s)
            );
        }
        out.push('\n');
        if row.inner_calls > 0 {
            let _ = writeln!(
                out,
                "  {:<22} {:>9} {:>8} ran as {} inside it ({} calls, counted once, here)",
                "",
                "",
                "",
                row.inner_functions.join(", "),
                row.inner_calls
            );
        }
    }
    if collectives.unattributed_kernels > 0 {
        let _ = writeln!(
            out,
            "  {} NCCL kernels launched outside any collective seen (not attributed)",
            collectives.unattributed_kernels
        );
    }
}

pub(super) fn render_driver(out: &mut String, driver: &DriverSummary) {
    if driver.events == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "\nNVIDIA driver (--kernel): {} in {}",
        plural(driver.events, "event"),
        format_ns(driver.total_ns)
    );
    let _ = writeln!(
        out,
        "  {:<8} {:<40} {:>7} {:>6} {:>11}",
        "hook", "call", "count", "errors", "total"
    );
    for row in driver.by_call.iter().take(25) {
        let _ = writeln!(
            out,
            "  {:<8} {:<40} {:>7} {:>6} {:>11}",
            row.hook,
            shorten(&row.what, 40),
            row.count,
            row.errors,
            format_ns(row.total_ns)
        );
    }
    if !driver.rm_alloc_classes.is_empty() {
        let classes: Vec<String> = driver
            .rm_alloc_classes
            .iter()
            .map(|c| format!("{} ×{} ({})", c.what, c.count, format_ns(c.total_ns)))
            .collect();
        let _ = writeln!(out, "  NV_ESC_RM_ALLOC by class: {}", classes.join(", "));
    }
}
