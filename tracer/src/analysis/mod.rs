//! Meaning from the call stream: kernel names on launches, live device memory, the stages
//! of a run and per-function/per-kernel statistics.
//!
//! [`Analysis`] is fed the trace's lines ([`Analysis::line`]) one at a time, in trace
//! order, by `cudatrace run` (its enrich stage, before each line is written) and by
//! `cudatrace summary` (while reading a trace); `export` and `plot` take only what it adds
//! to calls ([`Analysis::annotate`]). All therefore compute the same figures. Its memory
//! grows with the number of distinct functions, kernels, live handles and live
//! allocations, never with the number of calls.
//!
//! | file | |
//! |---|---|
//! | `role.rs` | what each function does (allocation, copy, launch, sync...) |
//! | `process.rs` | one process's trackers (kernels, memory, stages, NCCL, contexts), one chain each call goes through |
//! | `kernels.rs` | kernel names for launches, from the calls that made the handles |
//! | `memory.rs` | live device memory, peaks and leaks per process |
//! | `stages.rs` | the stages of a run (initialisation ... cleanup) |
//! | `summary.rs` | per-function latency, per-kernel and per-direction statistics |
//! | `driver.rs` | `--kernel`: NVIDIA driver activity by call and class |
//! | `power/`, `energy.rs` | `--power`: energy per GPU, stage and kernel; the arithmetic under it |
//! | `devices.rs` | the device of each launch, copy and allocation (threads' current contexts); figures per device |
//! | `device_map.rs` | `--power --gpu`: which NVML GPU each CUDA device is |
//! | `gpu_link.rs` | `--gpu`, `run` only: GPU work linked to the call that issued it |
//! | `gpu.rs` | `--gpu`: GPU time per kernel, busy time, idle gaps, queueing, bandwidth |
//! | `gpu_context.rs` | `--gpu`, second pass: the CPU in idle gaps, GPU busy per stage |
//! | `nccl/` | NCCL: communicators' ranks, groups, the collectives section |
//! | `ranks/` | several ranks of a job (one trace or many): collectives matched across ranks, who waited for whom, clocks aligned |
//! | `families.rs` | the API family of a symbol (export categories, plot lanes) |
//! | `summarise.rs` | a whole trace file read through the analysis |

pub mod device_map;
pub mod devices;
pub mod driver;
pub mod energy;
pub mod families;
pub mod gpu;
pub mod gpu_context;
pub mod gpu_link;
pub mod kernels;
pub mod memory;
pub mod nccl;
pub mod power;
mod process;
pub mod ranks;
mod role;
pub mod stages;
pub mod summarise;
pub mod summary;

pub use role::{Role, classify};

use foldhash::HashMap;

use crate::{
    events::gpu::GpuEvent,
    schema::{
        CallLine, DriverLine, GpuFooter, GpuHeaderInfo, GpuLine, Line, MemoryFooter, PowerInfo,
        PowerLine, ProcessEvent, ProcessMemory,
    },
};

use self::{
    gpu::{GpuAccumulator, GpuSummary},
    gpu_link::GpuLinker,
    kernels::KernelNames,
    process::{Finished, ProcessState},
    stages::ProcessStages,
    summary::{Summary, SummaryAccumulator},
};

/// The whole analysis of one trace.
#[derive(Default)]
pub struct Analysis {
    names: KernelNames,
    processes: HashMap<u32, ProcessState>,
    finished: Vec<Finished>,
    summary: SummaryAccumulator,
    driver: driver::DriverAccumulator,
    power: power::PowerAccumulator,
    gpu: GpuAccumulator,
    /// The header's `gpu` object (a `--gpu` trace).
    gpu_header: Option<GpuHeaderInfo>,
    /// `cudatrace run --gpu`: linking GPU work to calls.
    gpu_link: Option<GpuLinker>,
    collectives: nccl::CollectiveAccumulator,
    devices: devices::DeviceAccumulator,
}

impl Analysis {
    /// The analysis of `cudatrace run --gpu`: it also links GPU work to calls.
    pub fn with_gpu_linking() -> Self {
        let mut analysis = Analysis {
            gpu_link: Some(GpuLinker::default()),
            ..Analysis::default()
        };
        analysis.collectives.expect_gpu();
        analysis
    }

