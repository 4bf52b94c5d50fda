//! The libcuda catalog: every CUDA driver function cudatrace probes, the exported symbols
//! that implement it, and how to read its arguments. Adding a function is adding a row.
//!
//! Signatures follow cuda.h, in x86-64 SysV order: six register words, then stack words
//! (a struct of more than 16 bytes passed by value goes on the stack and takes no
//! register). arm64 (AAPCS64) reads the same list, eight register words then stack words,
//! except where such a struct is passed: there it is a pointer in its own register, and the
//! row gives both lists (`by_abi`). Every 32-bit parameter (`unsigned int`, `int`, an enum) is read with `U32`
//! or `Int`, never `Num`: the ABI leaves the upper half of its register or stack slot
//! undefined, and callers do leave garbage there.

use super::{
    role::{Role, SyncOn},
    spec::{
        Arg::{self, *},
        CopyKind, Family,
        Field::*,
        FnSpec, StrField, by_abi,
    },
};

/// `cuIpcOpenMemHandle`'s arguments: see its row.
const IPC_OPEN_ARGS: &[Arg] = by_abi(
    &[
        OutPtr(Dptr),
        U32(Flags),
        Skip,
        Skip,
        Skip,
        Skip,
        IpcHandleOnStack,
    ],
    IPC_OPEN_AAPCS64,
);
const IPC_OPEN_AAPCS64: &[Arg] = &[OutPtr(Dptr), IpcHandleByRef, U32(Flags)];

const fn f(symbols: &'static [&'static str], family: Family, args: &'static [Arg]) -> FnSpec {
    FnSpec {
        symbols,
        family,
        args,
        copy: None,
        role: family.role(),
    }
}

const fn copy(symbols: &'static [&'static str], kind: CopyKind, args: &'static [Arg]) -> FnSpec {
    FnSpec {
        symbols,
        family: Family::Copy,
        args,
        copy: Some(kind),
        role: Family::Copy.role(),
    }
}

const LAUNCH_ARGS: &[Arg] = &[
    Ptr(Function),
    Grid(0),
    Grid(1),
    Grid(2),
    Block(0),
    Block(1),
    Block(2),
    U32(SharedMem),
    Ptr(Stream),
    Skip,
    Skip,
];

/// cuLibraryLoadData/FromFile(library*, code or path, jitOptions, jitValues, numJitOptions,
/// libraryOptions, libraryValues, numLibraryOptions): the last two are stack arguments.
const fn library_load(source: Arg) -> [Arg; 8] {
    [
        OutPtr(Library),
        source,
        Skip,
        Skip,
        U32(Count),
        Skip,
        Skip,
        U32(LibraryOptionCount),
    ]
}
const LIBRARY_LOAD_DATA: [Arg; 8] = library_load(Ptr(Image));
const LIBRARY_LOAD_FROM_FILE: [Arg; 8] = library_load(Str(StrField::Path));

