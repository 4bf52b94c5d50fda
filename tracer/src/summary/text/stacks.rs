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
    if stacks.every > 1 {
        let _ = writeln!(
            out,
            "  Sampled (--stack-every {every}): each thread's stack was read at 1 in {every} \
             of its calls; the rows by layer and line are the sampled calls' figures (about \
             1/{every} of the totals), the others count under {NO_STACK}",
            every = stacks.every
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
    use crate::{analysis::summarise::summarise, reader::TraceLines, test_traces::stacks};

    fn rendered(text: &str) -> (String, String) {
        let summarised =
            summarise(|| Ok(TraceLines::new(text.as_bytes(), "stacks.jsonl", false))).unwrap();
        let summary = summarised.report.stacks.unwrap().summary();
        let mut out = String::new();
        render_stacks(&mut out, &summary);
        (out, serde_json::to_string(&summary).unwrap())
    }

    #[test]
    fn a_sampled_trace_says_its_rows_are_the_sampled_calls() {
        let (whole, whole_json) = rendered(&stacks());
        assert!(!whole.contains("Sampled"), "{whole}");
        assert!(!whole_json.contains(r#""every""#), "{whole_json}");

        let sampled = stacks().replace(r#""depth":64}"#, r#""depth":64,"every":4}"#);
        assert_ne!(sampled, stacks());
        let (text, json) = rendered(&sampled);
        assert!(
            text.contains(
                "  Sampled (--stack-every 4): each thread's stack was read at 1 in 4 of its \
                 calls; the rows by layer and line are the sampled calls' figures (about 1/4 of \
                 the totals), the others count under (no stack)\n"
            ),
            "{text}"
        );
        assert!(json.contains(r#""gpu":true,"every":4,"#), "{json}");
        // Otherwise the same tables: the same lines summed.
        let without_note: String = text
            .lines()
            .filter(|line| !line.starts_with("  Sampled"))
            .map(|line| format!("{line}\n"))
            .collect();
        assert_eq!(without_note, whole);
    }
}
