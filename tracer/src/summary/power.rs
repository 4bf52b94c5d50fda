//! `--power` traces in the summary: energy and power per GPU and for the run, the power
//! before the first launch, energy per stage and per kernel name.

use std::fmt::Write as _;

use crate::{
    analysis::{
        power::{KernelEnergyReport, PowerReport},
        stages::ProcessStages,
    },
    format::{format_ns, plural, shorten},
};

/// Kernels listed in the energy table.
const KERNELS_SHOWN: usize = 25;

fn joules(j: f64) -> String {
    if j.abs() >= 1000.0 {
        format!("{:.1} kJ", j / 1e3)
    } else {
        format!("{j:.3} J")
    }
}

/// The full section (`cudatrace summary`).
pub fn render(out: &mut String, power: &PowerReport, stages: &[ProcessStages], first_ts: u64) {
    // Samples start before the first call: their times can be negative.
    let at = |ts: u64| match ts.checked_sub(first_ts) {
        Some(after) => format!("+{}", format_ns(after)),
        None => format!("-{}", format_ns(first_ts - ts)),
    };
    let period = power
        .period_ms
        .map_or(String::new(), |ms| format!(", a sample every {ms} ms"));
    let nvml = match &power.nvml {
        Some(nvml) if nvml.standin => format!(
            "; NVML {} (cudatrace STAND-IN, not NVIDIA's NVML)",
            nvml.path
        ),
        Some(nvml) => format!(
            "; NVML {} {}, driver {}",
            nvml.path, nvml.version, nvml.driver_version
        ),
        None => String::new(),
    };
    let _ = writeln!(
        out,
        "\nEnergy (--power: {}{period}{nvml})",
        plural(power.devices.len() as u64, "GPU")
    );
    if let Some(command) = &power.command {
        let _ = writeln!(
            out,
            "  the command (its first exec to its last exit): {} over {}, mean {:.1} W",
            joules(command.energy_j),
            format_ns(command.duration_ns),
            command.mean_w,
        );
    }
    let margins = match (&power.before_command, &power.after_command) {
        (Some(before), Some(after)) => format!(
            "; outside the command: {} before, {} after",
            joules(before.energy_j),
            joules(after.energy_j)
        ),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "  {}: {} over {}, mean {:.1} W, peak {:.1} W at {}{margins}",
        if power.command.is_some() {
            "all samples"
        } else {
            "all GPUs"
        },
        joules(power.energy_j),
        format_ns(power.duration_ns),
        power.mean_w,
        power.peak_w,
        at(power.peak_ts_ns)
    );
    let _ = writeln!(
        out,
        "  {:<4} {:<32} {:<17} {:>8} {:>12}{} {:>10} {:>10} {:>12} {:>10} {:>7}",
        "GPU",
        "name",
        "energy from",
        "samples",
        "energy",
        if power.command.is_some() {
            format!(" {:>12}", "command")
        } else {
            String::new()
        },
        "mean",
        "peak",
        "integrated",
        "read",
        "errors"
    );
    for d in &power.devices {
        let _ = writeln!(
            out,
            "  {:<4} {:<32} {:<17} {:>8} {:>12}{} {:>8.1} W {:>8.1} W {:>12} {:>10} {:>7}",
            d.index,
            shorten(&d.name, 32),
            d.energy_source,
            d.samples,
            joules(d.energy_j),
            d.command_j
                .map_or(String::new(), |j| format!(" {:>12}", joules(j))),
            d.mean_w,
            d.peak_w,
            joules(d.integrated_j),
            format_ns(d.read_ns_mean),
            d.errors.values().sum::<u64>()
        );
        if let Some(note) = &d.note {
            let _ = writeln!(out, "       GPU {}: {note}", d.index);
        }
        if !d.errors.is_empty() {
            let errors: Vec<String> = d
                .errors
                .iter()
                .map(|(field, n)| format!("{field} ×{n}"))
                .collect();
            let _ = writeln!(
                out,
                "       GPU {}: NVML reads that failed (left out of those samples): {}",
                d.index,
                errors.join(", ")
            );
        }
    }
    let _ = writeln!(
        out,
        "  (\"read\": the mean time one GPU's NVML reads took; \"integrated\": power \
         integrated over time, to compare with the counter{})",
        if power.command.is_some() {
            "; \"energy\": over all samples, \"command\": over the command's life"
        } else {
            ""
        }
    );
    match &power.before_first_launch {
        Some(idle) => {
            let _ = writeln!(
                out,
                "  before the first launch: {:.1} W mean over {} ({})",
                idle.mean_w,
                format_ns(idle.duration_ns),
                joules(idle.energy_j)
            );
        }
        None => {
            let _ = writeln!(out, "  before the first launch: no samples (or no launch)");
        }
    }

    for process in &power.stages {
        let calls = stages
            .iter()
            .find(|p| p.pid == process.pid)
            .map_or(0, |p| p.calls);
        let _ = writeln!(
            out,
            "\nEnergy by stage, pid {} ({}; all GPUs, interpolated at the stage boundaries)",
            process.pid,
            plural(calls, "call")
        );
        let _ = writeln!(
            out,
            "  {:<18} {:>11} {:>11} {:>12} {:>10}",
            "stage", "start", "duration", "energy", "mean"
        );
        for stage in &process.stages {
            let covered = if stage.covered_ns < stage.duration_ns {
                format!(
                    "  (only {} inside the samples)",
                    format_ns(stage.covered_ns)
                )
            } else {
                String::new()
            };
            let mark = if stage.within_one_step { '*' } else { ' ' };
            let _ = writeln!(
                out,
                "  {:<18} {:>11} {:>11} {:>12}{mark}{:>8.1} W{covered}",
                stage.name,
                at(stage.start_ns),
                format_ns(stage.duration_ns),
                joules(stage.energy_j),
                stage.mean_w
            );
        }
        if let Some(step) = power.step_ns
            && process.stages.iter().any(|stage| stage.within_one_step)
        {
            let _ = writeln!(
                out,
                "  * shorter than one step of NVML's readings ({}: the median time between their \
                 changes):\n    its energy is a share of that step's, not a measurement of the stage",
                format_ns(step)
            );
        }
    }

    render_kernels(out, &power.kernels);
}

