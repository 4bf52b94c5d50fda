//! How the catalog describes a function: its symbols, its family, and how to read each
//! argument (x86-64 SysV order); and the kernel-side `ProbeSpec` each description gives.

use tracer_common::{MAX_OUTS, ProbeSpec, capture};

use super::role::Role;
use crate::schema::call_fields;

/// Function family, used for grouping in summaries and plots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Init,
    Context,
    Memory,
    VirtualMemory,
    Copy,
    Memset,
    Launch,
    Sync,
    Module,
    /// NCCL collectives and point-to-point calls (libnccl).
    Collective,
    /// NCCL communicator creation, queries and destruction.
    Communicator,
    /// `ncclGroupStart`/`ncclGroupEnd`.
    Group,
    /// Not a libcuda function: the injection library's delivery of GPU records (`--gpu`).
    GpuRecords,
    /// CUPTI's activity API (libcupti): clients taking and giving back GPU recording.
    Cupti,
    /// Functions outside the catalog, probed generically (`--functions`).
    Other,
}

impl Family {
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Init => "init",
            Family::Context => "context",
            Family::Memory => "memory",
            Family::VirtualMemory => "virtual_memory",
            Family::Copy => "copy",
            Family::Memset => "memset",
            Family::Launch => "launch",
            Family::Sync => "sync",
            Family::Module => "module",
            Family::Collective => "collective",
            Family::Communicator => "communicator",
            Family::Group => "group",
            Family::GpuRecords => "gpu_records",
            Family::Cupti => "cupti",
            Family::Other => "other",
        }
    }

    /// The role of a function of this family whose row says none.
    pub const fn role(self) -> Role {
        match self {
            Family::Init | Family::Context => Role::Setup,
            Family::Copy => Role::Copy,
            Family::Memset => Role::Memset,
            Family::Launch => Role::Launch,
            Family::Module => Role::ModuleLoad,
            Family::Collective => Role::Collective,
            Family::Cupti => Role::Cupti,
            // NCCL's own allocations are made of the driver calls probed in libcuda.
            Family::Communicator | Family::Group => Role::Other,
            // Memory calls each say theirs; queries, events and streams have none.
            Family::Memory
            | Family::VirtualMemory
            | Family::Sync
            | Family::GpuRecords
            | Family::Other => Role::Other,
        }
    }
}

/// Copy direction. `Default` is the driver's unified-addressing choice (cuMemcpy, and
/// 2D/3D copies with `CU_MEMORYTYPE_UNIFIED`), which the arguments alone do not reveal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CopyKind {
    HtoD,
    DtoH,
    DtoD,
    HtoH,
    Peer,
    Default,
}

impl CopyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CopyKind::HtoD => "HtoD",
            CopyKind::DtoH => "DtoH",
            CopyKind::DtoD => "DtoD",
            CopyKind::HtoH => "HtoH",
            CopyKind::Peer => "Peer",
            CopyKind::Default => "Default",
        }
    }
}

