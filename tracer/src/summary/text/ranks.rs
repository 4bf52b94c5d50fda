//! The cross-rank report as text: the traces and their clocks, then per communicator who
//! waited for whom (its ranks, the stragglers, the longest waits).

use std::fmt::Write as _;

use crate::{
    analysis::ranks::{ClockFit, CommunicatorReport, JobReport},
    format::{format_bytes, format_ns, shorten},
};

/// Collectives listed per communicator, the longest waits first.
const LONGEST_WAITS: usize = 10;

/// The whole job report (`cudatrace summary A B ...`).
pub fn render_job(report: &JobReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Job: {} traces", report.traces.len());
    let _ = writeln!(
        out,
        "  {:<28} {:<16} {:>7} {:>11}  clock (offset to the reference's)",
        "trace", "host", "version", "collectives"
    );
    for trace in &report.traces {
        let _ = writeln!(
            out,
            "  {:<28} {:<16} {:>7} {:>11}  {}",
            shorten(&trace.file, 28),
            shorten(&trace.host, 16),
            trace.version,
            trace.collectives,
            describe_clock(&trace.clock, |i| report.traces[i].file.as_str()),
        );
    }
    render_communicators(&mut out, report);
    out
}

/// The communicators' part alone (a single trace holding several ranks).
pub fn render_communicators(out: &mut String, report: &JobReport) {
    for comm in report.communicators.iter().filter(|c| c.matched > 0) {
        render_communicator(out, comm);
    }
    let unmatched: Vec<&str> = report
        .communicators
        .iter()
        .filter(|c| c.matched == 0)
        .map(|c| c.comm_id.as_str())
        .collect();
    if !unmatched.is_empty() {
        let _ = writeln!(
            out,
            "\nCommunicators with one rank in these traces (nothing to match): {}",
            unmatched.join(", ")
        );
    }
    if !report.notes.is_empty() {
        out.push('\n');
        for note in &report.notes {
            let _ = writeln!(out, "note: {note}");
        }
    }
}

/// `+12.3 µs ± 0.4 µs (30 collectives, to a.jsonl)`, `reference`, `wall clock ...`.
fn describe_clock<'a>(clock: &ClockFit, file: impl Fn(usize) -> &'a str) -> String {
    match clock.method {
        "collectives" => format!(
            "{} ± {} ({} collectives, to {})",
            signed_ns(clock.offset_ns),
            clock.uncertainty_ns.map_or("?".to_owned(), format_ns),
            clock.collectives_used,
            clock.aligned_to.map_or("?", file)
        ),
        "wall clock" => "wall clock (no --gpu collective shared with the others)".into(),
        method => method.to_owned(),
    }
}

fn signed_ns(ns: i64) -> String {
    let sign = if ns < 0 { "-" } else { "+" };
    format!("{sign}{}", format_ns(ns.unsigned_abs()))
}

fn render_communicator(out: &mut String, comm: &CommunicatorReport) {
    let ranks = comm
        .nranks
        .map_or_else(|| "? ranks".to_owned(), |n| format!("{n} ranks"));
    let ready = match comm.ready_from {
        "gpu" => "a rank is ready when its NCCL kernel starts",
        _ => "a rank is ready when it calls (no --gpu)",
    };
    let _ = writeln!(
        out,
        "\nWho waited for whom: communicator {} ({ranks}; {ready})",
        comm.comm_id
    );
    let _ = writeln!(
        out,
        "  {} collectives matched across ranks, {} seen on one rank only{}",
        comm.matched,
        comm.unmatched,
        match comm.mismatched {
            0 => String::new(),
            n => format!(", {n} not matched (ranks called different collectives)"),
        }
    );
    let gpu = comm.ranks.iter().any(|r| r.gpu_busy_ns.is_some());
    let _ = write!(
        out,
        "  {:>5} {:<16} {:>8} {:>6} {:>6} {:>13} {:>11}",
        "rank", "host", "pid", "device", "last", "others waited", "own wait"
    );
    if gpu {
        let _ = write!(out, " {:>11} {:>7} {:>8}", "GPU busy", "of span", "overlap");
    }
    out.push('\n');
    for rank in &comm.ranks {
        let _ = write!(
            out,
            "  {:>5} {:<16} {:>8} {:>6} {:>6} {:>13} {:>11}",
            rank.rank,
            shorten(&rank.host, 16),
            rank.pid,
            rank.device.map_or("-".to_owned(), |d| d.to_string()),
            rank.last,
            format_ns(rank.caused_wait_ns),
            format_ns(rank.waited_ns),
        );
        if gpu {
            let busy = rank.gpu_busy_ns.unwrap_or(0);
            let share = match rank.gpu_span_ns {
                Some(span) if span > 0 => format!("{:.1}%", busy as f64 * 100.0 / span as f64),
                _ => "-".into(),
            };
            let overlap = rank
                .overlap_share
                .map_or("-".into(), |share| format!("{:.1}%", share * 100.0));
            let _ = write!(out, " {:>11} {:>7} {:>8}", format_ns(busy), share, overlap);
        }
        out.push('\n');
    }
    if gpu {
        let _ = writeln!(
            out,
            "  (\"overlap\": the share of its collectives' GPU time its compute kernels ran in)"
        );
    }
    if comm.stragglers.is_empty() {
        let _ = writeln!(out, "  no rank held another back");
    } else {
        let named: Vec<String> = comm
            .stragglers
            .iter()
            .filter_map(|r| comm.ranks.iter().find(|rank| rank.rank == *r))
            .map(|rank| {
                format!(
                    "rank {} ({} in {} collectives)",
                    rank.rank,
                    format_ns(rank.caused_wait_ns),
                    rank.last
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  stragglers, most waited for first: {}",
            named.join(", ")
        );
    }
    let mut longest: Vec<_> = comm
        .collectives
        .iter()
        .filter(|c| c.max_wait_ns > 0)
        .collect();
    longest.sort_by_key(|c| (std::cmp::Reverse(c.max_wait_ns), c.seq));
    if longest.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  longest waits ({} of {}):",
        longest.len().min(LONGEST_WAITS),
        longest.len()
    );
    let _ = writeln!(
        out,
        "  {:>7} {:<14} {:>11} {:>5} {:>11} {:>11} {:>11}",
        "number", "op", "bytes", "last", "wait", "transfer", "busbw"
    );
    for collective in longest.iter().take(LONGEST_WAITS) {
        let _ = writeln!(
            out,
            "  {:>7} {:<14} {:>11} {:>5} {:>11} {:>11} {:>11}",
            collective.seq,
            collective.op,
            format_bytes(collective.bytes),
            collective.last_rank,
            format_ns(collective.max_wait_ns),
            collective.transfer_ns.map_or("-".into(), format_ns),
            collective
                .busbw_gb_s
                .map_or("-".into(), |bw| format!("{bw:.1} GB/s")),
        );
    }
}
