//! The stages of a run, detected per process from the order of its calls.
//!
//! Each call is sorted into a kind: set-up (`cuInit`, device and context calls), loading
//! (allocations, host-to-device copies, memsets), launch, device-to-host copy, sync
//! (stream/context/event synchronise), cleanup (frees, releases, unloads, context
//! destruction) or other. Then, in call order:
//!
//! 1. **initialisation**: the leading run of set-up calls, from the first call to the end
//!    of the last of them;
//! 2. **weight loading**: from there to the start of the last *burst* before the first
//!    launch, where a burst is a run of consecutive loading calls holding at least one
//!    host-to-device copy;
//! 3. **input preparation**: from the start of that last burst to the first launch;
//! 4. **inference**: from the first launch to the end of the last call that follows the
//!    last launch before the first device-to-host copy or cleanup call (its syncs);
//! 5. **output retrieval**: from there to the end of the last call after the first
//!    device-to-host copy that follows the last launch, before the first cleanup call;
//! 6. **cleanup**: from there to the end of the last call.
//!
//! A call is counted in the stage of its place in that order. The stages partition the
//! time from the earliest call's start to the latest call's end; a stage not found is empty
//! (length 0). Without any launch, everything after initialisation is weight loading and
//! input preparation.

use serde::Serialize;

use super::role::Role;
use crate::schema::CallLine;

pub const STAGE_NAMES: [&str; 6] = [
    "initialisation",
    "weight loading",
    "input preparation",
    "inference",
    "output retrieval",
    "cleanup",
];

/// Calls and bytes of one stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub calls: u64,
    pub launches: u64,
    pub htod_bytes: u64,
    pub dtoh_bytes: u64,
}

impl Tally {
    fn add(&mut self, kind: Kind, record: &CallLine) {
        self.calls += 1;
        let ok = record.ok();
        let bytes = record.bytes.unwrap_or(0);
        match kind {
            Kind::Launch if ok => self.launches += 1,
            Kind::HostToDevice if ok => self.htod_bytes = self.htod_bytes.saturating_add(bytes),
            Kind::DeviceToHost if ok => self.dtoh_bytes = self.dtoh_bytes.saturating_add(bytes),
            _ => {}
        }
    }

    fn merge(&mut self, other: &Tally) {
        self.calls += other.calls;
        self.launches += other.launches;
        self.htod_bytes = self.htod_bytes.saturating_add(other.htod_bytes);
        self.dtoh_bytes = self.dtoh_bytes.saturating_add(other.dtoh_bytes);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Setup,
    Loading,
    HostToDevice,
    Launch,
    DeviceToHost,
    Sync,
    Cleanup,
    Other,
}

impl Kind {
    fn of(role: Role, record: &CallLine) -> Kind {
        match role {
            Role::Setup => Kind::Setup,
            Role::Copy => match record.kind.as_deref() {
                Some("HtoD") => Kind::HostToDevice,
                Some("DtoH") => Kind::DeviceToHost,
                _ => Kind::Other,
            },
            Role::DeviceAlloc
            | Role::HostAlloc
            | Role::PhysicalCreate
            | Role::Map
            | Role::AddressReserve
            | Role::IpcOpen
            | Role::Memset => Kind::Loading,
            Role::Launch | Role::GraphLaunch => Kind::Launch,
            Role::Sync(_) => Kind::Sync,
            Role::DeviceFree
            | Role::HostFree
            | Role::PhysicalRelease
            | Role::Unmap
            | Role::AddressFree
            | Role::IpcClose
            | Role::Teardown => Kind::Cleanup,
            _ => Kind::Other,
        }
    }
}

/// Where the process is in its run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    Init,
    BeforeLaunch,
    /// After a launch: its syncs and other calls.
    Inference,
    Output,
    Cleanup,
}

/// A run of consecutive loading calls.
#[derive(Clone, Copy, Debug, Default)]
struct Run {
    start: u64,
    tally: Tally,
    has_htod: bool,
}

