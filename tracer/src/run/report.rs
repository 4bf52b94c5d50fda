//! The closing report on stderr, once the footer is written: what was recorded and where,
//! what was lost and why, `--power`'s troubles, calls that never returned, a run that
//! found no library, and (unless `-q`) the short summary.

use super::{loss::LossAccount, outcome::Outcome};
use crate::{
    analysis::Report,
    power::sampler::describe_errors,
    probes::probe_set::PROBE_SETS,
    schema::{Footer, PowerFooter, StacksFooter},
    summary::text::{render_gpu_short, render_short},
};

/// How the run went, as the closing report tells it.
pub struct Closing<'a> {
    pub footer: &'a Footer,
    pub report: &'a Report,
    pub exit: Outcome,
    /// Some traced process loaded a probe-set library.
    pub loaded_any: bool,
    /// Where the trace went (`stdout` for `-o -`).
    pub output_label: &'a str,
}

/// What the closing report is asked for, from the flags.
#[derive(Clone, Copy)]
pub struct ReportFlags {
    /// `-q`: no window figures, no short summary.
    pub quiet: bool,
    /// `--ring-kib`, for the hint when the ring refused records.
    pub ring_kib: u32,
}

/// Prints the closing report.
pub fn print(flags: ReportFlags, closing: &Closing) {
    let Closing {
        footer,
        report,
        exit,
        loaded_any,
        output_label,
    } = closing;
    let lost = footer.lost.total;
    eprintln!(
        "cudatrace: {} calls, {} lost, {} process events -> {output_label}{}",
        footer.events.call,
        lost,
        footer.events.process,
        exit.describe()
    );
    if let (Some(window), false) = (&footer.window, flags.quiet) {
        eprintln!(
            "cudatrace: the window left out {} lines before it and {} after it (analysed, not \
             written: the figures below count them)",
            window.lines_before, window.lines_after
        );
    }
    if let Some(reasons) = LossAccount::describe(&footer.lost) {
        // Only what the ring refused grows with a larger ring (not CUPTI's own drops).
        let ring_refused = footer.lost.ring_full
            + footer.lost.process_ring_full
            + footer.lost.driver_ring_full
            + footer.lost.gpu_ring_full.unwrap_or(0);
        let hint = if ring_refused > 0 {
            format!(
                "; try --ring-kib {}",
                flags.ring_kib.saturating_mul(4).min(1 << 20)
            )
        } else {
            String::new()
        };
        eprintln!("cudatrace: WARNING: {lost} events lost ({reasons}){hint}");
    }
    if let Some(power) = &footer.power {
        warn_power(power);
    }
    if let Some(stacks) = &footer.stacks {
        say_stacks(stacks, footer.events.stack);
    }
    if footer.abandoned_calls > 0 {
        eprintln!(
            "cudatrace: {} calls never returned (longjmp or an exception through the library): \
             they have no line",
            footer.abandoned_calls
        );
    }
    if !loaded_any {
        eprintln!(
            "cudatrace: WARNING: no traced process loaded {}: nothing to trace. Does the \
             program use the GPU? A library under another name can be given with --lib PATH",
            PROBE_SETS
                .iter()
                .filter(|set| !set.run_private)
                .map(|set| set.library)
                .collect::<Vec<_>>()
                .join(" or ")
        );
    }
    if !flags.quiet {
        eprint!("{}", render_short(report));
        if let Some(gpu) = &footer.gpu {
            eprint!("{}", render_gpu_short(&report.gpu, gpu));
        }
    }
}

/// `--power`: what the sampler could not do (also in the footer and summary).
fn warn_power(power: &PowerFooter) {
    if let Some(error) = &power.error {
        eprintln!("cudatrace: WARNING: --power: {error}");
    }
    if !power.read_errors.is_empty() {
        eprintln!(
            "cudatrace: WARNING: --power: NVML errors while sampling (those fields are missing \
             from those samples): {}",
            describe_errors(&power.read_errors)
        );
    }
    if power.dropped_samples > 0 {
        eprintln!(
            "cudatrace: WARNING: --power: {} samples dropped: the event loop fell behind",
            power.dropped_samples
        );
    }
    if power.skipped_ticks > 0 {
        eprintln!(
            "cudatrace: --power: {} ticks skipped: reading NVML took longer than the period \
             (up to {} µs a GPU)",
            power.skipped_ticks,
            power.read_ns_max / 1000
        );
    }
}

/// `--stacks`: how many calls got their stack, and why the others did not.
fn say_stacks(stacks: &StacksFooter, distinct: u64) {
    let without = &stacks.without;
    let reasons = without.said();
    let cut = if stacks.cut > 0 {
        format!(", {} cut at the frame budget", stacks.cut)
    } else {
        String::new()
    };
    let none = if reasons.is_empty() {
        String::new()
    } else {
        format!("; {} calls without one: {reasons}", without.total())
    };
    eprintln!(
        "cudatrace: stacks: {} calls with a Python stack ({distinct} distinct{cut}){none}",
        stacks.calls
    );
}
