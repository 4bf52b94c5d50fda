//! The power accumulator and the GPU-time split, on scripted traces.

use super::*;
use crate::{
    analysis::{classify, testing::Script},
    schema::{GpuHeaderInfo, GpuKernelLine, PowerDevice},
};

fn line(device: u32, seq: u64, ts_ns: u64, power_mw: u32, energy_mj: Option<u64>) -> PowerLine {
    PowerLine {
        device,
        seq,
        ts_ns,
        read_ns: 1000 + seq,
        power_mw: Some(power_mw),
        energy_mj,
        ..PowerLine::default()
    }
}

fn info(counter: &[bool]) -> PowerInfo {
    PowerInfo {
        period_ms: 10,
        devices: counter
            .iter()
            .enumerate()
            .map(|(index, &energy_counter)| PowerDevice {
                index: index as u32,
                name: format!("gpu{index}"),
                energy_counter,
                ..PowerDevice::default()
            })
            .collect(),
        ..PowerInfo::default()
    }
}

/// Samples every 10 ms from 0 to 100 ms: device 0 at 100 W with a counter (starting
/// at 7 J), device 1 at 200 W integrated.
fn sampled(accumulator: &mut PowerAccumulator) {
    accumulator.header(&info(&[true, false]));
    for seq in 0..=10 {
        let ts = seq * 10_000_000;
        accumulator.sample(&line(0, seq, ts, 100_000, Some(7000 + seq * 1000)));
        accumulator.sample(&line(1, seq, ts, 200_000, None));
    }
}

#[test]
fn run_device_and_stage_figures_are_exact() {
    let mut accumulator = PowerAccumulator::default();
    sampled(&mut accumulator);
    let stages = [ProcessStages {
        pid: 5,
        calls: 2,
        stages: vec![
            crate::analysis::stages::Stage {
                name: "initialisation",
                start_ns: 5_000_000,
                duration_ns: 20_000_000,
                calls: 1,
                launches: 0,
                htod_bytes: 0,
                dtoh_bytes: 0,
                gpu_busy_ns: None,
            },
            crate::analysis::stages::Stage {
                name: "cleanup",
                start_ns: 95_000_000,
                duration_ns: 10_000_000,
                calls: 1,
                launches: 0,
                htod_bytes: 0,
                dtoh_bytes: 0,
                gpu_busy_ns: None,
            },
        ],
    }];
    let report = accumulator.finish(&stages).unwrap();
    assert_eq!(report.devices.len(), 2);
    let (gpu0, gpu1) = (&report.devices[0], &report.devices[1]);
    assert_eq!((gpu0.energy_source, gpu0.energy_j), ("counter", 10.0));
    assert_eq!(gpu0.counter_j, Some(10.0));
    assert_eq!(
        (gpu0.integrated_j, gpu0.mean_w, gpu0.peak_w),
        (10.0, 100.0, 100.0)
    );
    assert_eq!(
        (gpu0.samples, gpu0.read_ns_max, gpu0.read_ns_mean),
        (11, 1010, 1005)
    );
    assert_eq!(
        (gpu1.energy_source, gpu1.energy_j, gpu1.mean_w),
        ("integrated power", 20.0, 200.0)
    );
    assert_eq!(gpu1.counter_j, None);
    assert!(gpu1.note.as_deref().unwrap().contains("NOT SUPPORTED"));
    assert_eq!(
        (report.energy_j, report.duration_ns, report.mean_w),
        (30.0, 100_000_000, 300.0)
    );
    assert_eq!((report.peak_w, report.peak_ts_ns), (300.0, 0));
    let stages = &report.stages[0].stages;
    // 20 ms at 300 W; the cleanup's last 5 ms are past the samples.
    assert_eq!(
        (stages[0].energy_j, stages[0].covered_ns, stages[0].mean_w),
        (6.0, 20_000_000, 300.0)
    );
    assert_eq!(
        (stages[1].energy_j, stages[1].covered_ns, stages[1].mean_w),
        (1.5, 5_000_000, 300.0)
    );
    // GPU 0's counter moves at every 10 ms sample; GPU 1's power never changes. Neither
    // stage is shorter than 10 ms.
    assert_eq!(report.step_ns, Some(10_000_000));
    assert!(stages.iter().all(|stage| !stage.within_one_step));
}

