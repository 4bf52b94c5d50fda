//! What a function does, as far as the analysis is concerned: a column of the catalog rows
//! ([`FnSpec::role`](super::FnSpec::role)), the family's unless the row says another. The
//! rows' types in `spec.rs` read these; these know nothing of the rows.

/// What a driver function does, as far as the analysis is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Driver, device and context set-up: cuInit, cuDeviceGet, cuCtxCreate, ...
    Setup,
    /// Context destruction and module/library unloading.
    Teardown,
    /// Device memory allocated (cuMemAlloc and its kin).
    DeviceAlloc,
    DeviceFree,
    /// Page-locked host memory (cuMemAllocHost, cuMemHostAlloc).
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
    /// cuStreamBeginCapture*: the stream's work is recorded into a graph from here on.
    CaptureBegin,
    /// cuStreamEndCapture: the capture ends, and gives its graph.
    CaptureEnd,
    /// A CUPTI function (libcupti): how the program's own profiler, and cudatrace's
    /// injection library, use the activity API.
    Cupti,
    /// A call that waits for the device, and what it waits for.
    Sync(SyncOn),
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

/// What a synchronising call waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncOn {
    /// All of the current context's work (cuCtxSynchronize).
    Context,
    /// One stream's work (cuStreamSynchronize).
    Stream,
    /// One event (cuEventSynchronize).
    Event,
}