/// The catalog's `Field` from the rows of the call line's fields that say one.
macro_rules! field {
    ($($(#[$doc:meta])* $field:ident: $wrapper:ident<$inner:ty> $(= $variant:ident)?,)*) => {
        /// Where a decoded argument goes in the call line: one variant for each field of
        /// `schema::call`'s table that names one (stable names, see docs/trace-format.md).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Field {
            $($(
                #[doc = concat!("`", stringify!($field), "`")]
                $variant,
            )?)*
        }
    };
}
call_fields!(field);

/// How one argument word is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// An unsigned 64-bit number (`size_t`, `unsigned long long`: sizes, counts, flags).
    Num(Field),
    /// An `unsigned int`: the low 32 bits of its word. The x86-64 SysV ABI leaves the upper
    /// half of a 32-bit argument undefined, in a register or a stack slot alike.
    U32(Field),
    /// An `unsigned short`: the low 16 bits (memset values).
    U16(Field),
    /// An `unsigned char`: the low 8 bits (memset values).
    U8(Field),
    /// A signed 32-bit number (device ordinals, priorities).
    Int(Field),
    /// A pointer or handle, written as a hex string.
    Ptr(Field),
    /// A 32-bit legacy device pointer (`CUdeviceptr_v1`), as hex.
    Ptr32(Field),
    /// An output pointer: the 64-bit value the callee stored, as hex.
    OutPtr(Field),
    /// An output pointer to a 32-bit value (legacy `CUdeviceptr_v1`, `int`), as hex.
    OutPtr32(Field),
    /// An output pointer to a `size_t`, as a number.
    OutNum(Field),
    /// An output pointer to an `int`, as a number.
    OutInt(Field),
    /// A NUL-terminated string read at entry (kernel names, file names).
    Str(StrField),
    /// One grid dimension (0 = x).
    Grid(u8),
    /// One block dimension (0 = x).
    Block(u8),
    /// Element count of a memset of the given element width in bytes.
    MemsetCount(u8),
    /// `const CUlaunchConfig *`: grid, block, shared memory and stream.
    LaunchConfig,
    /// `const CUDA_MEMCPY2D *`.
    Memcpy2D,
    /// `const CUDA_MEMCPY3D *`.
    Memcpy3D,
    /// `CUipcMemHandle *`, an output: the 64-byte handle the driver wrote, read at return.
    IpcHandleOut,
    /// A `CUipcMemHandle` passed by value. The 64-byte struct is of class MEMORY, so the
    /// caller copies it onto the stack (at entry `[rsp+8]`) and it takes no register: the
    /// arguments after it move up into the registers. Stands at index 6, where the stack
    /// words start; the probes read 4 stack words, the handle's first 32 bytes.
    IpcHandleOnStack,
    /// A `CUipcMemHandle` passed by value on arm64: AAPCS64 passes a struct over 16 bytes
    /// as a pointer to a copy, in the argument's own register. Its first 32 bytes are read
    /// at return, as x86-64 reads them from the stack.
    IpcHandleByRef,
    /// A `CUmemLocation` passed by value: 8 bytes in one register, `type` in the low half
    /// and `id` in the high half.
    Location,
    /// A `CUmem_advise` value.
    Advice,
    /// `size_t *sizes` of a copy batch, whose element count is the argument at the given
    /// index: the sizes are read at return (the first 32) and added up into `bytes`.
    BatchSizes(u8),
    /// `CUDA_GRAPH_INSTANTIATE_PARAMS *`, read at return: flags, upload stream, result.
    GraphInstantiateParams,
    /// An `ncclDataType_t`: its name and element size; with a `Num(Count)` it gives
    /// `bytes` (count x size).
    Datatype,
    /// An `ncclRedOp_t`: its name (`sum`, `prod`, `max`, `min`, `avg`, or `premulsum` for
    /// the ops `ncclRedOpCreatePreMulSum` makes).
    RedOp,
    /// An `ncclUniqueId` passed by value (128 bytes, class MEMORY: on the stack, taking no
    /// register). Stands at index 6; the probes read its first 32 bytes, which hold the
    /// id's random magic and the root's address: the same on every rank of a communicator.
    UniqueIdOnStack,
    /// `ncclUniqueId *`: the first 32 bytes of the (first) id it points to. Also an
    /// `ncclUniqueId` passed by value on arm64, where AAPCS64 passes a pointer to a copy.
    UniqueIdRef,
    /// `ncclComm_t *comms` of `ncclCommInitAll`, an output array whose length is the
    /// argument at the given index: read at return (the first 32).
    CommArrayOut(u8),
    /// A word reported as it is, in `args` (functions outside the catalog).
    Raw,
    /// Present in the signature, not reported.
    Skip,
}

/// String-valued fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrField {
    /// A kernel or function name as passed to the driver (mangled).
    Symbol,
    /// A file path.
    Path,
}

/// Sizes of the structs read through pointers (cuda.h layouts, x86-64).
pub const LAUNCH_CONFIG_LEN: u32 = 56;
pub const MEMCPY2D_LEN: u32 = 128;
pub const MEMCPY3D_LEN: u32 = 200;
pub const IPC_HANDLE_LEN: u32 = 64;
/// Bytes of a `CUipcMemHandle` passed by value that are recorded: the 32 that x86-64's
/// four stack words hold, read through the copy's pointer on arm64.
pub const IPC_HANDLE_BY_VALUE_READ: u32 = 32;
pub const GRAPH_INSTANTIATE_PARAMS_LEN: u32 = 32;
/// Bytes of an `ncclUniqueId` read (of its 128).
pub const UNIQUE_ID_READ: u32 = 32;
/// Sizes of a copy batch read at most (`DATA_LEN / 8`).
pub const BATCH_SIZES_READ: u64 = (tracer_common::DATA_LEN / 8) as u64;

/// One driver function.
#[derive(Debug)]
pub struct FnSpec {
    /// The exported symbols implementing it (their `_ptsz`/`_ptds` forms are found too).
    pub symbols: &'static [&'static str],
    pub family: Family,
    /// Arguments in order.
    pub args: &'static [Arg],
    /// Direction, for copies.
    pub copy: Option<CopyKind>,
    /// What the analysis does with its calls: the family's ([`Family::role`]) unless the
    /// row says another ([`FnSpec::role`]).
    pub role: Role,
}

/// The functions `--launch-entry-only` probes at entry alone: those that launch GPU work
/// and give nothing back but their result (no output argument, nothing read at return).
/// Their `_ptsz` forms go with them.
pub const ENTRY_ONLY_LAUNCHES: &[&str] = &[
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel",
    "cuGraphLaunch",
];

