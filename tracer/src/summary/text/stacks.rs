//! The summary's `--stacks` sections: by layer, by Python line and by the user's line.

use std::fmt::Write as _;

use crate::{
    analysis::stacks::{
        StackFigures,
        rows::{NO_FRAME, NO_LAYER, NO_STACK, NO_USER_FRAME, StackRow, StacksSummary},
    },
    format::{format_bytes, format_ns, plural},
};

/// Rows listed per table (the special rows and the total always are); `--json` has all.
const LISTED: usize = 20;

fn is_special(row: &StackRow) -> bool {
    [NO_STACK, NO_LAYER, NO_USER_FRAME, NO_FRAME].contains(&row.name.as_str())
}

fn header(out: &mut String, gpu: bool) {
    let _ = write!(
        out,
        "  {:>8} {:>10} {:>8} {:>10} {:>10} {:>11}",
        "calls", "time", "launches", "copied", "allocated", "live at end"
    );
    if gpu {
        let _ = write!(out, " {:>10} {:>7}", "GPU time", "kernels");
    }
    let _ = writeln!(out, "  name");
}

fn row(out: &mut String, name: &str, figures: &StackFigures, gpu: bool) {
    let _ = write!(
        out,
        "  {:>8} {:>10} {:>8} {:>10} {:>10} {:>11}",
        figures.calls,
        format_ns(figures.time_ns),
        figures.launches,
        format_bytes(figures.copied_bytes),
        format_bytes(figures.allocated_bytes),
        format_bytes(figures.live_bytes),
    );
    if gpu {
        let _ = write!(
            out,
            " {:>10} {:>7}",
            format_ns(figures.gpu_ns),
            figures.gpu_kernels
        );
    }
    let _ = writeln!(out, "  {name}");
}

fn table(out: &mut String, title: &str, rows: &[StackRow], stacks: &StacksSummary) {
    let _ = writeln!(out, "\n{title}");
    header(out, stacks.gpu);
    let (special, named): (Vec<&StackRow>, Vec<&StackRow>) =
        rows.iter().partition(|row| is_special(row));
    for r in named.iter().take(LISTED) {
        let name = match &r.function {
            // A line: `FILE:LINE (function)`.
            Some(function) if r.line.is_some() || r.first_line.is_none() => {
                format!("{} ({function})", r.name)
            }
            _ => r.name.clone(),
        };
        row(out, &name, &r.figures, stacks.gpu);
    }
    if named.len() > LISTED {
        let mut rest = StackFigures::default();
        for r in &named[LISTED..] {
            rest.add(&r.figures);
        }
        let more = format!("... {} more (--json lists every row)", named.len() - LISTED);
        row(out, &more, &rest, stacks.gpu);
    }
    for r in special {
        row(out, &r.name, &r.figures, stacks.gpu);
    }
    row(out, "total", &stacks.total, stacks.gpu);
}

/// The three tables of a `--stacks` trace.
pub fn render_stacks(out: &mut String, stacks: &StacksSummary) {
    let counts = &stacks.counts;
    let _ = writeln!(
        out,
        "\nPython stacks: {} with a stack ({} cut at the frame budget), {}",
        plural(counts.calls_with_stack, "call"),
        counts.cut,
        plural(stacks.stacks, "distinct stack"),
    );
    if let Some(without) = stacks.without.filter(|without| without.total() > 0) {
        let _ = writeln!(
            out,
            "  {} of the chosen families without a stack (the trace's footer): {}",
            plural(without.total(), "call"),
            without.said()
        );
    }
    if let Some(records) = stacks
        .stack_records
        .filter(|records| records.known + records.sent_whole > 0)
    {
        let _ = writeln!(
            out,
            "  Stack records (the trace's footer): {} known to the probes (their hash alone, \
             {} of them in their call's own record), {} sent whole ({} of them a stack sent \
             before)",
            records.known, records.known_in_call, records.sent_whole, records.sent_again
        );
    }
    if stacks.every > 1 {
        let _ = writeln!(
            out,
            "  Sampled (--stack-every {every}): a call's stack was read at random, 1 in {every}; \
             the rows by layer and line are estimates ({every} times their sampled calls' \
             figures) and {NO_STACK} the rest of the totals; the totals are exact",
            every = stacks.every
        );
    }
    if stacks
        .without
        .is_some_and(|without| without.rate_limited > 0)
    {
        let _ = writeln!(
            out,
            "  Rate-limited (--stack-rate): the rows by layer and line are the stacked calls' \
             own figures, not estimates (which calls were left out depends on timing), and \
             {NO_STACK} holds the rate-limited calls; the totals are exact"
        );
    }
    if counts.unknown_stack > 0 {
        let _ = writeln!(
            out,
            "  {} named a stack the trace does not have: counted under {NO_STACK}",
            plural(counts.unknown_stack, "call")
        );
    }
    if counts.duplicate_stack_ids > 0 {
        let _ = writeln!(
            out,
            "  {} repeated an id seen before: the first line of each id was kept",
            plural(counts.duplicate_stack_ids, "stack line")
        );
    }
    if stacks.gpu {
        let _ = writeln!(
            out,
            "  GPU time: each kernel's, to its launch's stack; {NO_STACK}: {} whose call has \
             none, {} linked to no call",
            plural(counts.kernels_call_without_stack, "kernel"),
            counts.kernels_without_call
        );
    }
    table(
        out,
        "By layer (the innermost torch.nn.Module forward, by the class defining it)",
        &stacks.layers,
        stacks,
    );
    table(
        out,
        "By Python line (the innermost frame)",
        &stacks.lines,
        stacks,
    );
    table(
        out,
        "By your line (the innermost frame outside torch, installed packages and the \
         standard library)",
        &stacks.user_lines,
        stacks,
    );
}