    /// A line of the trace, in trace order: `cudatrace run`'s enrich stage (between
    /// decoding and writing) and every reader that sums a trace up. Kernel names and live
    /// bytes go into a call itself, and every line counts toward the figures. `run`'s GPU
    /// records go through [`Self::enrich_gpu`] instead.
    pub fn line(&mut self, line: &mut Line) {
        match line {
            Line::Call(call) => {
                self.observe(call);
                if let Some(linker) = &mut self.gpu_link
                    && call.ok()
                    && matches!(
                        classify(&call.name).0,
                        Role::Launch | Role::GraphLaunch | Role::Copy | Role::Memset
                    )
                {
                    linker.call(call.pid, call.tid, call.ts_ns, call.dur_ns, &call.name);
                }
            }
            Line::Process(process) => {
                self.power.process(process.ts_ns, &process.event);
                self.process_event(process.pid, process.event.clone());
            }
            Line::Driver(driver) => self.driver(driver),
            Line::Gpu(gpu) => self.gpu_line(gpu),
            Line::Power(power) => self.power_sample(power),
            Line::Header(header) => {
                if let Some(power) = &header.power {
                    self.power_header(power);
                }
                if let Some(gpu) = &header.gpu {
                    self.gpu_header(gpu);
                }
            }
            Line::Lost(_) | Line::Library(_) | Line::Footer(_) | Line::Unknown => {}
        }
    }

    /// `cudatrace run --gpu`'s enrich stage for a GPU record that came at `arrived_ns`:
    /// work is linked to its call (or kept until it can be), kernels are named, and the
    /// lines ready to write go to `out`, counted toward the figures.
    pub fn enrich_gpu(&mut self, event: GpuEvent, arrived_ns: u64, out: &mut Vec<GpuLine>) {
        let first = out.len();
        let linker = self.gpu_link.get_or_insert_with(GpuLinker::default);
        match event {
            GpuEvent::Line(line @ (GpuLine::Info(_) | GpuLine::Error(_))) => {
                if let GpuLine::Error(error) = &line {
                    linker.counts.fatal_errors += u64::from(error.fatal);
                } else {
                    linker.counts.processes += 1;
                }
                out.push(line);
            }
            GpuEvent::Line(work) => linker.work(work, arrived_ns, out),
            GpuEvent::Api(api) => linker.api(api, arrived_ns, out),
            GpuEvent::Dropped { .. } => {}
        }
        self.finish_gpu_lines(out, first);
    }

    /// `--gpu`: writes unlinked the work that waited too long for its call's record.
    pub fn expire_gpu(&mut self, now_ns: u64, out: &mut Vec<GpuLine>) {
        let first = out.len();
        if let Some(linker) = &mut self.gpu_link {
            linker.expire(now_ns, out);
        }
        self.finish_gpu_lines(out, first);
    }

    /// `--gpu`: a process exec'd or exited, or (`None`) tracing ended: its (every) waiting
    /// work goes out unlinked.
    pub fn end_gpu(&mut self, pid: Option<u32>, out: &mut Vec<GpuLine>) {
        let first = out.len();
        if let Some(linker) = &mut self.gpu_link {
            match pid {
                Some(pid) => linker.end_process(pid, out),
                None => linker.finish(out),
            }
        }
        self.finish_gpu_lines(out, first);
    }

    /// The footer's `gpu` figures (`run --gpu`).
    pub fn gpu_footer(&self) -> Option<GpuFooter> {
        self.gpu_link.as_ref().map(|linker| linker.counts.clone())
    }

    fn finish_gpu_lines(&mut self, out: &mut [GpuLine], first: usize) {
        for line in &mut out[first..] {
            if let GpuLine::Kernel(kernel) = line
                && kernel.kernel_mangled.is_none()
                && kernel.kernel != "unknown"
            {
                let truncated = kernel.link.warnings.iter().any(|w| w == "name_truncated");
                let name = self.names.get(&kernel.kernel, truncated);
                if let Some(mangled) = &name.mangled {
                    kernel.kernel = name.display.to_string();
                    kernel.kernel_mangled = Some(mangled.to_string());
                }
            }
            self.gpu.observe(line);
            self.collectives.gpu_line(line);
        }
    }

    /// A `--gpu` line of a trace read back.
    pub fn gpu_line(&mut self, line: &GpuLine) {
        self.gpu.observe(line);
        self.collectives.gpu_line(line);
    }

