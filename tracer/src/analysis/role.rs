//! What each driver function does, as far as the analysis is concerned: its [`Role`], from
//! the catalog's families and a few names.

use std::sync::OnceLock;

use foldhash::{HashMap, HashMapExt};

use crate::catalog::{CATALOG, Family, NCCL_CATALOG, STREAM_VARIANTS};

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
    /// cuIpcOpenMemHandle / cuIpcCloseMemHandle: another process's device memory mapped
    /// into this one (not this process's device bytes: its exporter allocated them).
    IpcOpen,
    IpcClose,
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
    /// An NCCL collective or point-to-point call (libnccl).
    Collective,
    /// Everything else (memory access flags, events, stream creation, graph instantiation,
    /// queries, functions outside the catalog, ...).
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
            "cuMemAllocHost_v2" | "cuMemAllocHost" | "cuMemHostAlloc" => Role::HostAlloc,
            "cuMemFreeHost" => Role::HostFree,
            "cuMemCreate" => Role::PhysicalCreate,
            "cuMemRelease" => Role::PhysicalRelease,
            "cuMemMap" => Role::Map,
            "cuMemUnmap" => Role::Unmap,
            "cuMemAddressReserve" => Role::AddressReserve,
            "cuMemAddressFree" => Role::AddressFree,
            "cuGraphLaunch" => Role::GraphLaunch,
            "cuIpcOpenMemHandle_v2" => Role::IpcOpen,
            "cuIpcCloseMemHandle" => Role::IpcClose,
            // In the launch family, but they prepare graphs; they launch nothing.
            "cuGraphInstantiateWithFlags"
            | "cuGraphInstantiateWithParams"
            | "cuGraphInstantiate_v2"
            | "cuGraphExecUpdate_v2"
            | "cuGraphExecUpdate" => Role::Other,
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
                Family::Collective => Role::Collective,
                // NCCL's own allocations are made of the driver calls probed in libcuda.
                Family::Communicator | Family::Group => Role::Other,
                Family::Memory
                | Family::VirtualMemory
                | Family::Sync
                | Family::GpuRecords
                | Family::Other => Role::Other,
            },
        }
    }
}

/// Every catalog symbol and its `_ptsz`/`_ptds` forms, with the function's role.
fn roles() -> &'static HashMap<&'static str, Role> {
    static ROLES: OnceLock<HashMap<&'static str, Role>> = OnceLock::new();
    ROLES.get_or_init(|| {
        let mut roles = HashMap::new();
        for spec in CATALOG.iter().chain(NCCL_CATALOG) {
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
                "cuIpcGetMemHandle",
                "cuMemPrefetchAsync_v2",
                "cuMemPrefetchAsync",
                "cuMemAdvise_v2",
                "cuMemAdvise",
                "cuGraphInstantiateWithFlags",
                "cuGraphInstantiateWithParams",
                "cuGraphInstantiate_v2",
                "cuGraphExecUpdate_v2",
                "cuGraphExecUpdate",
                "cuEventRecord",
                "cuEventRecordWithFlags",
                "cuStreamWaitEvent",
                "cuStreamCreate",
                "cuStreamCreateWithPriority",
                "cuStreamQuery",
                "cuEventCreate",
                "cuEventQuery",
                "cuEventDestroy_v2",
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
        assert_eq!(classify("cuIpcOpenMemHandle").0, Role::IpcOpen);
        assert_eq!(classify("cuGraphInstantiateWithParams_ptsz").0, Role::Other);
        assert_eq!(classify("cuMemcpyBatchAsync_v2_ptsz").0, Role::Copy);
    }
}
