//! Meaning from the call stream: kernel names on launches, live device memory, the stages
//! of a run and per-function/per-kernel statistics.
//!
//! [`Analysis`] is fed [`CallLine`]s one at a time, in trace order, by `cudatrace run`
//! (its enrich stage, before each line is written) and by `cudatrace summary`, `export`
//! and `plot` (while reading a trace). All therefore compute the same figures. Its memory
//! grows with the number of distinct functions, kernels, live handles and live
//! allocations, never with the number of calls.
//!
//! | file | |
//! |---|---|
//! | `role.rs` | what each function does (allocation, copy, launch, sync...) |
//! | `kernels.rs` | kernel names for launches, from the calls that made the handles |
//! | `memory.rs` | live device memory, peaks and leaks per process |
//! | `stages.rs` | the stages of a run (initialisation ... cleanup) |
//! | `summary.rs` | per-function latency, per-kernel and per-direction statistics |
//! | `driver.rs` | `--kernel`: NVIDIA driver activity by call and class |
//! | `power.rs`, `energy.rs` | `--power`: energy per GPU, stage and kernel; the arithmetic under it |
//! | `families.rs` | the API family of a symbol (export categories, plot lanes) |
//! | `summarise.rs` | a whole trace file read through the analysis |

pub mod driver;
pub mod energy;
pub mod families;
pub mod kernels;
pub mod memory;
pub mod power;
mod role;
pub mod stages;
pub mod summarise;
pub mod summary;

pub use role::{Role, classify};

use std::collections::HashMap;

use crate::{
    events::Event,
    schema::{CallLine, DriverLine, MemoryFooter, PowerInfo, PowerLine, ProcessMemory},
};

use self::{
    kernels::{KernelNames, KernelTable},
    memory::MemoryState,
    stages::{ProcessStages, StageTracker},
    summary::{Summary, SummaryAccumulator},
};

/// One process (one pid between exec and exit) as the analysis sees it.
#[derive(Default)]
struct ProcessState {
    kernels: KernelTable,
    memory: MemoryState,
    stages: StageTracker,
}

/// The per-process results of a process that exec'd or exited.
struct Finished {
    memory: ProcessMemory,
    stages: ProcessStages,
}

/// The whole analysis of one trace.
#[derive(Default)]
pub struct Analysis {
    names: KernelNames,
    processes: HashMap<u32, ProcessState>,
    finished: Vec<Finished>,
    summary: SummaryAccumulator,
    driver: driver::DriverAccumulator,
    power: power::PowerAccumulator,
}

impl Analysis {
    /// `cudatrace run`'s enrich stage, between decoding and writing: kernel names and live
    /// bytes go into the line itself, and every event counts toward the run's figures.
    pub fn enrich(&mut self, event: &mut Event) {
        match event {
            Event::Call(call) => self.observe(call),
            Event::Process(process) => self.process_event(process.pid, &process.event),
            Event::Driver(driver) => self.driver(driver),
        }
    }

    /// Adds `kernel`/`kernel_mangled` to launches and `live_bytes` to memory-changing
    /// calls, then counts the call. Fields already present (a trace read back) are kept.
    pub fn observe(&mut self, record: &mut CallLine) {
        let (role, symbol) = classify(&record.name);
        let process = self.processes.entry(record.pid).or_default();
        process.kernels.observe(&mut self.names, role, record);
        process.memory.observe(role, symbol, record);
        process.stages.observe(role, record);
        self.summary.observe(role, record);
        self.power.call(role, record);
    }

    /// The header's `power` object (`--power`).
    pub fn power_header(&mut self, info: &PowerInfo) {
        self.power.header(info);
    }

    /// A `"type":"power"` line (`--power`).
    pub fn power_sample(&mut self, line: &PowerLine) {
        self.power.sample(line);
    }

    /// A `"type":"driver"` line (`--kernel`).
    pub fn driver(&mut self, line: &DriverLine) {
        self.driver.observe(line);
    }

