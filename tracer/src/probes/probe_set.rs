//! Probe sets: the libraries cudatrace probes, as data. A set says how to recognise and find
//! its library and what to attach in it (its catalog). Planning binds a set to one file;
//! attaching takes the plans, whatever the library.

use tracer_common::GPU_RECORDS_SYMBOL;

use crate::catalog::{
    Arg, CATALOG, CUPTI_CATALOG, Family, FnSpec, NCCL_CATALOG, Role, STREAM_VARIANTS, cuda_result,
    cupti, nccl,
};

/// Every probe set, in the order their file-name patterns are tried. The index of a set
/// here is how the eBPF side names it (`NamePattern::set`).
pub static PROBE_SETS: &[&ProbeSet] = &[&LIBCUDA, &NCCL, &INJECTION, &CUPTI];

/// A library cudatrace knows how to probe.
#[derive(Debug)]
pub struct ProbeSet {
    /// Its short name, in messages: `libcuda`.
    pub library: &'static str,
    /// What its probed functions are, in messages: `CUDA driver functions`.
    pub functions: &'static str,
    /// The file name without a version: files named `libcuda.so` or `libcuda.so.*` are
    /// this library (the pattern `libcuda.so*`).
    pub soname: &'static str,
    /// The file names to search for, most preferred first.
    pub file_names: &'static [&'static str],
    /// The `run` flag that names the file.
    pub path_flag: &'static str,
    /// How to get the library where it is missing.
    pub install_hint: &'static str,
    /// The symbol that marks cudatrace's stand-in of this library (tests, the no-GPU demo).
    pub standin_marker: &'static str,
    /// Exported functions that identify the library whatever its file is called (`--lib`
    /// of a renamed copy): a file exporting all of them is this library.
    pub identity: &'static [&'static str],
    /// The functions to probe and how to read their arguments.
    pub catalog: &'static [FnSpec],
    /// Suffixes of variants attached with each catalog symbol where the library exports
    /// them (libcuda's per-thread default stream entry points).
    pub variants: &'static [&'static str],
    /// The eBPF programs attached to each symbol: at entry, and at return if any.
    pub programs: Programs,
    /// Whether an exported function is one of the library's API functions: `--functions
    /// all` probes every one of them.
    pub is_api_function: fn(&str) -> bool,
    /// The set's one file is written by cudatrace for the run (`--gpu`'s injection
    /// library): it is planned at start for its catalog alone, never looked for by name in
    /// the traced processes, and attached for every process, as only this run's processes
    /// can map it (so nobody else pays, and a process traced in any way has it).
    pub run_private: bool,
    /// The name of a return code (`CUDA_ERROR_INVALID_VALUE`, `ncclInvalidUsage`).
    pub result_name: fn(u32) -> Option<&'static str>,
}

/// The eBPF programs (by name in the object) a probe set's symbols get.
#[derive(Debug)]
pub struct Programs {
    pub entry: &'static str,
    pub ret: Option<&'static str>,
}

impl Programs {
    /// Every name, return program first: it is attached first, so that no entry is ever
    /// recorded without a return to pair it.
    pub fn names(&self) -> impl Iterator<Item = (&'static str, bool)> {
        self.ret
            .map(|ret| (ret, true))
            .into_iter()
            .chain(std::iter::once((self.entry, false)))
    }
}

/// libcuda's API functions are `cu` and a capital: `cuCtxGetDevice`, not the debugger's
/// `cudbg*` nor the stand-in's `cudatrace_*`.
fn is_cuda_api_function(name: &str) -> bool {
    name.strip_prefix("cu")
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()))
}

/// The CUDA driver: the first probe set.
pub static LIBCUDA: ProbeSet = ProbeSet {
    library: "libcuda",
    functions: "CUDA driver functions",
    soname: "libcuda.so",
    file_names: &["libcuda.so.1", "libcuda.so"],
    path_flag: "--libcuda",
    install_hint: "install the NVIDIA driver",
    standin_marker: "cudatrace_standin_libcuda",
    identity: &["cuInit", "cuDriverGetVersion", "cuGetProcAddress_v2"],
    catalog: CATALOG,
    variants: STREAM_VARIANTS,
    programs: Programs {
        entry: "call_enter",
        ret: Some("call_return"),
    },
    is_api_function: is_cuda_api_function,
    run_private: false,
    result_name: cuda_result::name,
};