    /// Adds `kernel`/`kernel_mangled` to launches and `live_bytes` to memory-changing
    /// calls, then counts the call. Fields already present (a trace read back) are kept.
    pub fn observe(&mut self, record: &mut CallLine) {
        let (role, symbol) = classify(&record.name);
        let process = self.processes.entry(record.pid).or_default();
        process.observe(&mut self.names, role, symbol, record);
        self.devices.observe(role, record);
        self.collectives.observe(role, record);
        self.summary.observe(role, record);
        self.power.call(role, record);
    }

    /// What the analysis knows of NCCL communicator `comm` of process `pid`.
    pub fn nccl_comm(&self, pid: u32, comm: u64) -> Option<&nccl::CommInfo> {
        self.processes.get(&pid)?.nccl.comm(comm)
    }

    /// The header's `power` object (`--power`).
    pub fn power_header(&mut self, info: &PowerInfo) {
        self.power.header(info);
    }

    /// The header's `gpu` object (`--gpu`).
    pub fn gpu_header(&mut self, info: &GpuHeaderInfo) {
        self.gpu_header = Some(info.clone());
        self.collectives.expect_gpu();
    }

    /// A `"type":"power"` line (`--power`).
    pub fn power_sample(&mut self, line: &PowerLine) {
        self.power.sample(line);
    }

    /// Only what [`observe`](Analysis::observe) adds to the line (devices, kernel names,
    /// live bytes, NCCL ranks and groups), without counting it: for readers that draw
    /// lines rather than sum them up. Communicators are followed as in `observe`
    /// ([`nccl_comm`](Analysis::nccl_comm)). Gives the call's role, which it looks up.
    pub fn annotate(&mut self, record: &mut CallLine) -> Role {
        let (role, symbol) = classify(&record.name);
        let process = self.processes.entry(record.pid).or_default();
        process.annotate(&mut self.names, role, symbol, record);
        role
    }

    /// A `"type":"driver"` line (`--kernel`).
    pub fn driver(&mut self, line: &DriverLine) {
        self.driver.observe(line);
    }

    /// A `process` line: `exec` and `exit` end the process's handle and memory tables
    /// (its address space is gone); its figures are kept for the report.
    pub fn process_event(&mut self, pid: u32, event: impl Into<ProcessEvent>) {
        if !event.into().ends_address_space() {
            return;
        }
        self.devices.forget_process(pid);
        if let Some(process) = self.processes.remove(&pid) {
            self.finished.push(process.finish(pid));
        }
    }

    /// The final figures: processes that ended first, then the live ones by pid.
    pub fn finish(mut self) -> Report {
        let mut live: Vec<(u32, ProcessState)> = self.processes.drain().collect();
        live.sort_by_key(|(pid, _)| *pid);
        for (pid, process) in live {
            self.finished.push(process.finish(pid));
        }
        let (memory, stages): (Vec<_>, Vec<_>) = self
            .finished
            .into_iter()
            .filter(|f| f.stages.calls > 0)
            .map(|f| (f.memory, f.stages))
            .unzip();
        let summary = self.summary.finish();
        let calls_first = (summary.calls > 0).then_some(summary.first_ts_ns);
        let gpu = self
            .gpu
            .finish(calls_first, summary.first_ts_ns + summary.span_ns);
        let (power, series) = self.power.finish_with_series(&stages);
        // A `--power --gpu` trace: energy per kernel by GPU time, from a second reading.
        let kernel_energy = power
            .as_ref()
            .filter(|_| self.gpu_header.is_some() || gpu.kernels > 0)
            .map(|power| power::GpuTimeEnergy::new(power, series, self.gpu_header.as_ref()));
        Report {
            summary,
            memory,
            power,
            kernel_energy,
            stages,
            driver: self.driver.finish(),
            gpu,
            collectives: self.collectives.finish(),
            devices: self.devices.finish(),
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
    /// `--power --gpu` traces: energy per kernel by GPU time, waiting for the trace's
    /// `gpu_kernel` lines (`summarise.rs` reads them again), then put in `power`.
    pub kernel_energy: Option<power::GpuTimeEnergy>,
    /// What the GPU ran (`--gpu` traces).
    pub gpu: GpuSummary,
    /// NCCL collectives per process, communicator and op.
    pub collectives: nccl::CollectivesSummary,
    /// Launches, copies and memory per device.
    pub devices: devices::DevicesSummary,
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
                dur_ns: Some(100),
                ret: Some(0),
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
