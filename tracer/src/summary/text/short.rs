//! The few lines `cudatrace run` prints at the end, each starting `cudatrace: `: time in
//! calls, kernels, copies, memory, stages, and the `--kernel`, `--gpu`, `--power` figures.

use std::fmt::Write as _;

use crate::{
    analysis::{Report, driver::DriverSummary, gpu::GpuSummary},
    format::{format_bytes, format_ns, plural, shorten},
    schema::GpuFooter,
    summary::power,
};

use super::{copies, gpu_work::render_gpu_work};

/// The few lines `cudatrace run` prints at the end, each starting `cudatrace: `.
fn render_driver_short(out: &mut String, driver: &DriverSummary) {
    if driver.events == 0 {
        return;
    }
    let top: Vec<String> = driver
        .by_call
        .iter()
        .take(4)
        .map(|r| format!("{} ×{} ({})", r.what, r.count, format_ns(r.total_ns)))
        .collect();
    let _ = writeln!(
        out,
        "cudatrace: driver: {} in {}: {}",
        plural(driver.events, "event"),
        format_ns(driver.total_ns),
        top.join(", ")
    );
}

/// `cudatrace run --gpu`'s closing lines: what the GPU ran, and how linking went.
pub fn render_gpu_short(gpu: &GpuSummary, footer: &GpuFooter) -> String {
    let mut out = String::new();
    let unlinked = &footer.unlinked;
    let _ = writeln!(
        out,
        "cudatrace: GPU: {}, {}, {} ({} linked to their call, {} not: no API record {}, no \
         call {}, beyond the window {}); busy {} ({:.1}% of the run)",
        plural(gpu.kernels, "kernel"),
        copies(gpu.copies),
        plural(gpu.memsets, "memset"),
        footer.linked,
        unlinked.total(),
        unlinked.no_api_record,
        unlinked.no_call,
        unlinked.beyond_window,
        format_ns(gpu.busy_ns),
        gpu.busy_ns as f64 * 100.0 / gpu.run_ns.max(1) as f64
    );
    let top: Vec<String> = gpu
        .kernel_time
        .iter()
        .take(3)
        .map(|k| {
            format!(
                "{} {} ×{} ({:.0}%)",
                shorten(&k.kernel, 60),
                format_ns(k.total_ns),
                k.count,
                k.share_of_busy * 100.0
            )
        })
        .collect();
    if !top.is_empty() {
        let _ = writeln!(out, "cudatrace: GPU time by kernel: {}", top.join(", "));
    }
    render_gpu_work(&mut out, gpu, Some(&footer.issuing), "cudatrace: GPU: ");
    if footer.processes == 0 && footer.fatal_errors == 0 {
        let _ = writeln!(
            out,
            "cudatrace: --gpu: no process started GPU recording (none called cuInit, or the \
             driver did not load the injection library)"
        );
    }
    out
}

pub fn render_short(report: &Report) -> String {
    let summary = &report.summary;
    let mut out = String::new();
    let top: Vec<String> = summary
        .functions
        .iter()
        .filter(|f| f.untimed < f.count)
        .take(5)
        .map(|f| format!("{} {} ({})", f.name, format_ns(f.total_ns), f.count))
        .collect();
    if !top.is_empty() {
        let _ = writeln!(out, "cudatrace: time in calls: {}", top.join(", "));
    }
    if summary.kernel_launches > 0 {
        let kernels: Vec<String> = summary
            .kernels
            .iter()
            .take(3)
            .map(|k| {
                format!(
                    "{} ×{} ({:.0}%)",
                    shorten(&k.kernel, 60),
                    k.launches,
                    k.share * 100.0
                )
            })
            .collect();
        let more = summary.kernels.len().saturating_sub(3);
        let _ = writeln!(
            out,
            "cudatrace: {} of {}: {}{}",
            plural(summary.kernel_launches, "launch"),
            plural(summary.kernels.len() as u64, "kernel"),
            kernels.join(", "),
            if more > 0 {
                format!(", {more} more")
            } else {
                String::new()
            }
        );
    }
    if !summary.copies.is_empty() {
        let copies: Vec<String> = summary
            .copies
            .iter()
            .map(|c| format!("{} {} ×{}", c.kind, format_bytes(c.bytes), c.count))
            .collect();
        let _ = writeln!(out, "cudatrace: copies: {}", copies.join(", "));
    }
    for m in report.memory.iter().filter(|m| m.allocations > 0).take(4) {
        let leaks = match m.leak_count {
            0 => "no leaks".to_owned(),
            n => format!(
                "{} ({})",
                plural(n, "leak"),
                format_bytes(m.final_device_bytes + m.final_host_pinned_bytes)
            ),
        };
        let _ = writeln!(
            out,
            "cudatrace: device memory, pid {}: peak {}, final {}, {leaks}",
            m.pid,
            format_bytes(m.peak_device_bytes),
            format_bytes(m.final_device_bytes),
        );
    }
    for p in report
        .stages
        .iter()
        .filter(|p| p.stages.iter().any(|s| s.launches > 0))
        .take(4)
    {
        let stages: Vec<String> = p
            .stages
            .iter()
            .filter(|s| s.duration_ns > 0 || s.calls > 0)
            .map(|s| format!("{} {}", s.name, format_ns(s.duration_ns)))
            .collect();
        let _ = writeln!(
            out,
            "cudatrace: stages, pid {}: {}",
            p.pid,
            stages.join(", ")
        );
    }
    render_driver_short(&mut out, &report.driver);
    if let Some(power) = &report.power {
        power::render_short(&mut out, power);
    }
    out
}
