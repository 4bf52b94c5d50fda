//! The summary as text: the whole report (`cudatrace summary`), the few lines
//! `cudatrace run` prints at the end, and the `--json` object.

use std::fmt::Write as _;

use serde::Serialize;

use crate::{
    analysis::{
        Report, devices::DevicesSummary, driver::DriverSummary, gpu::GpuSummary,
        nccl::CollectivesSummary, power::PowerReport, stages::ProcessStages, summarise::TraceInfo,
        summary::Summary,
    },
    format::{format_bytes, format_ns, plural, shorten},
    schema::{GpuFooter, ProcessMemory},
};

/// `cudatrace summary --json`.
#[derive(Serialize)]
pub struct SummaryJson<'a> {
    pub trace: &'a TraceInfo,
    #[serde(flatten)]
    pub summary: &'a Summary,
    pub memory: &'a [ProcessMemory],
    pub stages: &'a [ProcessStages],
    /// Present for `--kernel` traces.
    #[serde(skip_serializing_if = "is_empty_driver")]
    pub driver: &'a DriverSummary,
    /// Present for `--gpu` traces.
    #[serde(skip_serializing_if = "is_empty_gpu")]
    pub gpu: &'a GpuSummary,
    /// Present for `--power` traces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power: Option<&'a PowerReport>,
    /// Present for traces with NCCL collectives.
    #[serde(skip_serializing_if = "is_empty_collectives")]
    pub collectives: &'a CollectivesSummary,
    /// Present when calls went to more than one device.
    #[serde(skip_serializing_if = "single_device")]
    pub devices: &'a DevicesSummary,
}

fn single_device(devices: &&DevicesSummary) -> bool {
    devices.rows.len() < 2
}