#[test]
fn launch_windows_give_energy_to_kernels_and_power_before_the_first_launch() {
    let mut script = Script::new(3);
    script.ts = 20_000_000;
    script.call("cuModuleGetFunction", |r| {
        r.function = Some(crate::schema::Hex(0x10));
        r.symbol = Some("_Z4gemmv".into());
    });
    // Launch at 30 ms, another at 50 ms (window 20 ms), a sync from 60 to 70 ms
    // (window 50..70), a graph launch at 80 ms closed by the trace's end (90 ms).
    let mut analysis = crate::analysis::Analysis::default();
    let mut accumulator = PowerAccumulator::default();
    sampled(&mut accumulator);
    for (ts, name, dur) in [
        (30_000_000, "cuLaunchKernel", 100),
        (50_000_000, "cuLaunchKernel", 100),
        (60_000_000, "cuStreamSynchronize", 10_000_000),
        (80_000_000, "cuGraphLaunch", 10_000_000),
    ] {
        script.ts = ts;
        script.call(name, |r| {
            r.function = Some(crate::schema::Hex(0x10));
            r.dur_ns = Some(dur);
        });
    }
    for record in &script.records {
        let mut record = record.clone();
        analysis.observe(&mut record);
        accumulator.call(classify(&record.name).0, &record);
    }
    let report = accumulator.finish(&[]).unwrap();
    let kernels = &report.kernels;
    assert!(kernels.estimate);
    // gemm: 30..50 and 50..70 ms at 300 W = 12 J; graphs: 80..90 ms = 3 J.
    assert_eq!(kernels.kernels[0].kernel, "gemm()");
    assert_eq!(
        (kernels.kernels[0].energy_j, kernels.kernels[0].launches),
        (12.0, 2)
    );
    assert_eq!(kernels.kernels[0].window_ns, 40_000_000);
    assert_eq!(kernels.kernels[1].kernel, "(CUDA graph launches)");
    assert_eq!(kernels.kernels[1].energy_j, 3.0);
    assert_eq!(kernels.kernels[0].share, 0.4);
    assert_eq!(kernels.outside_windows_j, 15.0);
    let before = report.before_first_launch.unwrap();
    assert_eq!(
        (before.duration_ns, before.energy_j, before.mean_w),
        (30_000_000, 9.0, 300.0)
    );
}

fn kernel_line(device: u32, ts_ns: u64, dur_ns: u64, kernel: &str) -> GpuKernelLine {
    GpuKernelLine {
        device,
        ts_ns,
        dur_ns,
        kernel: kernel.into(),
        ..GpuKernelLine::default()
    }
}

#[test]
fn with_gpu_kernels_get_the_energy_of_their_gpu_by_gpu_time() {
    let mut accumulator = PowerAccumulator::default();
    sampled(&mut accumulator);
    let (report, series) = accumulator.finish_with_series(&[]);
    let mut report = report.unwrap();
    // The command saw NVML GPU 1 (200 W, 2 J per 10 ms interval) as CUDA device 0.
    let header = GpuHeaderInfo {
        cuda_visible_devices: Some("1".into()),
        ..GpuHeaderInfo::default()
    };
    let mut energy = GpuTimeEnergy::new(&report, series, Some(&header));
    // 15..24 ms: alone in 10..20 ms (2 J), half the kernel time of 20..30 ms (1 J).
    energy.kernel(&kernel_line(0, 15_000_000, 9_000_000, "gemm"));
    // 26..30 ms: the other half.
    energy.kernel(&kernel_line(0, 26_000_000, 4_000_000, "relu"));
    // CUDA device 1 is not visible to the command: no GPU, no energy.
    energy.kernel(&kernel_line(1, 50_000_000, 1_000_000, "stray"));
    energy.finish(&mut report);
    let kernels = &report.kernels;
    assert_eq!((kernels.method, kernels.estimate), (GPU_TIME, false));
    let rows: Vec<(&str, f64, u64, u64)> = kernels
        .kernels
        .iter()
        .map(|k| (k.kernel.as_str(), k.energy_j, k.launches, k.window_ns))
        .collect();
    assert_eq!(
        rows,
        [
            ("gemm", 3.0, 1, 9_000_000),
            ("relu", 1.0, 1, 4_000_000),
            ("stray", 0.0, 1, 0),
        ]
    );
    // Everything else of the 30 J is idle: GPU 0 all of it, GPU 1 but 10..30 ms.
    assert_eq!(kernels.outside_windows_j, 26.0);
    assert_eq!(kernels.kernels[0].share, 0.1);
    assert_eq!((kernels.unsampled_ns, kernels.late_ns), (1_000_000, 0));
    let matched: Vec<(u32, Option<u32>, bool)> = kernels
        .devices
        .iter()
        .map(|d| (d.cuda_device, d.nvml_index, d.assumed))
        .collect();
    assert_eq!(matched, [(0, Some(1), true), (1, None, false)]);
}

