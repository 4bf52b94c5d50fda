//! `--gpu`: what became of every launch, copy and memset (its GPU work, or why none), the
//! times another CUPTI client held recording, CUDA graphs per replay, and kernel names
//! CUPTI gave differently; in the full summary and in `run`'s closing lines (`prefix`).

use std::fmt::Write as _;

use crate::{
    analysis::gpu::GpuSummary,
    format::{format_ns, plural},
    schema::IssuingCalls,
};

/// The lines, each starting with `prefix`.
pub(super) fn render_gpu_work(
    out: &mut String,
    gpu: &GpuSummary,
    issuing: Option<&IssuingCalls>,
    prefix: &str,
) {
    if let Some(issuing) = issuing.filter(|issuing| issuing.calls > 0) {
        let reasons: Vec<String> = issuing
            .reasons()
            .iter()
            .filter(|(_, count)| *count > 0)
            .map(|(reason, count)| format!("{count} {reason}"))
            .collect();
        let _ = writeln!(
            out,
            "{prefix}{} launches, copies and memsets: {} with GPU work{}{}",
            issuing.calls,
            issuing.with_work,
            if reasons.is_empty() { "" } else { "; " },
            reasons.join(", ")
        );
    } else if gpu.captured_calls > 0 {
        let _ = writeln!(
            out,
            "{prefix}{} captured into graphs (their work runs in the graphs' launches)",
            plural(gpu.captured_calls, "launch, copy or memset")
        );
    }
    for gap in &gpu.gaps {
        let _ = writeln!(
            out,
            "{prefix}another CUPTI client held GPU recording, pid {}: {}{} ({} not recorded{})",
            gap.pid,
            match gap.to_ns {
                Some(to) => format!("for {}", format_ns(to.saturating_sub(gap.from_ns))),
                None => "until the process ended".into(),
            },
            format_args!(
                " from +{}",
                format_ns(gap.from_ns.saturating_sub(gpu.run_start_ns))
            ),
            plural(gap.calls, "call"),
            match gap.handed_over {
                0 => String::new(),
                n => format!(", {n} made before whose records went to it"),
            }
        );
    }
    if gpu.gap_lines as usize > gpu.gaps.len() {
        let _ = writeln!(
            out,
            "{prefix}... {} more times",
            gpu.gap_lines as usize - gpu.gaps.len()
        );
    }
    for graph in gpu.graphs.iter().take(5) {
        let mut per_replay = format!("{:.1} kernels", graph.kernels_per_replay);
        for (count, what) in [(graph.copies, "copies"), (graph.memsets, "memsets")] {
            if count > 0 {
                let _ = write!(
                    per_replay,
                    ", {:.1} {what}",
                    count as f64 / graph.replays.max(1) as f64
                );
            }
        }
        let work = graph.kernels + graph.copies + graph.memsets;
        let _ = writeln!(
            out,
            "{prefix}graph {} (pid {}): {}, {per_replay} and {} of GPU time per launch; {} of {} work lines linked to their captured call",
            graph.graph_id,
            graph.pid,
            plural(graph.replays, "launch"),
            format_ns(graph.gpu_ns_per_replay),
            graph.linked_to_capture,
            work
        );
    }
    if gpu.graphs.len() > 5 {
        let _ = writeln!(out, "{prefix}... {} more graphs", gpu.graphs.len() - 5);
    }
    if gpu.name_mismatches > 0 {
        let _ = writeln!(
            out,
            "{prefix}{} whose CUPTI record names another kernel than its launch (the launch's \
             name is kept; CUPTI's is in cupti_kernel)",
            plural(gpu.name_mismatches, "kernel line")
        );
    }
}