/// Energy per kernel name: by launch windows (an estimate) or, with `--gpu`, by GPU time.
fn render_kernels(out: &mut String, kernels: &KernelEnergyReport) {
    let _ = writeln!(
        out,
        "\nEnergy by kernel name ({}), {}",
        plural(kernels.kernels.len() as u64, "kernel"),
        kernels.method
    );
    if kernels.estimate {
        let _ = writeln!(
            out,
            "  ESTIMATE: a window runs from a launch to the next launch or the end of the next \
             synchronisation; the GPU may run the kernel later (docs/power.md)"
        );
    } else {
        let _ = writeln!(
            out,
            "  each sample interval's energy goes to the kernels that ran in it, by their GPU \
             time in it (docs/power.md)"
        );
        for device in &kernels.devices {
            let nvml = match device.nvml_index {
                Some(index) => format!("= NVML GPU {index}"),
                None => "matches no NVML GPU: its kernels get no energy".into(),
            };
            let _ = writeln!(
                out,
                "  CUDA device {} {nvml} ({})",
                device.cuda_device, device.how
            );
        }
    }
    let (count, time) = if kernels.estimate {
        ("launches", "windows")
    } else {
        ("runs", "GPU time")
    };
    let _ = writeln!(
        out,
        "  {:>12} {:>7} {:>9} {:>11}  kernel",
        "energy", "share", count, time
    );
    for kernel in kernels.kernels.iter().take(KERNELS_SHOWN) {
        let _ = writeln!(
            out,
            "  {:>12} {:>6.1}% {:>9} {:>11}  {}",
            joules(kernel.energy_j),
            kernel.share * 100.0,
            kernel.launches,
            format_ns(kernel.window_ns),
            kernel.kernel
        );
    }
    if kernels.kernels.len() > KERNELS_SHOWN {
        let _ = writeln!(
            out,
            "  ... and {} more (cudatrace summary --json lists them all)",
            kernels.kernels.len() - KERNELS_SHOWN
        );
    }
    let outside = if kernels.estimate {
        "outside any launch window"
    } else {
        "in sample intervals without a kernel (idle)"
    };
    let _ = writeln!(
        out,
        "  {:>12}          {outside}",
        joules(kernels.outside_windows_j)
    );
    if kernels.unsampled_ns > 0 {
        let _ = writeln!(
            out,
            "  {:>12}          of kernel time got no energy: outside its GPU's samples, or \
             on a CUDA device matched to no NVML GPU",
            format_ns(kernels.unsampled_ns)
        );
    }
    if kernels.late_ns > 0 {
        let _ = writeln!(
            out,
            "  {:>12}          of kernel time got no energy: its line came after its \
             interval was shared out (over a minute out of order)",
            format_ns(kernels.late_ns)
        );
    }
}