#[cfg(test)]
mod tests {
    use super::render_stacks;
    use crate::{
        analysis::{
            stacks::{
                StackFigures,
                rows::{NO_STACK, StacksSummary},
            },
            summarise::summarise,
        },
        reader::TraceLines,
        test_traces::stacks,
    };

    fn rendered(text: &str) -> (String, StacksSummary) {
        let summarised =
            summarise(|| Ok(TraceLines::new(text.as_bytes(), "stacks.jsonl", false))).unwrap();
        let summary = summarised.report.stacks.unwrap().summary();
        let mut out = String::new();
        render_stacks(&mut out, &summary);
        (out, summary)
    }

    #[test]
    fn a_rate_limited_trace_says_its_rows_are_the_stacked_calls_own() {
        let (whole, whole_summary) = rendered(&stacks());
        assert!(!whole.contains("Rate-limited"), "{whole}");
        let limited = stacks()
            .replace(r#""depth":64}"#, r#""depth":64,"rate":10}"#)
            .replace(
                r#"{"type":"footer"}"#,
                r#"{"type":"footer","stacks":{"calls":12,"cut":1,"without":{"rate_limited":5}}}"#,
            );
        let (text, summary) = rendered(&limited);
        assert!(
            text.contains(
                "  5 calls of the chosen families without a stack (the trace's footer): rate \
                 limited (--stack-rate) 5\n  Rate-limited (--stack-rate): the rows by layer and \
                 line are the stacked calls' own figures, not estimates (which calls were left \
                 out depends on timing), and (no stack) holds the rate-limited calls; the \
                 totals are exact\n"
            ),
            "{text}"
        );
        // Not scaled: the rows are those of the trace read whole.
        assert_eq!(summary.layers, whole_summary.layers);
        assert_eq!(summary.lines, whole_summary.lines);
        assert_eq!(summary.total, whole_summary.total);
    }

    #[test]
    fn a_sampled_trace_says_its_rows_are_estimates_and_why_calls_have_no_stack() {
        let (whole, whole_summary) = rendered(&stacks());
        let whole_json = serde_json::to_string(&whole_summary).unwrap();
        assert!(!whole.contains("Sampled"), "{whole}");
        assert!(!whole_json.contains(r#""every""#), "{whole_json}");

        assert!(!whole.contains("without a stack"), "{whole}");
        assert!(!whole_json.contains(r#""without""#), "{whole_json}");

        // The footer's reasons for the calls without a stack are said too.
        let sampled = stacks()
            .replace(r#""depth":64}"#, r#""depth":64,"every":4}"#)
            .replace(
                r#"{"type":"footer"}"#,
                r#"{"type":"footer","stacks":{"calls":12,"cut":1,"without":{"no_thread_state":1,"sampled_out":2}}}"#,
            );
        assert_ne!(sampled, stacks());
        let (text, summary) = rendered(&sampled);
        assert!(
            text.contains(
                "  3 calls of the chosen families without a stack (the trace's footer): no \
                 thread state (a thread Python did not start) 1, sampled out (--stack-every) 2\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "  Sampled (--stack-every 4): a call's stack was read at random, 1 in 4; the \
                 rows by layer and line are estimates (4 times their sampled calls' figures) \
                 and (no stack) the rest of the totals; the totals are exact\n"
            ),
            "{text}"
        );
        let json = serde_json::to_string(&summary).unwrap();
        assert!(
            json.contains(
                r#""without":{"not_python":0,"unsupported_python":0,"not_initialized":0,"no_thread_state":1,"ambiguous_thread_state":0,"no_python_frames":0,"read_fault":0,"code_unresolved":0,"record_lost":0,"sampled_out":2},"gpu":true,"every":4,"#
            ),
            "{json}"
        );
        // The totals and counts are the trace's; each row with a stack is 4 times its
        // figures, and "(no stack)" the rest of the totals.
        assert_eq!(summary.total, whole_summary.total);
        assert_eq!(summary.counts, whole_summary.counts);
        for (rows, whole_rows) in [
            (&summary.layers, &whole_summary.layers),
            (&summary.lines, &whole_summary.lines),
            (&summary.user_lines, &whole_summary.user_lines),
        ] {
            let mut estimated = StackFigures::default();
            for (row, whole_row) in rows.iter().zip(whole_rows) {
                assert_eq!(row.name, whole_row.name);
                if row.name == NO_STACK {
                    continue;
                }
                assert_eq!(row.figures.calls, 4 * whole_row.figures.calls);
                assert_eq!(row.figures.time_ns, 4 * whole_row.figures.time_ns);
                assert_eq!(row.figures.gpu_ns, 4 * whole_row.figures.gpu_ns);
                estimated.add(&row.figures);
            }
            // Absent where the estimates reach the totals.
            let no_stack = rows
                .iter()
                .find(|row| row.name == NO_STACK)
                .map_or(StackFigures::default(), |row| row.figures);
            assert_eq!(
                no_stack.calls,
                summary.total.calls.saturating_sub(estimated.calls)
            );
            assert_eq!(
                no_stack.time_ns,
                summary.total.time_ns.saturating_sub(estimated.time_ns)
            );
        }
    }
}