    /// A `process` line: `exec` and `exit` end the process's handle and memory tables
    /// (its address space is gone); its figures are kept for the report.
    pub fn process_event(&mut self, pid: u32, event: &str) {
        if !matches!(event, "exec" | "exit") {
            return;
        }
        if let Some(process) = self.processes.remove(&pid) {
            self.finished.push(Finished {
                memory: process.memory.report(pid),
                stages: process.stages.report(pid),
            });
        }
    }

    /// The final figures: processes that ended first, then the live ones by pid.
    pub fn finish(mut self) -> Report {
        let mut live: Vec<(u32, ProcessState)> = self.processes.drain().collect();
        live.sort_by_key(|(pid, _)| *pid);
        for (pid, process) in live {
            self.finished.push(Finished {
                memory: process.memory.report(pid),
                stages: process.stages.report(pid),
            });
        }
        let (memory, stages): (Vec<_>, Vec<_>) = self
            .finished
            .into_iter()
            .filter(|f| f.stages.calls > 0)
            .map(|f| (f.memory, f.stages))
            .unzip();
        Report {
            summary: self.summary.finish(),
            memory,
            power: self.power.finish(&stages),
            stages,
            driver: self.driver.finish(),
        }
    }
}

/// Everything the analysis found.
pub struct Report {
    pub summary: Summary,
    pub memory: Vec<ProcessMemory>,
    pub stages: Vec<ProcessStages>,
    /// NVIDIA driver activity (`--kernel` traces).
    pub driver: driver::DriverSummary,
    /// Energy and power (`--power` traces).
    pub power: Option<power::PowerReport>,
}

impl Report {
    pub fn memory_footer(&self) -> MemoryFooter {
        MemoryFooter {
            processes: self.memory.clone(),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Scripted call sequences for the analysis tests.

    use crate::{
        analysis::{Analysis, Report},
        schema::{CallLine, Hex},
    };

    /// Builds call records with increasing timestamps: each call starts 1000 ns after the
    /// previous one's start and lasts `dur` ns (default 100).
    pub struct Script {
        pub pid: u32,
        pub ts: u64,
        pub records: Vec<CallLine>,
    }

    impl Script {
        pub fn new(pid: u32) -> Self {
            Script {
                pid,
                ts: 1_000,
                records: Vec::new(),
            }
        }

        pub fn call(&mut self, name: &str, fill: impl FnOnce(&mut CallLine)) -> &mut Self {
            let mut record = CallLine {
                name: name.into(),
                pid: self.pid,
                tid: self.pid,
                ts_ns: self.ts,
                dur_ns: 100,
                ..Default::default()
            };
            fill(&mut record);
            self.ts += 1_000;
            self.records.push(record);
            self
        }

        pub fn plain(&mut self, name: &str) -> &mut Self {
            self.call(name, |_| {})
        }

        pub fn alloc(&mut self, dptr: u64, bytes: u64) -> &mut Self {
            self.call("cuMemAlloc_v2", |r| {
                r.dptr = Some(Hex(dptr));
                r.bytes = Some(bytes);
            })
        }

        pub fn free(&mut self, dptr: u64) -> &mut Self {
            self.call("cuMemFree_v2", |r| r.dptr = Some(Hex(dptr)))
        }

        pub fn copy(&mut self, name: &str, kind: &'static str, bytes: u64) -> &mut Self {
            self.call(name, |r| {
                r.kind = Some(kind.into());
                r.bytes = Some(bytes);
            })
        }

        /// The calls through a fresh analysis.
        pub fn report(&self) -> Report {
            let mut analysis = Analysis::default();
            for record in &self.records {
                analysis.observe(&mut record.clone());
            }
            analysis.finish()
        }

        pub fn launch(&mut self, function: u64) -> &mut Self {
            self.call("cuLaunchKernel", |r| {
                r.function = Some(Hex(function));
                r.grid = Some([1, 1, 1]);
                r.block = Some([32, 1, 1]);
            })
        }
    }
}