/// The devices section, when calls went to more than one device.
fn render_devices(out: &mut String, devices: &DevicesSummary) {
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

fn is_empty_collectives(collectives: &&CollectivesSummary) -> bool {
    collectives.rows.is_empty()
}

/// The collectives section: per communicator, rank and op.
fn render_collectives(out: &mut String, collectives: &CollectivesSummary) {
    if collectives.rows.is_empty() {
        return;
    }
    let gpu = collectives.rows.iter().any(|row| row.gpu_ns.is_some());
    let _ = writeln!(out, "\nNCCL collectives, by communicator and rank");
    let _ = write!(
        out,
        "  {:<18} {:>9} {:>8} {:<14} {:>7} {:>6} {:>11} {:>10}",
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
            "  {:<18} {:>9} {:>8} {:<14} {:>7} {:>6} {:>11} {:>10}",
            shorten(&row.communicator, 18),
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
                "  {:<18} {:>9} {:>8} ran as {} inside it ({} calls, counted once, here)",
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

fn is_empty_gpu(gpu: &&GpuSummary) -> bool {
    gpu.work == 0 && gpu.processes.is_empty() && gpu.errors.is_empty()
}

fn is_empty_driver(driver: &&DriverSummary) -> bool {
    driver.events == 0
}

fn render_driver(out: &mut String, driver: &DriverSummary) {
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

fn dims(d: [u32; 3]) -> String {
    format!("{}x{}x{}", d[0], d[1], d[2])
}

/// The full human-readable summary (`cudatrace summary`).
pub fn render_text(info: &TraceInfo, report: &Report) -> String {
    let summary = &report.summary;
    let at = |ts: u64| format!("+{}", format_ns(ts.saturating_sub(summary.first_ts_ns)));
    let mut out = String::new();
    let state = if info.complete {
        "complete"
    } else {
        "TRUNCATED: no footer"
    };
    let _ = writeln!(out, "Trace {} ({state})", info.file);
    if !info.command.is_empty() {
        let _ = writeln!(out, "  command: {}", info.command.join(" "));
    }
    let _ = writeln!(
        out,
        "  {} ({} errors) in {} over {}; {} lost events",
        plural(summary.calls, "call"),
        summary.errors,
        plural(summary.pids.len() as u64, "process"),
        format_ns(summary.span_ns),
        info.lost_events
    );
    if info.skipped_lines > 0 {
        let _ = writeln!(out, "  {} malformed lines skipped", info.skipped_lines);
    }

    let _ = writeln!(out, "\nFunctions, by total time");
    let _ = writeln!(
        out,
        "  {:<30} {:>8} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10}",
        "function", "calls", "errors", "total", "mean", "p50", "p99", "max", "bytes", "bandwidth"
    );
    let or_na = |value: Option<u64>| value.map_or_else(|| "n/a".to_owned(), format_ns);
    for f in &summary.functions {
        // Calls probed at entry alone have no duration and no result.
        let untimed = f.untimed == f.count;
        let _ = writeln!(
            out,
            "  {:<30} {:>8} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>10}",
            f.name,
            f.count,
            if untimed {
                "n/a".to_owned()
            } else {
                f.errors.to_string()
            },
            if untimed {
                "n/a".to_owned()
            } else {
                format_ns(f.total_ns)
            },
            or_na(f.mean_ns),
            or_na(f.p50_ns),
            or_na(f.p99_ns),
            or_na(f.max_ns),
            f.bytes.map(format_bytes).unwrap_or_default(),
            f.bandwidth_gb_s
                .map(|b| format!("{b:.2} GB/s"))
                .unwrap_or_default(),
        );
    }

    if summary.functions.iter().any(|f| f.untimed > 0) {
        let _ = writeln!(
            out,
            "  n/a: probed at entry only (--launch-entry-only): no duration, no return code \
             (failed launches count as launches)"
        );
    }

    let _ = writeln!(
        out,
        "\nKernels: {} in {}{}",
        plural(summary.kernel_launches, "launch"),
        plural(summary.kernels.len() as u64, "kernel"),
        match summary.graph_launches {
            0 => String::new(),
            n => format!(", plus {}", plural(n, "graph launch")),
        }
    );
    for k in &summary.kernels {
        let _ = writeln!(
            out,
            "  {:>8} {:>6.1}%  {}",
            k.launches,
            k.share * 100.0,
            k.kernel
        );
        let mut shapes: Vec<String> = k
            .shapes
            .iter()
            .map(|s| {
                format!(
                    "grid {} block {} ×{}",
                    dims(s.grid),
                    dims(s.block),
                    s.launches
                )
            })
            .collect();
        if k.other_shapes > 0 {
            shapes.push(format!("other shapes ×{}", k.other_shapes));
        }
        let _ = writeln!(out, "  {:>17}  {}", "", shapes.join("; "));
    }

    let _ = writeln!(out, "\nCopies, by direction");
    if summary.copies.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for c in &summary.copies {
        let _ = writeln!(
            out,
            "  {:<8} {:>8} {:>12}  ({} B)",
            c.kind,
            plural(c.count, "call"),
            format_bytes(c.bytes),
            c.bytes
        );
    }

    let _ = writeln!(
        out,
        "\nDevice memory (cuMemAlloc* and cuMemCreate bytes held), by process"
    );
    for m in &report.memory {
        let _ = writeln!(
            out,
            "  pid {}: peak {} at {}, final {}; {}, {}, {} unmatched frees",
            m.pid,
            format_bytes(m.peak_device_bytes),
            at(m.peak_ts_ns),
            format_bytes(m.final_device_bytes),
            plural(m.allocations, "allocation"),
            plural(m.frees, "free"),
            m.unmatched_frees
        );
        if m.peak_host_pinned_bytes > 0 || m.peak_mapped_bytes > 0 {
            let _ = writeln!(
                out,
                "    host pinned: peak {}, final {}; mapped: peak {}, final {}",
                format_bytes(m.peak_host_pinned_bytes),
                format_bytes(m.final_host_pinned_bytes),
                format_bytes(m.peak_mapped_bytes),
                format_bytes(m.final_mapped_bytes)
            );
        }
        let _ = writeln!(out, "    {}", plural(m.leak_count, "leak"));
        for leak in m.leaks.iter().take(20) {
            let address = leak.dptr.or(leak.handle).or(leak.host).unwrap_or_default();
            let _ = writeln!(
                out,
                "      {} B {} {:#x} from {} at {}",
                leak.bytes,
                leak.kind,
                address.0,
                leak.call,
                at(leak.ts_ns)
            );
        }
        if m.leak_count > 20 {
            let _ = writeln!(out, "      ... and {} more", m.leak_count - 20);
        }
    }

    for p in &report.stages {
        let _ = writeln!(out, "\nStages, pid {} ({})", p.pid, plural(p.calls, "call"));
        let gpu = p.stages.iter().any(|s| s.gpu_busy_ns.is_some());
        let _ = writeln!(
            out,
            "  {:<18} {:>11} {:>11} {:>7} {:>8} {:>11} {:>11}{}",
            "stage",
            "start",
            "duration",
            "calls",
            "launches",
            "HtoD",
            "DtoH",
            if gpu { "    GPU busy" } else { "" }
        );
        for s in &p.stages {
            let busy = match s.gpu_busy_ns {
                Some(busy) => format!(
                    " {:>11}",
                    format!("{:.1}%", busy as f64 * 100.0 / s.duration_ns.max(1) as f64)
                ),
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "  {:<18} {:>11} {:>11} {:>7} {:>8} {:>11} {:>11}{busy}",
                s.name,
                at(s.start_ns),
                format_ns(s.duration_ns),
                s.calls,
                s.launches,
                format_bytes(s.htod_bytes),
                format_bytes(s.dtoh_bytes)
            );
        }
    }
    render_devices(&mut out, &report.devices);
    render_collectives(&mut out, &report.collectives);
    render_driver(&mut out, &report.driver);
    render_gpu(&mut out, &report.gpu);
    if let Some(power) = &report.power {
        super::power::render(&mut out, power, &report.stages, summary.first_ts_ns);
    }
    out
}

fn copies(n: u64) -> String {
    format!("{n} {}", if n == 1 { "copy" } else { "copies" })
}

fn percent(part: u64, whole: u64) -> String {
    format!("{:.1}%", part as f64 * 100.0 / whole.max(1) as f64)
}

/// The `--gpu` section of the full summary.
fn render_gpu(out: &mut String, gpu: &GpuSummary) {
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
            "  pid {}: CUPTI {} ({}), times {}",
            info.pid, info.cupti_version, info.libcupti, info.clock
        );
    }
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
        super::power::render_short(&mut out, power);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{analysis::testing::Script, schema::Hex};

    #[test]
    fn text_output_names_everything() {
        let mut script = Script::new(5);
        script
            .plain("cuInit")
            .alloc(0x7f00_0000_0000, 262144)
            .copy("cuMemcpyHtoD_v2", "HtoD", 262144)
            .call("cuModuleGetFunction", |r| {
                r.function = Some(Hex(0x10));
                r.symbol = Some("_Z10vector_addPKfS0_Pfi".into());
            })
            .launch(0x10);
        let report = script.report();
        let info = TraceInfo {
            file: "t.jsonl".into(),
            complete: true,
            ..TraceInfo::default()
        };
        let text = render_text(&info, &report);
        for needle in [
            "Trace t.jsonl (complete)",
            "5 calls (0 errors) in 1 process",
            "vector_add(float const*, float const*, float*, int)",
            "grid 1x1x1 block 32x1x1 ×1",
            "HtoD       1 call   256.00 KiB  (262144 B)",
            "pid 5: peak 256.00 KiB at +1.0 µs, final 256.00 KiB",
            "262144 B device 0x7f0000000000 from cuMemAlloc_v2 at +1.0 µs",
            "input preparation",
        ] {
            assert!(text.contains(needle), "{needle:?} not in\n{text}");
        }
        let short = render_short(&report);
        assert_eq!(short.lines().count(), 5, "{short}");
        assert!(short.contains(
            "cudatrace: 1 launch of 1 kernel: vector_add(float const*, float const*, float*, int) ×1 (100%)"
        ));
        assert!(short.contains("peak 256.00 KiB, final 256.00 KiB, 1 leak (256.00 KiB)"));
    }
}