use Arg::*;

/// How a function outside the catalog is probed (`--functions all|GLOB`): its six register
/// arguments as they are, its return code and its time.
pub static GENERIC: FnSpec = FnSpec {
    symbols: &[],
    family: Family::Other,
    args: &[Raw, Raw, Raw, Raw, Raw, Raw],
    copy: None,
    role: Role::Other,
};

/// The argument list of the ABI this is built for: `x86_64`'s (System V, the catalog's
/// order) or `aarch64`'s (AAPCS64), for the few functions where they differ, those taking a
/// struct over 16 bytes by value (x86-64 puts it on the stack and gives its register to the
/// next argument; AAPCS64 passes a pointer to a copy in its own register).
pub const fn by_abi(x86_64: &'static [Arg], aarch64: &'static [Arg]) -> &'static [Arg] {
    if cfg!(target_arch = "aarch64") {
        aarch64
    } else {
        x86_64
    }
}

impl FnSpec {
    /// The row with its own role, where the family's is not what its calls do.
    pub const fn role(self, role: Role) -> FnSpec {
        FnSpec { role, ..self }
    }

    /// The first listed symbol, used as the function's documented name (`generic` for
    /// [`GENERIC`], which probes functions by their own names).
    pub fn name(&self) -> &'static str {
        self.symbols.first().copied().unwrap_or("generic")
    }

    /// Whether `--launch-entry-only` probes this function at entry alone
    /// ([`ENTRY_ONLY_LAUNCHES`]).
    pub fn is_entry_only_launch(&self) -> bool {
        self.family == Family::Launch && ENTRY_ONLY_LAUNCHES.contains(&self.name())
    }

    /// Whether this is [`GENERIC`], the spec of functions outside the catalog.
    pub fn is_generic(&self) -> bool {
        std::ptr::eq(self, &GENERIC)
    }

    /// The kernel-side spec: how many words to read, what to capture, which outputs.
    pub fn probe_spec(&self) -> ProbeSpec {
        // Trailing unreported arguments need not be read.
        let nargs = self
            .args
            .iter()
            .rposition(|a| *a != Skip)
            .map_or(0, |i| i + 1);
        let mut spec = ProbeSpec {
            nargs: nargs as u32,
            ..ProbeSpec::default()
        };
        let mut outs = 0;
        for (index, arg) in self.args.iter().enumerate() {
            let index = index as u32;
            match arg {
                OutPtr(_) | OutPtr32(_) | OutNum(_) | OutInt(_) if outs < MAX_OUTS => {
                    spec.out_args[outs] = index + 1;
                    outs += 1;
                }
                Str(_) => {
                    spec.capture = capture::CSTR;
                    spec.capture_arg = index;
                }
                LaunchConfig
                | Memcpy2D
                | Memcpy3D
                | IpcHandleOut
                | IpcHandleByRef
                | GraphInstantiateParams
                | UniqueIdRef => {
                    spec.capture = capture::STRUCT;
                    spec.capture_arg = index;
                    spec.capture_len = match arg {
                        LaunchConfig => LAUNCH_CONFIG_LEN,
                        Memcpy2D => MEMCPY2D_LEN,
                        Memcpy3D => MEMCPY3D_LEN,
                        IpcHandleOut => IPC_HANDLE_LEN,
                        IpcHandleByRef => IPC_HANDLE_BY_VALUE_READ,
                        UniqueIdRef => UNIQUE_ID_READ,
                        _ => GRAPH_INSTANTIATE_PARAMS_LEN,
                    };
                }
                BatchSizes(count) | CommArrayOut(count) => {
                    spec.capture = capture::STRUCT;
                    spec.capture_arg = index;
                    spec.capture_count_arg = u32::from(*count) + 1;
                }
                _ => {}
            }
        }
        spec
    }

    /// The out slot (see `ProbeSpec::out_args`) of the output argument at `arg_index`.
    pub fn out_slot(&self, arg_index: usize) -> Option<usize> {
        let slot = self.args[..arg_index]
            .iter()
            .filter(|a| a.is_output())
            .count();
        (slot < MAX_OUTS).then_some(slot)
    }
}

impl Arg {
    pub fn is_output(&self) -> bool {
        matches!(self, OutPtr(_) | OutPtr32(_) | OutNum(_) | OutInt(_))
    }

    /// Whether the probe reads memory for this argument (a string, a struct, an array).
    #[cfg(test)]
    pub fn is_capture(&self) -> bool {
        matches!(
            self,
            Str(_)
                | LaunchConfig
                | Memcpy2D
                | Memcpy3D
                | IpcHandleOut
                | IpcHandleByRef
                | BatchSizes(_)
                | GraphInstantiateParams
                | UniqueIdRef
                | CommArrayOut(_)
        )
    }
}