/// NCCL's API functions are `nccl` and a capital, or their `pnccl` profiling aliases.
fn is_nccl_api_function(name: &str) -> bool {
    name.strip_prefix("nccl")
        .or_else(|| name.strip_prefix("pnccl"))
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()))
}

/// NCCL, the second probe set: found where the processes load it (PyTorch's wheel
/// `nvidia/nccl/lib/libnccl.so.2`), or by `--lib PATH`.
pub static NCCL: ProbeSet = ProbeSet {
    library: "libnccl",
    functions: "NCCL functions",
    soname: "libnccl.so",
    file_names: &["libnccl.so.2", "libnccl.so"],
    path_flag: "--lib",
    install_hint: "install NCCL (PyTorch's wheels bring it: nvidia/nccl/lib)",
    standin_marker: "cudatrace_standin_libnccl",
    identity: &["ncclGetVersion", "ncclCommInitRank", "ncclAllReduce"],
    catalog: NCCL_CATALOG,
    variants: &[],
    programs: Programs {
        entry: "call_enter",
        ret: Some("call_return"),
    },
    is_api_function: is_nccl_api_function,
    run_private: false,
    result_name: nccl::result_name,
};

/// `--gpu`: cudatrace's injection library, written for the run (`inject/`). Its one symbol
/// is the no-op the library calls with each batch of GPU records; the `gpu_records`
/// program copies them into the ring. A set of its own rather than a special case: it is
/// found in its file, planned and attached like libcuda, and has its `library` line.
pub static INJECTION: ProbeSet = ProbeSet {
    library: "libcudatrace_inject",
    functions: "GPU record deliveries",
    soname: "libcudatrace_inject.so",
    file_names: &["libcudatrace_inject.so"],
    path_flag: "--gpu",
    install_hint: "rebuild cudatrace",
    standin_marker: "",
    identity: &[GPU_RECORDS_SYMBOL],
    catalog: GPU_RECORDS_CATALOG,
    variants: &[],
    programs: Programs {
        entry: "gpu_records",
        ret: None,
    },
    is_api_function: no_api_function,
    run_private: true,
    result_name: no_result_name,
};

/// CUPTI, found where the processes load it (PyTorch's wheel `nvidia/cu13/lib`, and the
/// libcupti `--gpu`'s injection library loads): its activity API's clients, so that `--gpu`
/// sees the program's own profiler take CUPTI and let it go (docs/gpu.md).
pub static CUPTI: ProbeSet = ProbeSet {
    library: "libcupti",
    functions: "CUPTI functions",
    soname: "libcupti.so",
    file_names: &["libcupti.so.13", "libcupti.so.12", "libcupti.so"],
    path_flag: "--lib",
    install_hint: "install CUPTI (PyTorch's wheels bring it: nvidia/cu13/lib)",
    standin_marker: "cudatrace_standin_libcupti",
    identity: &[
        "cuptiGetVersion",
        "cuptiActivityRegisterCallbacks",
        "cuptiActivityEnable",
    ],
    catalog: CUPTI_CATALOG,
    variants: &[],
    programs: Programs {
        entry: "call_enter",
        ret: Some("call_return"),
    },
    is_api_function: no_api_function,
    run_private: false,
    result_name: cupti::result_name,
};

/// The injection library's one function returns nothing.
fn no_result_name(_: u32) -> Option<&'static str> {
    None
}

/// The injection library has no API to probe beyond its catalog: `--functions` is
/// libcuda's.
fn no_api_function(_: &str) -> bool {
    false
}

/// `cudatrace_gpu_records(const GpuRecord *records, uint32_t count)`.
static GPU_RECORDS_CATALOG: &[FnSpec] = &[FnSpec {
    symbols: &[GPU_RECORDS_SYMBOL],
    family: Family::GpuRecords,
    args: &[Arg::Skip, Arg::Skip],
    copy: None,
    role: Role::Other,
}];