/// Stage detection state of one process: a few counters, whatever the trace's length.
#[derive(Debug, Default)]
pub struct StageTracker {
    calls: u64,
    t_start: u64,
    t_end: u64,
    phase: Phase,
    init: Tally,
    init_end: Option<u64>,
    /// Before the first launch: what precedes the last burst.
    loading: Tally,
    /// The last burst (start, calls from it on, the current run excepted).
    burst: Option<(u64, Tally)>,
    /// The current run of loading calls, until it holds a copy (then it is the burst).
    run: Option<Run>,
    first_launch: Option<u64>,
    input: Tally,
    inference: Tally,
    inference_end: u64,
    output: Tally,
    output_end: Option<u64>,
    cleanup: Tally,
}

/// One detected stage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stage {
    pub name: &'static str,
    /// Start, on the trace's `ts_ns` clock.
    pub start_ns: u64,
    pub duration_ns: u64,
    pub calls: u64,
    pub launches: u64,
    pub htod_bytes: u64,
    pub dtoh_bytes: u64,
    /// `--gpu` traces: the process's GPU busy time in the stage (its work's union clipped
    /// to the stage; `analysis::gpu_context`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_busy_ns: Option<u64>,
}

/// The stages of one process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProcessStages {
    pub pid: u32,
    pub calls: u64,
    pub stages: Vec<Stage>,
}

impl StageTracker {
    pub fn observe(&mut self, role: Role, record: &CallLine) {
        let kind = Kind::of(role, record);
        let start = record.ts_ns;
        let end = start.saturating_add(record.dur_or_zero());
        if self.calls == 0 || start < self.t_start {
            self.t_start = start;
        }
        self.calls += 1;
        self.t_end = self.t_end.max(end);

        if self.phase == Phase::Init {
            if kind == Kind::Setup {
                self.init.add(kind, record);
                self.init_end = Some(self.init_end.unwrap_or(0).max(end));
                return;
            }
            self.phase = Phase::BeforeLaunch;
        }
        if kind == Kind::Launch {
            self.launch(kind, record, start, end);
            return;
        }
        match self.phase {
            Phase::Init | Phase::BeforeLaunch => self.before_launch(kind, record, start),
            Phase::Inference => match kind {
                Kind::DeviceToHost => {
                    self.phase = Phase::Output;
                    self.output.add(kind, record);
                    self.output_end = Some(end);
                }
                Kind::Cleanup => {
                    self.phase = Phase::Cleanup;
                    self.cleanup.add(kind, record);
                }
                _ => {
                    self.inference.add(kind, record);
                    self.inference_end = self.inference_end.max(end);
                }
            },
            Phase::Output => {
                if kind == Kind::Cleanup {
                    self.phase = Phase::Cleanup;
                    self.cleanup.add(kind, record);
                } else {
                    self.output.add(kind, record);
                    self.output_end = Some(self.output_end.unwrap_or(0).max(end));
                }
            }
            Phase::Cleanup => self.cleanup.add(kind, record),
        }
    }

    fn before_launch(&mut self, kind: Kind, record: &CallLine, start: u64) {
        if matches!(kind, Kind::Loading | Kind::HostToDevice) {
            let run = self.run.get_or_insert(Run {
                start,
                ..Run::default()
            });
            if run.has_htod {
                if let Some((_, burst)) = &mut self.burst {
                    burst.add(kind, record);
                }
                return;
            }
            run.tally.add(kind, record);
            if kind == Kind::HostToDevice {
                // This run is the last burst now; the previous one was loading.
                run.has_htod = true;
                let new_burst = (run.start, run.tally);
                if let Some((_, old)) = self.burst.replace(new_burst) {
                    self.loading.merge(&old);
                }
            }
            return;
        }
        let before = match &mut self.burst {
            Some((_, burst)) => burst,
            None => &mut self.loading,
        };
        if let Some(run) = self.run.take()
            && !run.has_htod
        {
            before.merge(&run.tally);
        }
        before.add(kind, record);
    }