/// The catalog. Order is the documentation order.
pub static CATALOG: &[FnSpec] = &[
    // Init, device and context.
    f(&["cuInit"], Family::Init, &[U32(Flags)]),
    f(&["cuDriverGetVersion"], Family::Init, &[OutInt(Version)]),
    f(
        &["cuDeviceGet"],
        Family::Init,
        &[OutInt(Device), Int(Device)],
    ),
    f(
        &["cuDevicePrimaryCtxRetain"],
        Family::Context,
        &[OutPtr(Context), Int(Device)],
    ),
    f(
        &["cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2"],
        Family::Context,
        &[Int(Device)],
    )
    .role(Role::Teardown),
    f(
        &["cuCtxCreate", "cuCtxCreate_v2"],
        Family::Context,
        &[OutPtr(Context), U32(Flags), Int(Device)],
    ),
    f(
        &["cuCtxCreate_v3"],
        Family::Context,
        &[OutPtr(Context), Skip, U32(Count), U32(Flags), Int(Device)],
    ),
    f(
        &["cuCtxCreate_v4"],
        Family::Context,
        &[OutPtr(Context), Skip, U32(Flags), Int(Device)],
    ),
    f(
        &["cuCtxDestroy", "cuCtxDestroy_v2"],
        Family::Context,
        &[Ptr(Context)],
    )
    .role(Role::Teardown),
    f(&["cuCtxSetCurrent"], Family::Context, &[Ptr(Context)]),
    f(
        &["cuCtxPushCurrent", "cuCtxPushCurrent_v2"],
        Family::Context,
        &[Ptr(Context)],
    ),
    // The context popped (made current by the push that it undoes).
    f(
        &["cuCtxPopCurrent", "cuCtxPopCurrent_v2"],
        Family::Context,
        &[OutPtr(Context)],
    ),
    f(&["cuCtxSynchronize"], Family::Sync, &[]).role(Role::Sync(SyncOn::Context)),
    f(&["cuCtxSynchronize_v2"], Family::Sync, &[Ptr(Context)]).role(Role::Sync(SyncOn::Context)),
    // Memory.
    f(
        &["cuMemAlloc_v2"],
        Family::Memory,
        &[OutPtr(Dptr), Num(Bytes)],
    )
    .role(Role::DeviceAlloc),
    // The legacy 32-bit entry points take `unsigned int` sizes.
    f(
        &["cuMemAlloc"],
        Family::Memory,
        &[OutPtr32(Dptr), U32(Bytes)],
    )
    .role(Role::DeviceAlloc),
    f(
        &["cuMemAllocHost_v2"],
        Family::Memory,
        &[OutPtr(Host), Num(Bytes)],
    )
    .role(Role::HostAlloc),
    f(
        &["cuMemAllocHost"],
        Family::Memory,
        &[OutPtr(Host), U32(Bytes)],
    )
    .role(Role::HostAlloc),
    f(
        &["cuMemHostAlloc"],
        Family::Memory,
        &[OutPtr(Host), Num(Bytes), U32(Flags)],
    )
    .role(Role::HostAlloc),
    f(
        &["cuMemAllocManaged"],
        Family::Memory,
        &[OutPtr(Dptr), Num(Bytes), U32(Flags)],
    )
    .role(Role::DeviceAlloc),
    f(
        &["cuMemAllocPitch_v2"],
        Family::Memory,
        &[OutPtr(Dptr), OutNum(Pitch), Num(Width), Num(Height), Skip],
    )
    .role(Role::DeviceAlloc),
    f(
        &["cuMemAllocAsync"],
        Family::Memory,
        &[OutPtr(Dptr), Num(Bytes), Ptr(Stream)],
    )
    .role(Role::DeviceAlloc),
    f(
        &["cuMemAllocFromPoolAsync"],
        Family::Memory,
        &[OutPtr(Dptr), Num(Bytes), Ptr(Pool), Ptr(Stream)],
    )
    .role(Role::DeviceAlloc),
    f(&["cuMemFree_v2"], Family::Memory, &[Ptr(Dptr)]).role(Role::DeviceFree),
    f(&["cuMemFree"], Family::Memory, &[Ptr32(Dptr)]).role(Role::DeviceFree),
    f(&["cuMemFreeHost"], Family::Memory, &[Ptr(Host)]).role(Role::HostFree),
    f(
        &["cuMemFreeAsync"],
        Family::Memory,
        &[Ptr(Dptr), Ptr(Stream)],
    )
    .role(Role::DeviceFree),
    // Virtual memory (PyTorch's expandable segments).
    f(
        &["cuMemCreate"],
        Family::VirtualMemory,
        &[OutPtr(Handle), Num(Bytes), Skip, Num(Flags)],
    )
    .role(Role::PhysicalCreate),
    f(&["cuMemRelease"], Family::VirtualMemory, &[Ptr(Handle)]).role(Role::PhysicalRelease),
    f(
        &["cuMemAddressReserve"],
        Family::VirtualMemory,
        &[
            OutPtr(Dptr),
            Num(Bytes),
            Num(Alignment),
            Ptr(Addr),
            Num(Flags),
        ],
    )
    .role(Role::AddressReserve),
    f(
        &["cuMemAddressFree"],
        Family::VirtualMemory,
        &[Ptr(Dptr), Num(Bytes)],
    )
    .role(Role::AddressFree),
    f(
        &["cuMemMap"],
        Family::VirtualMemory,
        &[Ptr(Dptr), Num(Bytes), Num(Offset), Ptr(Handle), Num(Flags)],
    )
    .role(Role::Map),
    f(
        &["cuMemUnmap"],
        Family::VirtualMemory,
        &[Ptr(Dptr), Num(Bytes)],
    )
    .role(Role::Unmap),
    f(
        &["cuMemSetAccess"],
        Family::VirtualMemory,
        &[Ptr(Dptr), Num(Bytes), Skip, Num(Count)],
    ),
    // Memory shared between processes (CUDA IPC, as NCCL and vLLM use it).
    f(
        &["cuIpcGetMemHandle"],
        Family::Memory,
        &[IpcHandleOut, Ptr(Dptr)],
    ),
    // cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags):
    // x86-64 puts the handle on the stack, so Flags takes the second register; arm64
    // passes a pointer to a copy in the second (see `by_abi`).
    f(
        &["cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"],
        Family::Memory,
        IPC_OPEN_ARGS,
    )
    .role(Role::IpcOpen),
    f(&["cuIpcCloseMemHandle"], Family::Memory, &[Ptr(Dptr)]).role(Role::IpcClose),
    // Unified memory hints. The `_v2` forms take a `CUmemLocation` (8 bytes, one register)
    // where the first took a device ordinal.
    f(
        &["cuMemPrefetchAsync_v2"],
        Family::Memory,
        &[Ptr(Dptr), Num(Bytes), Location, U32(Flags), Ptr(Stream)],
    ),
    f(
        &["cuMemPrefetchAsync"],
        Family::Memory,
        &[Ptr(Dptr), Num(Bytes), Int(Device), Ptr(Stream)],
    ),
    f(
        &["cuMemAdvise_v2"],
        Family::Memory,
        &[Ptr(Dptr), Num(Bytes), Advice, Location],
    ),
    f(
        &["cuMemAdvise"],
        Family::Memory,
        &[Ptr(Dptr), Num(Bytes), Advice, Int(Device)],
    ),
    // Copies.
    copy(
        &["cuMemcpy"],
        CopyKind::Default,
        &[Ptr(Dst), Ptr(Src), Num(Bytes)],
    ),
    copy(
        &["cuMemcpyAsync"],
        CopyKind::Default,
        &[Ptr(Dst), Ptr(Src), Num(Bytes), Ptr(Stream)],
    ),
    copy(
        &["cuMemcpyHtoD_v2"],
        CopyKind::HtoD,
        &[Ptr(Dst), Ptr(Src), Num(Bytes)],
    ),
    copy(
        &["cuMemcpyHtoD"],
        CopyKind::HtoD,
        &[Ptr32(Dst), Ptr(Src), U32(Bytes)],
    ),
    copy(
        &["cuMemcpyDtoH_v2"],
        CopyKind::DtoH,
        &[Ptr(Dst), Ptr(Src), Num(Bytes)],
    ),
    copy(
        &["cuMemcpyDtoH"],
        CopyKind::DtoH,
        &[Ptr(Dst), Ptr32(Src), U32(Bytes)],
    ),
    copy(
        &["cuMemcpyDtoD_v2"],
        CopyKind::DtoD,
        &[Ptr(Dst), Ptr(Src), Num(Bytes)],
    ),
    copy(
        &["cuMemcpyDtoD"],
        CopyKind::DtoD,
        &[Ptr32(Dst), Ptr32(Src), U32(Bytes)],
    ),
    copy(
        &["cuMemcpyHtoDAsync_v2"],
        CopyKind::HtoD,
        &[Ptr(Dst), Ptr(Src), Num(Bytes), Ptr(Stream)],
    ),
    copy(
        &["cuMemcpyDtoHAsync_v2"],
        CopyKind::DtoH,
        &[Ptr(Dst), Ptr(Src), Num(Bytes), Ptr(Stream)],
    ),
    copy(
        &["cuMemcpyDtoDAsync_v2"],
        CopyKind::DtoD,
        &[Ptr(Dst), Ptr(Src), Num(Bytes), Ptr(Stream)],
    ),
    copy(
        &["cuMemcpyPeer"],
        CopyKind::Peer,
        &[
            Ptr(Dst),
            Ptr(DstContext),
            Ptr(Src),
            Ptr(SrcContext),
            Num(Bytes),
        ],
    ),
    copy(
        &["cuMemcpyPeerAsync"],
        CopyKind::Peer,
        &[
            Ptr(Dst),
            Ptr(DstContext),
            Ptr(Src),
            Ptr(SrcContext),
            Num(Bytes),
            Ptr(Stream),
        ],
    ),
    copy(
        &["cuMemcpy2D_v2", "cuMemcpy2DUnaligned_v2"],
        CopyKind::Default,
        &[Memcpy2D],
    ),
    copy(
        &["cuMemcpy2DAsync_v2"],
        CopyKind::Default,
        &[Memcpy2D, Ptr(Stream)],
    ),
    copy(&["cuMemcpy3D_v2"], CopyKind::Default, &[Memcpy3D]),
    copy(
        &["cuMemcpy3DAsync_v2"],
        CopyKind::Default,
        &[Memcpy3D, Ptr(Stream)],
    ),
    // cuMemcpyBatchAsync_v2(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, hStream);
    // the first form has `size_t *failIdx` before the stream.
    copy(
        &["cuMemcpyBatchAsync_v2"],
        CopyKind::Default,
        &[
            Skip,
            Skip,
            BatchSizes(3),
            Num(Count),
            Skip,
            Skip,
            Skip,
            Ptr(Stream),
        ],
    ),
    copy(
        &["cuMemcpyBatchAsync"],
        CopyKind::Default,
        &[
            Skip,
            Skip,
            BatchSizes(3),
            Num(Count),
            Skip,
            Skip,
            Skip,
            Skip,
            Ptr(Stream),
        ],
    ),
    // Memsets.
    f(
        &["cuMemsetD8_v2"],
        Family::Memset,
        &[Ptr(Dptr), U8(Value), MemsetCount(1)],
    ),
    f(
        &["cuMemsetD16_v2"],
        Family::Memset,
        &[Ptr(Dptr), U16(Value), MemsetCount(2)],
    ),
    f(
        &["cuMemsetD32_v2"],
        Family::Memset,
        &[Ptr(Dptr), U32(Value), MemsetCount(4)],
    ),
    f(
        &["cuMemsetD8Async"],
        Family::Memset,
        &[Ptr(Dptr), U8(Value), MemsetCount(1), Ptr(Stream)],
    ),
    f(
        &["cuMemsetD16Async"],
        Family::Memset,
        &[Ptr(Dptr), U16(Value), MemsetCount(2), Ptr(Stream)],
    ),
    f(
        &["cuMemsetD32Async"],
        Family::Memset,
        &[Ptr(Dptr), U32(Value), MemsetCount(4), Ptr(Stream)],
    ),
    // Launches.
    f(&["cuLaunchKernel"], Family::Launch, LAUNCH_ARGS),
    f(
        &["cuLaunchKernelEx"],
        Family::Launch,
        &[LaunchConfig, Ptr(Function), Skip, Skip],
    ),
    // Same as cuLaunchKernel less the trailing `extra`, which neither reads.
    f(&["cuLaunchCooperativeKernel"], Family::Launch, LAUNCH_ARGS),
    f(
        &["cuGraphLaunch"],
        Family::Launch,
        &[Ptr(Graph), Ptr(Stream)],
    )
    .role(Role::GraphLaunch),
    // Stream capture: what the stream is given between these is recorded into a graph, not
    // run (cuStreamBeginCapture_v2(stream, mode); the first form has no mode;
    // cuStreamBeginCaptureToGraph(stream, graph, deps, edge data, count, mode) adds to an
    // existing graph). cuStreamEndCapture(stream, CUgraph *graph) gives the graph.
    f(
        &["cuStreamBeginCapture_v2"],
        Family::Launch,
        &[Ptr(Stream), Skip],
    )
    .role(Role::CaptureBegin),
    f(&["cuStreamBeginCapture"], Family::Launch, &[Ptr(Stream)]).role(Role::CaptureBegin),
    f(
        &["cuStreamBeginCaptureToGraph"],
        Family::Launch,
        &[Ptr(Stream), Ptr(Graph), Skip, Skip, Skip, Skip],
    )
    .role(Role::CaptureBegin),
    f(
        &["cuStreamEndCapture"],
        Family::Launch,
        &[Ptr(Stream), OutPtr(Graph)],
    )
    .role(Role::CaptureEnd),
    // Graphs: `graph` is the executable graph (what cuGraphLaunch launches),
    // `source_graph` the CUgraph it comes from.
    f(
        &["cuGraphInstantiateWithFlags"],
        Family::Launch,
        &[OutPtr(Graph), Ptr(SourceGraph), Num(Flags)],
    )
    .role(Role::Other),
    f(
        &["cuGraphInstantiateWithParams"],
        Family::Launch,
        &[OutPtr(Graph), Ptr(SourceGraph), GraphInstantiateParams],
    )
    .role(Role::Other),
    // The first forms: (exec*, graph, CUgraphNode *errorNode, char *log, size_t logSize).
    f(
        &["cuGraphInstantiate_v2", "cuGraphInstantiate"],
        Family::Launch,
        &[OutPtr(Graph), Ptr(SourceGraph), Skip, Skip, Skip],
    )
    .role(Role::Other),
    // cuGraphExecUpdate_v2(exec, graph, CUgraphExecUpdateResultInfo *info): the result is
    // the first field of the info struct.
    f(
        &["cuGraphExecUpdate_v2"],
        Family::Launch,
        &[Ptr(Graph), Ptr(SourceGraph), OutInt(GraphResult)],
    )
    .role(Role::Other),
    f(
        &["cuGraphExecUpdate"],
        Family::Launch,
        &[Ptr(Graph), Ptr(SourceGraph), Skip, OutInt(GraphResult)],
    )
    .role(Role::Other),
    // Synchronisation and ordering.
    f(&["cuStreamSynchronize"], Family::Sync, &[Ptr(Stream)]).role(Role::Sync(SyncOn::Stream)),
    f(&["cuEventSynchronize"], Family::Sync, &[Ptr(Event)]).role(Role::Sync(SyncOn::Event)),
    f(&["cuEventRecord"], Family::Sync, &[Ptr(Event), Ptr(Stream)]),
    f(
        &["cuEventRecordWithFlags"],
        Family::Sync,
        &[Ptr(Event), Ptr(Stream), U32(Flags)],
    ),
    f(
        &["cuStreamWaitEvent"],
        Family::Sync,
        &[Ptr(Stream), Ptr(Event), U32(Flags)],
    ),
    f(
        &["cuStreamCreate"],
        Family::Sync,
        &[OutPtr(Stream), U32(Flags)],
    ),
    f(
        &["cuStreamCreateWithPriority"],
        Family::Sync,
        &[OutPtr(Stream), U32(Flags), Int(Priority)],
    ),
    f(&["cuStreamQuery"], Family::Sync, &[Ptr(Stream)]),
    f(
        &["cuEventCreate"],
        Family::Sync,
        &[OutPtr(Event), U32(Flags)],
    ),
    f(&["cuEventQuery"], Family::Sync, &[Ptr(Event)]),
    f(
        &["cuEventDestroy_v2", "cuEventDestroy"],
        Family::Sync,
        &[Ptr(Event)],
    ),
    // Modules and kernels.
    f(
        &["cuModuleLoad"],
        Family::Module,
        &[OutPtr(Module), Str(StrField::Path)],
    ),
    f(
        &["cuModuleLoadData"],
        Family::Module,
        &[OutPtr(Module), Ptr(Image)],
    ),
    f(
        &["cuModuleLoadDataEx"],
        Family::Module,
        &[OutPtr(Module), Ptr(Image), U32(Count), Skip, Skip],
    ),
    f(
        &["cuModuleLoadFatBinary"],
        Family::Module,
        &[OutPtr(Module), Ptr(Image)],
    ),
    f(&["cuModuleUnload"], Family::Module, &[Ptr(Module)]).role(Role::Teardown),
    f(
        &["cuModuleGetFunction"],
        Family::Module,
        &[OutPtr(Function), Ptr(Module), Str(StrField::Symbol)],
    )
    .role(Role::GetFunction),
    f(&["cuLibraryLoadData"], Family::Module, &LIBRARY_LOAD_DATA),
    f(
        &["cuLibraryLoadFromFile"],
        Family::Module,
        &LIBRARY_LOAD_FROM_FILE,
    ),
    f(&["cuLibraryUnload"], Family::Module, &[Ptr(Library)]).role(Role::Teardown),
    f(
        &["cuLibraryGetKernel"],
        Family::Module,
        &[OutPtr(Kernel), Ptr(Library), Str(StrField::Symbol)],
    )
    .role(Role::GetKernel),
    f(
        &["cuKernelGetFunction"],
        Family::Module,
        &[OutPtr(Function), Ptr(Kernel)],
    )
    .role(Role::KernelGetFunction),
];

/// Suffixes of per-thread default-stream variants, attached beside each symbol.
pub const STREAM_VARIANTS: &[&str] = &["_ptsz", "_ptds"];

/// Whether a symbol is a per-thread default-stream variant, whose stream 0 is the calling
/// thread's default stream.
pub fn is_per_thread_variant(symbol: &str) -> bool {
    STREAM_VARIANTS
        .iter()
        .any(|suffix| symbol.ends_with(suffix))
}

/// Looks a symbol up (the catalog's own tests and the decoder tests use it).
#[cfg(test)]
/// Looks a symbol up: the function it belongs to, including `_ptsz`/`_ptds` forms.
pub fn lookup(symbol: &str) -> Option<&'static FnSpec> {
    let base = STREAM_VARIANTS
        .iter()
        .find_map(|suffix| symbol.strip_suffix(suffix))
        .unwrap_or(symbol);
    CATALOG.iter().find(|spec| spec.symbols.contains(&base))
}

#[cfg(test)]
mod tests;