#[test]
fn a_tick_sums_its_devices_for_the_peak() {
    let mut accumulator = PowerAccumulator::default();
    accumulator.sample(&line(0, 0, 0, 100_000, Some(0)));
    accumulator.sample(&line(1, 0, 1, 50_000, Some(0)));
    accumulator.sample(&line(0, 1, 10, 120_000, Some(1)));
    accumulator.sample(&line(1, 1, 11, 90_000, Some(1)));
    accumulator.sample(&line(0, 3, 30, 150_000, Some(2)));
    let report = accumulator.finish(&[]).unwrap();
    assert_eq!((report.peak_w, report.peak_ts_ns), (210.0, 10));
    assert_eq!(report.devices[0].peak_w, 150.0);
    assert_eq!(
        report.devices[0].energy_source, "counter",
        "read without a header"
    );
}

#[test]
fn errors_are_counted_by_field() {
    let mut accumulator = PowerAccumulator::default();
    let mut failed = line(0, 0, 0, 1, None);
    failed.power_mw = None;
    failed.errors.insert("power_mw".into(), "UNKNOWN".into());
    accumulator.sample(&failed);
    accumulator.sample(&line(0, 1, 10, 1, None));
    let report = accumulator.finish(&[]).unwrap();
    assert_eq!(report.read_errors, 1);
    assert_eq!(report.devices[0].errors["power_mw"], 1);
    assert_eq!(report.devices[0].samples, 2);
}

#[test]
fn a_trace_without_power_has_no_report() {
    assert_eq!(PowerAccumulator::default().finish(&[]), None);
}

/// A stage of `name` from `start_ns` for `duration_ns`.
fn stage(name: &'static str, start_ns: u64, duration_ns: u64) -> crate::analysis::stages::Stage {
    crate::analysis::stages::Stage {
        name,
        start_ns,
        duration_ns,
        calls: 1,
        launches: 0,
        htod_bytes: 0,
        dtoh_bytes: 0,
        gpu_busy_ns: None,
    }
}

#[test]
fn stages_shorter_than_one_step_of_the_readings_are_marked() {
    // As NVML on an H100: sampled every 10 ms, the counter moves every 100 ms (by 30 J:
    // 300 W), the power reading with it.
    let mut accumulator = PowerAccumulator::default();
    accumulator.header(&info(&[true]));
    for seq in 0..=50 {
        let ts = seq * 10_000_000;
        let updates = seq / 10;
        let power = 300_000 + u32::try_from(updates % 2).unwrap();
        accumulator.sample(&line(0, seq, ts, power, Some(updates * 30_000)));
    }
    let stages = [ProcessStages {
        pid: 5,
        calls: 3,
        stages: vec![
            stage("inference", 0, 400_000_000),
            stage("output retrieval", 400_000_000, 100_000),
            stage("cleanup", 400_100_000, 99_900_000),
        ],
    }];
    let report = accumulator.finish(&stages).unwrap();
    // Changes seen at 100, 200, 300, 400 and 500 ms.
    assert_eq!(report.step_ns, Some(100_000_000));
    let marked: Vec<(&str, bool)> = report.stages[0]
        .stages
        .iter()
        .map(|stage| (stage.name, stage.within_one_step))
        .collect();
    assert_eq!(
        marked,
        [
            ("inference", false),
            ("output retrieval", true),
            ("cleanup", true)
        ]
    );
    // The short stage still gets its share, by time, of the step it falls in (the
    // counter read 120 J at 400 ms and 120 J at 410 ms: nothing).
    assert_eq!(report.stages[0].stages[1].energy_j, 0.0);

    // Without the counter, the integrated power's changes set the step; a reading that
    // never changes gives none, and nothing is marked.
    let mut steady = PowerAccumulator::default();
    steady.header(&info(&[false]));
    for seq in 0..=50 {
        steady.sample(&line(0, seq, seq * 10_000_000, 300_000, None));
    }
    let report = steady.finish(&stages).unwrap();
    assert_eq!(report.step_ns, None);
    assert!(report.stages[0].stages.iter().all(|s| !s.within_one_step));
}

#[test]
fn the_step_is_the_median_time_between_changes() {
    let mut steps = ReadingSteps::default();
    assert_eq!(steps.median_ns(), None);
    // The first value at 0 (when it came to be is unknown), then changes at 5, 105, 205,
    // 215 and 315.
    for (ts, value) in [
        (0, 1),
        (5, 2),
        (50, 2),
        (105, 3),
        (205, 4),
        (215, 5),
        (315, 6),
    ] {
        steps.observe(ts, value);
    }
    // Steps 100, 100, 10, 100.
    assert_eq!(steps.median_ns(), Some(100));
}