    fn launch(&mut self, kind: Kind, record: &CallLine, start: u64, end: u64) {
        if self.first_launch.is_none() {
            self.close_before_launch();
            self.first_launch = Some(start);
        }
        // An earlier "output" or "cleanup" was part of inference after all.
        self.inference.merge(&self.output);
        self.inference.merge(&self.cleanup);
        self.output = Tally::default();
        self.cleanup = Tally::default();
        self.output_end = None;
        self.inference.add(kind, record);
        self.inference_end = self.inference_end.max(end);
        self.phase = Phase::Inference;
    }

    /// Settles the pre-launch tallies: a pending run without a copy goes with what
    /// precedes it.
    fn close_before_launch(&mut self) {
        if let Some(run) = self.run.take()
            && !run.has_htod
        {
            match &mut self.burst {
                Some((_, burst)) => burst.merge(&run.tally),
                None => self.loading.merge(&run.tally),
            }
        }
        if let Some((_, burst)) = &self.burst {
            self.input = *burst;
        }
    }

    pub fn report(mut self, pid: u32) -> ProcessStages {
        if self.first_launch.is_none() {
            self.close_before_launch();
        }
        let t_start = self.t_start;
        let t_end = self.t_end.max(t_start);
        let init_end = self.init_end.unwrap_or(t_start);
        let first_launch = self.first_launch.unwrap_or(t_end);
        let input_start = self.burst.map_or(first_launch, |(start, _)| start);
        let (inference_end, output_end) = match self.first_launch {
            Some(_) => {
                let inference_end = self.inference_end;
                (inference_end, self.output_end.unwrap_or(inference_end))
            }
            None => (t_end, t_end),
        };
        // Boundaries never go backwards (threads may interleave) nor past the end.
        let mut bounds = [
            t_start,
            init_end,
            input_start,
            first_launch,
            inference_end,
            output_end,
            t_end,
        ];
        for i in 1..bounds.len() {
            bounds[i] = bounds[i].clamp(bounds[i - 1], t_end);
        }
        let tallies = [
            self.init,
            self.loading,
            self.input,
            self.inference,
            self.output,
            self.cleanup,
        ];
        let stages = STAGE_NAMES
            .iter()
            .zip(tallies)
            .enumerate()
            .map(|(i, (name, tally))| Stage {
                name,
                start_ns: bounds[i],
                duration_ns: bounds[i + 1] - bounds[i],
                calls: tally.calls,
                launches: tally.launches,
                htod_bytes: tally.htod_bytes,
                dtoh_bytes: tally.dtoh_bytes,
                gpu_busy_ns: None,
            })
            .collect();
        ProcessStages {
            pid,
            calls: self.calls,
            stages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{Analysis, testing::Script};

    fn stages(script: &Script) -> ProcessStages {
        let mut analysis = Analysis::default();
        for record in &script.records {
            analysis.observe(&mut record.clone());
        }
        analysis.finish().stages.remove(0)
    }

    /// (name, start, duration, calls, launches, htod, dtoh)
    type Row = (&'static str, u64, u64, u64, u64, u64, u64);

    fn rows(stages: &ProcessStages) -> Vec<Row> {
        stages
            .stages
            .iter()
            .map(|s| {
                (
                    s.name,
                    s.start_ns,
                    s.duration_ns,
                    s.calls,
                    s.launches,
                    s.htod_bytes,
                    s.dtoh_bytes,
                )
            })
            .collect()
    }

    /// The demo program's call order: calls start every 1000 ns and last 100 ns.
    fn demo_like() -> Script {
        let mut s = Script::new(3);
        for name in [
            "cuInit",
            "cuDeviceGet",
            "cuDevicePrimaryCtxRetain",
            "cuCtxSetCurrent",
        ] {
            s.plain(name); // ts 1000..4000
        }
        for (i, bytes) in [4 << 20, 4 << 20, 2 << 20, 20480u64]
            .into_iter()
            .enumerate()
        {
            s.alloc(0x10_0000 * (i as u64 + 1), bytes)
                .copy("cuMemcpyHtoD_v2", "HtoD", bytes); // ts 5000..12000
        }
        s.plain("cuLibraryLoadData"); // 13000
        for _ in 0..3 {
            s.plain("cuLibraryGetKernel").plain("cuKernelGetFunction"); // ..19000
        }
        s.plain("cuStreamCreate") // 20000
            .alloc(0xa00_0000, 262144) // 21000: input preparation starts
            .alloc(0xb00_0000, 262144)
            .alloc(0xc00_0000, 2560)
            .copy("cuMemcpyHtoDAsync_v2", "HtoD", 262144); // 24000
        for _ in 0..3 {
            s.launch(0x1).launch(0x2).plain("cuStreamSynchronize"); // 25000..33000
        }
        s.copy("cuMemcpyDtoHAsync_v2", "DtoH", 2560) // 34000
            .plain("cuStreamSynchronize"); // 35000
        s.free(0x10_0000).free(0xa00_0000); // 36000, 37000
        s.plain("cuDevicePrimaryCtxRelease_v2"); // 38000, ends 38100
        s
    }

    #[test]
    fn a_scripted_inference_run_gives_the_six_stages() {
        let weights = (4 << 20) + (4 << 20) + (2 << 20) + 20480;
        assert_eq!(
            rows(&stages(&demo_like())),
            [
                ("initialisation", 1000, 3100, 4, 0, 0, 0),
                ("weight loading", 4100, 16_900, 16, 0, weights, 0),
                ("input preparation", 21_000, 4000, 4, 0, 262144, 0),
                ("inference", 25_000, 8100, 9, 6, 0, 0),
                ("output retrieval", 33_100, 2000, 2, 0, 0, 2560),
                ("cleanup", 35_100, 3000, 3, 0, 0, 0),
            ]
        );
    }

    #[test]
    fn calls_between_launches_stay_in_inference() {
        let mut s = Script::new(3);
        s.plain("cuInit")
            .launch(0x1)
            .copy("cuMemcpyDtoH_v2", "DtoH", 8) // looks like output...
            .free(0x10) // ...and cleanup, but a launch follows
            .launch(0x1)
            .plain("cuCtxSynchronize")
            .copy("cuMemcpyDtoH_v2", "DtoH", 16);
        assert_eq!(
            rows(&stages(&s)),
            [
                ("initialisation", 1000, 100, 1, 0, 0, 0),
                ("weight loading", 1100, 900, 0, 0, 0, 0),
                ("input preparation", 2000, 0, 0, 0, 0, 0),
                ("inference", 2000, 4100, 5, 2, 0, 8),
                ("output retrieval", 6100, 1000, 1, 0, 0, 16),
                ("cleanup", 7100, 0, 0, 0, 0, 0),
            ]
        );
    }

    #[test]
    fn without_launches_only_loading_is_found() {
        let mut s = Script::new(3);
        s.alloc(0x10, 64)
            .copy("cuMemcpyHtoD_v2", "HtoD", 64)
            .free(0x10);
        assert_eq!(
            rows(&stages(&s)),
            [
                ("initialisation", 1000, 0, 0, 0, 0, 0),
                ("weight loading", 1000, 0, 0, 0, 0, 0),
                ("input preparation", 1000, 2100, 3, 0, 64, 0),
                ("inference", 3100, 0, 0, 0, 0, 0),
                ("output retrieval", 3100, 0, 0, 0, 0, 0),
                ("cleanup", 3100, 0, 0, 0, 0, 0),
            ]
        );
    }

    #[test]
    fn stages_partition_the_run_whatever_the_order() {
        // Out-of-order timestamps (threads) must not make a stage negative.
        let mut s = demo_like();
        s.records.swap(3, 30);
        s.records[10].ts_ns = 0;
        let result = stages(&s);
        let total: u64 = result.stages.iter().map(|s| s.duration_ns).sum();
        assert_eq!(total, 38_100);
        assert_eq!(
            result.stages.iter().map(|s| s.calls).sum::<u64>(),
            s.records.len() as u64
        );
    }
}