/// `cudatrace run`'s closing line for `--power`.
pub fn render_short(out: &mut String, power: &PowerReport) {
    let devices: Vec<String> = power
        .devices
        .iter()
        .map(|d| {
            let source = if d.energy_source == "counter" {
                String::new()
            } else {
                format!(", {}", d.energy_source)
            };
            format!(
                "GPU {} {} (mean {:.1} W, peak {:.1} W{source})",
                d.index,
                // Over the command's life where the trace has it, as the headline.
                joules(d.command_j.unwrap_or(d.energy_j)),
                d.mean_w,
                d.peak_w
            )
        })
        .collect();
    let idle = power
        .before_first_launch
        .as_ref()
        .map_or(String::new(), |idle| {
            format!("; {:.1} W before the first launch", idle.mean_w)
        });
    match &power.command {
        // What the command cost, and apart from it the sampler's margins (cudatrace's own
        // start-up and teardown).
        Some(command) => {
            let margins = match (&power.before_command, &power.after_command) {
                (Some(before), Some(after)) => format!(
                    "; sampled outside it: {} before, {} after",
                    joules(before.energy_j),
                    joules(after.energy_j)
                ),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "cudatrace: energy: {} over the command's {} (exec to exit): {}{idle}{margins}",
                joules(command.energy_j),
                format_ns(command.duration_ns),
                devices.join(", ")
            );
        }
        None => {
            let _ = writeln!(
                out,
                "cudatrace: energy: {} over {}: {}{idle}",
                joules(power.energy_j),
                format_ns(power.duration_ns),
                devices.join(", ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        analysis::summarise::summarise, reader::TraceLines, summary::text::render_text, test_traces,
    };

    #[test]
    fn a_power_trace_gives_exact_energies_and_says_how() {
        let trace = test_traces::power();
        let result =
            summarise(|| Ok(TraceLines::new(trace.as_bytes(), "power.jsonl", false))).unwrap();
        let power = result.report.power.as_ref().expect("a power report");
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        // GPU 0: its counter, 5000 to 5200 mJ; GPU 1: 250 W integrated over 2 ms.
        assert_eq!(power.devices.len(), 2);
        let (a, b) = (&power.devices[0], &power.devices[1]);
        assert_eq!(
            (a.energy_source, a.energy_j, a.counter_j),
            ("counter", 0.2, Some(0.2))
        );
        assert!(
            close(a.integrated_j, 0.2) && close(a.mean_w, 100.0),
            "{a:?}"
        );
        assert_eq!((b.energy_source, b.counter_j), ("integrated power", None));
        assert!(close(b.energy_j, 0.5) && close(b.mean_w, 250.0), "{b:?}");
        assert_eq!((a.samples, b.samples), (21, 21));
        assert_eq!((a.read_ns_mean, b.read_ns_max), (40_000, 30_000));
        assert_eq!((a.power_limit_w, b.power_limit_w), (Some(700.0), None));
        assert!(close(power.energy_j, 0.7));
        assert_eq!(
            (power.duration_ns, power.peak_w, power.peak_ts_ns),
            (2_000_000, 350.0, 1000)
        );
        assert!(close(power.mean_w, 350.0));

        // Every stage: 350 W for its duration, all inside the samples.
        let stages = &power.stages[0].stages;
        assert_eq!(stages.len(), 6);
        for (stage, found) in stages.iter().zip(&result.report.stages[0].stages) {
            assert_eq!(
                (stage.start_ns, stage.duration_ns),
                (found.start_ns, found.duration_ns)
            );
            assert_eq!(stage.covered_ns, stage.duration_ns);
            assert!(
                close(stage.energy_j, 350.0 * stage.duration_ns as f64 / 1e9),
                "{stage:?}"
            );
        }
        // GPU 0's counter moves at every 100 µs sample (GPU 1's power never changes):
        // stages shorter than that are marked.
        assert_eq!(power.step_ns, Some(100_000));
        let marked: Vec<(&str, u64, bool)> = stages
            .iter()
            .map(|s| (s.name, s.duration_ns, s.within_one_step))
            .collect();
        for (name, duration, within) in &marked {
            assert_eq!(*within, *duration < 100_000, "{name}");
        }
        assert!(
            marked.iter().any(|m| m.2) && marked.iter().any(|m| !m.2),
            "{marked:?}"
        );
        let idle = power.before_first_launch.as_ref().unwrap();
        let first_launch = result.report.stages[0].stages[3].start_ns;
        assert_eq!(
            (idle.start_ns, idle.duration_ns),
            (1000, first_launch - 1000)
        );
        assert!(close(idle.mean_w, 350.0));

        // Kernels: 3 kernels × 2 iterations; every joule is in a window or outside them.
        let kernels = &power.kernels;
        assert_eq!(kernels.kernels.len(), 3);
        assert!(kernels.kernels.iter().all(|k| k.launches == 2));
        let in_windows: f64 = kernels.kernels.iter().map(|k| k.energy_j).sum();
        assert!(close(in_windows + kernels.outside_windows_j, 0.7));
        // Each window (launch to launch, the last to its synchronisation's end) at 350 W.
        for kernel in &kernels.kernels {
            assert!(
                close(kernel.energy_j, 350.0 * kernel.window_ns as f64 / 1e9),
                "{kernel:?}"
            );
        }

        let text = render_text(&result.info, &result.report);
        for needle in [
            "Energy (--power: 2 GPUs, a sample every 1 ms; NVML /x/libnvidia-ml.so.1 12.580, driver 580.159.04)",
            "  all GPUs: 0.700 J over 2.00 ms, mean 350.0 W, peak 350.0 W at -9.0 µs",
            "  0    test GPU A                       counter                 21      0.200 J    100.0 W    100.0 W      0.200 J    40.0 µs       0",
            "  1    test GPU B                       integrated power        21      0.500 J    250.0 W    250.0 W      0.500 J    30.0 µs       0",
            "       GPU 1: energy counter NOT SUPPORTED on this GPU: energy integrated from power samples",
            "Energy by stage, pid 42 (30 calls; all GPUs, interpolated at the stage boundaries)",
            "  * shorter than one step of NVML's readings (100.0 µs: the median time between their changes):\n    its energy is a share of that step's, not a measurement of the stage",
            "Energy by kernel name (3 kernels), launch windows (estimate: no --gpu)",
        ] {
            assert!(text.contains(needle), "{needle:?} not in\n{text}");
        }
        // Each marked stage's energy has its mark.
        let marked_rows = text.lines().filter(|line| line.contains(" J*")).count();
        assert_eq!(marked_rows, marked.iter().filter(|m| m.2).count(), "{text}");
    }
}
