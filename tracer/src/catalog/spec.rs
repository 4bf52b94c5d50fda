//! How the catalog describes a function: its symbols, its family, and how to read each
//! argument (x86-64 SysV order); and the kernel-side `ProbeSpec` each description gives.

use tracer_common::{MAX_OUTS, ProbeSpec, capture};

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
    /// Not a libcuda function: the injection library's delivery of GPU records (`--gpu`).
    GpuRecords,
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
            Family::GpuRecords => "gpu_records",
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

/// Where a decoded value goes in the JSON line (stable names, see docs/trace-format.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Bytes,
    Dptr,
    Src,
    Dst,
    SrcContext,
    DstContext,
    Stream,
    Function,
    Kernel,
    Library,
    Module,
    Context,
    Device,
    Event,
    Graph,
    Pool,
    Handle,
    Flags,
    Offset,
    Alignment,
    Addr,
    Pitch,
    Width,
    Height,
    Value,
    Count,
    Version,
    Image,
    Host,
    SharedMem,
}

/// How one argument word is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// An unsigned number (sizes, counts, flags).
    Num(Field),
    /// A signed 32-bit number (device ordinals).
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
}

use Arg::*;

impl FnSpec {
    /// The first listed symbol, used as the function's documented name.
    pub fn name(&self) -> &'static str {
        self.symbols[0]
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
                LaunchConfig | Memcpy2D | Memcpy3D => {
                    spec.capture = capture::STRUCT;
                    spec.capture_arg = index;
                    spec.capture_len = match arg {
                        LaunchConfig => LAUNCH_CONFIG_LEN,
                        Memcpy2D => MEMCPY2D_LEN,
                        _ => MEMCPY3D_LEN,
                    };
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
}
