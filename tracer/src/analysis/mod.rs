//! Meaning from the call stream: kernel names on launches, live device memory, the stages
//! of a run and per-function/per-kernel statistics.
//!
//! [`Analysis`] is fed [`CallLine`]s one at a time, in trace order, by `cudatrace run`
//! (its enrich stage, before each line is written) and by `cudatrace summary`, `export`
//! and `plot` (while reading a trace). All therefore compute the same figures. Its memory grows with the number of distinct
//! functions, kernels, live handles and live allocations, never with the number of calls.

pub mod driver;
pub mod families;
pub mod kernels;
pub mod memory;
pub mod stages;
pub mod summarise;
pub mod summary;

use std::{collections::HashMap, sync::OnceLock};

use crate::{
    catalog::{CATALOG, Family, STREAM_VARIANTS},
    events::Event,
    schema::{CallLine, DriverLine, MemoryFooter, ProcessMemory},
};

use self::{
    kernels::{KernelNames, KernelTable},
    memory::MemoryState,
    stages::{ProcessStages, StageTracker},
    summary::{Summary, SummaryAccumulator},
};

/// What a driver function does, as far as the analysis is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Driver, device and context set-up: cuInit, cuDeviceGet, cuCtxCreate, ...
    Setup,
    /// Context destruction and module/library unloading.
    Teardown,
    /// cuMemAlloc*, cuMemAllocPitch, cuMemAllocManaged, cuMemAllocAsync, cuMemAllocFromPoolAsync.
    DeviceAlloc,
    /// cuMemFree*, cuMemFreeAsync.
    DeviceFree,
    /// cuMemAllocHost, cuMemHostAlloc (page-locked host memory).
    HostAlloc,
    HostFree,
    /// cuMemCreate: physical memory behind a generic allocation handle.
    PhysicalCreate,
    PhysicalRelease,
    /// cuMemMap / cuMemUnmap: physical memory mapped into reserved address space.
    Map,
    Unmap,
    /// cuMemAddressReserve / cuMemAddressFree: address space only.
    AddressReserve,
    AddressFree,
    Copy,
    Memset,
    /// A kernel launch with a CUfunction (or CUkernel) handle.
    Launch,
    GraphLaunch,
    /// Calls that wait for the device: stream, context and event synchronisation.
    Sync,
    /// Module and library loading.
    ModuleLoad,
    /// cuModuleGetFunction: name -> CUfunction.
    GetFunction,
    /// cuLibraryGetKernel: name -> CUkernel.
    GetKernel,
    /// cuKernelGetFunction: CUkernel -> CUfunction.
    KernelGetFunction,
    /// Everything else (memory access flags, events, stream creation, ...).
    Other,
}

impl Role {
    fn of(function: &str, family: Family) -> Role {
        match function {
            "cuDevicePrimaryCtxRelease" | "cuCtxDestroy" | "cuModuleUnload" | "cuLibraryUnload" => {
                Role::Teardown
            }
            "cuMemAlloc_v2"
            | "cuMemAlloc"
            | "cuMemAllocManaged"
            | "cuMemAllocPitch_v2"
            | "cuMemAllocAsync"
            | "cuMemAllocFromPoolAsync" => Role::DeviceAlloc,
            "cuMemFree_v2" | "cuMemFree" | "cuMemFreeAsync" => Role::DeviceFree,
            "cuMemAllocHost_v2" | "cuMemHostAlloc" => Role::HostAlloc,
            "cuMemFreeHost" => Role::HostFree,
            "cuMemCreate" => Role::PhysicalCreate,
            "cuMemRelease" => Role::PhysicalRelease,
            "cuMemMap" => Role::Map,
            "cuMemUnmap" => Role::Unmap,
            "cuMemAddressReserve" => Role::AddressReserve,
            "cuMemAddressFree" => Role::AddressFree,
            "cuGraphLaunch" => Role::GraphLaunch,
            "cuCtxSynchronize"
            | "cuCtxSynchronize_v2"
            | "cuStreamSynchronize"
            | "cuEventSynchronize" => Role::Sync,
            "cuModuleGetFunction" => Role::GetFunction,
            "cuLibraryGetKernel" => Role::GetKernel,
            "cuKernelGetFunction" => Role::KernelGetFunction,
            _ => match family {
                Family::Init | Family::Context => Role::Setup,
                Family::Copy => Role::Copy,
                Family::Memset => Role::Memset,
                Family::Launch => Role::Launch,
                Family::Module => Role::ModuleLoad,
                Family::Memory | Family::VirtualMemory | Family::Sync => Role::Other,
            },
        }
    }
}

/// Every catalog symbol and its `_ptsz`/`_ptds` forms, with the function's role.
fn roles() -> &'static HashMap<&'static str, Role> {
    static ROLES: OnceLock<HashMap<&'static str, Role>> = OnceLock::new();
    ROLES.get_or_init(|| {
        let mut roles = HashMap::new();
        for spec in CATALOG {
            let role = Role::of(spec.name(), spec.family);
            for symbol in spec.symbols {
                roles.insert(*symbol, role);
                for suffix in STREAM_VARIANTS {
                    // Built once per process: a few hundred short names.
                    let variant: &'static str = Box::leak(format!("{symbol}{suffix}").into());
                    roles.insert(variant, role);
                }
            }
        }
        roles
    })
}

/// The role of a call line's `name`, and the name as a `'static` string (unknown
/// names, from a newer trace, are [`Role::Other`]).
pub fn classify(name: &str) -> (Role, Option<&'static str>) {
    match roles().get_key_value(name) {
        Some((symbol, role)) => (*role, Some(*symbol)),
        None => (Role::Other, None),
    }
}

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
        let (memory, stages) = self
            .finished
            .into_iter()
            .filter(|f| f.stages.calls > 0)
            .map(|f| (f.memory, f.stages))
            .unzip();
        Report {
            summary: self.summary.finish(),
            memory,
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

    use crate::schema::{CallLine, Hex};

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

        pub fn launch(&mut self, function: u64) -> &mut Self {
            self.call("cuLaunchKernel", |r| {
                r.function = Some(Hex(function));
                r.grid = Some([1, 1, 1]);
                r.block = Some([32, 1, 1]);
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalog_function_has_a_deliberate_role() {
        let other: Vec<&str> = CATALOG
            .iter()
            .map(|spec| spec.name())
            .filter(|name| classify(name).0 == Role::Other)
            .collect();
        assert_eq!(
            other,
            [
                "cuMemSetAccess",
                "cuEventRecord",
                "cuEventRecordWithFlags",
                "cuStreamWaitEvent",
                "cuStreamCreate"
            ]
        );
    }

    #[test]
    fn stream_variants_and_aliases_share_the_role() {
        assert_eq!(
            classify("cuMemcpyHtoD_v2_ptds"),
            (Role::Copy, Some("cuMemcpyHtoD_v2_ptds"))
        );
        assert_eq!(classify("cuLaunchKernel_ptsz").0, Role::Launch);
        assert_eq!(classify("cuLaunchKernelEx").0, Role::Launch);
        assert_eq!(classify("cuLaunchCooperativeKernel").0, Role::Launch);
        assert_eq!(classify("cuMemAllocHost").0, Role::HostAlloc);
        assert_eq!(classify("cuDevicePrimaryCtxRelease_v2").0, Role::Teardown);
        assert_eq!(classify("cuCtxCreate_v4").0, Role::Setup);
        assert_eq!(classify("cuMemAllocAsync_ptsz").0, Role::DeviceAlloc);
        assert_eq!(classify("cuSomethingNew"), (Role::Other, None));
    }
}
