//! The `--gpu` section of the full summary: linking, busy time and idle gaps per device,
//! launch-to-start latency, GPU time by kernel, copies' bandwidth.

use std::fmt::Write as _;

use crate::{
    analysis::gpu::GpuSummary,
    format::{format_bytes, format_ns, plural},
};

use super::{copies, gpu_work::render_gpu_work, percent};

/// The `--gpu` section of the full summary.
pub(super) fn render_gpu(out: &mut String, gpu: &GpuSummary) {
    if gpu.work == 0 && gpu.processes.is_empty() && gpu.errors.is_empty() {
        return;
    }
    let at = |ts: u64| format!("+{}", format_ns(ts.saturating_sub(gpu.run_start_ns)));
    let _ = writeln!(
        out,
        "\nGPU (--gpu): {}, {}, {}; {} linked to their call, {} not{}",
        plural(gpu.kernels, "kernel"),
        copies(gpu.copies),
        plural(gpu.memsets, "memset"),
        gpu.linked,
        gpu.unlinked,
        match gpu.untimed {
            0 => String::new(),
            n => format!("; {n} without GPU times"),
        }
    );
    for info in &gpu.processes {
        let _ = writeln!(
            out,
            "  pid {}: CUPTI {} ({}), times {}{}",
            info.pid,
            info.cupti_version,
            info.libcupti,
            info.clock,
            match info.subscribers.as_ref() {
                "multiple" => ", a subscriber of its own beside others",
                _ => "",
            }
        );
    }
    render_gpu_work(out, gpu, gpu.issuing.as_ref(), "  ");
    for error in &gpu.errors {
        let _ = writeln!(
            out,
            "  pid {}: {}ERROR ({}): {}",
            error.pid,
            if error.fatal { "FATAL " } else { "" },
            error.stage,
            error.message
        );
    }
    for device in &gpu.devices {
        let _ = writeln!(
            out,
            "  device {}: busy {} of the run's {} ({}), {} of work from {} to {}{}",
            device.device,
            format_ns(device.busy_ns),
            format_ns(gpu.run_ns),
            percent(device.busy_ns, gpu.run_ns),
            plural(device.work, "piece"),
            at(device.first_ns),
            at(device.last_end_ns),
            match device.late_ns {
                0 => String::new(),
                late => format!(" ({} of work came too late to count)", format_ns(late)),
            }
        );
        if !device.gaps.is_empty() {
            let _ = writeln!(out, "    largest idle gaps, and the CPU meanwhile:");
        }
        for gap in &device.gaps {
            let mut line = format!(
                "    {:>10} at {:>11}",
                format_ns(gap.duration_ns),
                at(gap.start_ns)
            );
            if let Some(cpu) = &gap.cpu {
                let functions: Vec<String> = cpu
                    .functions
                    .iter()
                    .map(|f| format!("{} {} ×{}", f.name, format_ns(f.in_gap_ns), f.calls))
                    .collect();
                line.push_str(&format!(
                    ": {} in driver calls ({}){}{}",
                    format_ns(cpu.in_calls_ns),
                    percent(cpu.in_calls_ns, gap.duration_ns),
                    if functions.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", functions.join(", "))
                    },
                    if cpu.stages.is_empty() {
                        String::new()
                    } else {
                        format!("; {}", cpu.stages.join(", "))
                    }
                ));
            }
            let _ = writeln!(out, "{line}");
        }
    }
    if let Some(queued) = &gpu.queued {
        let _ = writeln!(
            out,
            "  launch to GPU start: p50 {}, p99 {}, max {} ({} started before their call returned)",
            format_ns(queued.p50_ns),
            format_ns(queued.p99_ns),
            format_ns(queued.max_ns),
            queued.started_before_return
        );
    }
    if !gpu.kernel_time.is_empty() {
        let _ = writeln!(out, "\n  GPU time by kernel");
        let _ = writeln!(
            out,
            "  {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}  kernel",
            "count", "total", "mean", "p50", "p99", "max", "busy"
        );
        for k in &gpu.kernel_time {
            let _ = writeln!(
                out,
                "  {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}  {}",
                k.count,
                format_ns(k.total_ns),
                format_ns(k.mean_ns),
                format_ns(k.p50_ns),
                format_ns(k.p99_ns),
                format_ns(k.max_ns),
                format!("{:.1}%", k.share_of_busy * 100.0),
                k.kernel
            );
        }
    }
    let transfers: Vec<_> = gpu.copy_time.iter().chain(&gpu.memset_time).collect();
    if !transfers.is_empty() {
        let _ = writeln!(out, "\n  Copies and memsets on the GPU");
        for t in transfers {
            let _ = writeln!(
                out,
                "  {:<8} {:>8} {:>11} in {:>10}  {}",
                t.kind,
                t.count,
                format_bytes(t.bytes),
                format_ns(t.gpu_ns),
                t.bandwidth_gb_s
                    .map(|b| format!("{b:.2} GB/s"))
                    .unwrap_or_default()
            );
        }
    }
}