impl ProbeSet {
    /// Whether a file called `file_name` is this library: the soname itself, or the soname
    /// followed by `.` and a version (`libcuda.so.1`, `libcuda.so.580.159.04`).
    pub fn matches_file_name(&self, file_name: &str) -> bool {
        file_name
            .strip_prefix(self.soname)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    }

    /// Its index in [`PROBE_SETS`].
    pub fn index(&self) -> u32 {
        PROBE_SETS
            .iter()
            .position(|set| std::ptr::eq(*set, self))
            .expect("every probe set is listed in PROBE_SETS") as u32
    }

    /// The version in a file name (`libcuda.so.580.159.04` gives `580.159.04`;
    /// `libcuda.so.1`, the soname's own number, gives nothing).
    pub fn version_in(&self, file_name: &str) -> Option<String> {
        let version = file_name.strip_prefix(self.soname)?.strip_prefix('.')?;
        version.contains('.').then(|| version.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracer_common::{MAX_ARGS, MAX_OUTS};

    #[test]
    fn every_sets_functions_fit_the_kernel_limits_and_have_unique_symbols() {
        for set in PROBE_SETS {
            for spec in set.catalog {
                let name = spec.name();
                assert!(
                    spec.probe_spec().nargs as usize <= MAX_ARGS,
                    "{name} reads too many arguments"
                );
                let outs = spec.args.iter().filter(|a| a.is_output()).count();
                assert!(outs <= MAX_OUTS, "{name} has {outs} outputs");
                let captures = spec.args.iter().filter(|a| a.is_capture()).count();
                assert!(captures <= 1, "{name} captures {captures} buffers");
            }
            let mut symbols: Vec<&str> = set
                .catalog
                .iter()
                .flat_map(|spec| spec.symbols.iter().copied())
                .collect();
            let count = symbols.len();
            symbols.sort_unstable();
            symbols.dedup();
            assert_eq!(symbols.len(), count, "{}'s symbols", set.library);
        }
    }

    #[test]
    fn version_comes_from_the_real_file_name() {
        assert_eq!(
            LIBCUDA.version_in("libcuda.so.580.159.04").as_deref(),
            Some("580.159.04")
        );
        assert_eq!(LIBCUDA.version_in("libcuda.so.1"), None);
        assert_eq!(LIBCUDA.version_in("libcudart.so.12.8.1"), None);
    }

    #[test]
    fn nccl_is_the_second_set_and_its_api_includes_the_aliases() {
        assert_eq!(NCCL.index(), 1);
        assert!(NCCL.matches_file_name("libnccl.so.2"));
        assert!(NCCL.matches_file_name("libnccl.so.2.28.9"));
        assert!(!NCCL.matches_file_name("libnccl-net.so"));
        assert_eq!(
            NCCL.version_in("libnccl.so.2.28.9").as_deref(),
            Some("2.28.9")
        );
        let api = NCCL.is_api_function;
        assert!(api("ncclAllReduce") && api("pncclAllReduce"));
        assert!(!api("ncclx") && !api("cudatrace_standin_libnccl") && !api("cuInit"));
        assert_eq!((NCCL.result_name)(5), Some("ncclInvalidUsage"));
    }

    #[test]
    fn api_functions_are_cu_and_a_capital() {
        let api = LIBCUDA.is_api_function;
        assert!(api("cuCtxGetDevice_v2") && api("cuInit"));
        assert!(!api("cudbgApiInit") && !api("cudatrace_standin_set_activity_hooks"));
        assert!(!api("cu") && !api("nvCuInit"));
    }

    #[test]
    fn file_names_match_the_soname_and_its_versions_only() {
        for name in ["libcuda.so", "libcuda.so.1", "libcuda.so.580.159.04"] {
            assert!(LIBCUDA.matches_file_name(name), "{name}");
        }
        for name in ["libcudart.so.12", "libcuda.sox", "xlibcuda.so", "libcuda.s"] {
            assert!(!LIBCUDA.matches_file_name(name), "{name}");
        }
        assert_eq!(LIBCUDA.index(), 0);
    }
}
