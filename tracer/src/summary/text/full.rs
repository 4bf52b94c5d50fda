//! [`render_text`]: the whole human-readable report (`cudatrace summary`).

use std::fmt::Write as _;

use crate::{
    analysis::{Report, summarise::TraceInfo},
    format::{format_bytes, format_ns, plural},
    summary::power,
};

use super::{
    gpu::render_gpu,
    sections::{render_collectives, render_devices, render_driver},
};

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
    for lost in &info.libraries_not_attached {
        let pid = lost.pid.map_or(String::new(), |pid| format!("pid {pid}: "));
        let why = lost.error.as_deref().unwrap_or("no reason given");
        let _ = writeln!(
            out,
            "  NOT ATTACHED: {pid}{}: its calls are missing ({why})",
            lost.library
        );
    }
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
        // Times count from the first call, or, without calls, from the trace's start.
        let origin = match summary.calls {
            0 => info.start_monotonic_ns.unwrap_or(0),
            _ => summary.first_ts_ns,
        };
        power::render(&mut out, power, &report.stages, origin);
    }
    out
}
