//! Kernel names on launches. Launches carry only a handle; the name comes from the call
//! that created the handle: `cuModuleGetFunction` (name -> CUfunction),
//! `cuLibraryGetKernel` (name -> CUkernel) and `cuKernelGetFunction` (CUkernel ->
//! CUfunction). Since CUDA 12 a CUkernel may be launched where a CUfunction is expected,
//! so a launch's handle is looked up in both tables.

use std::sync::Arc;

use foldhash::HashMap;

use super::role::Role;
use crate::schema::{CallLine, Hex};

/// A kernel name: what to show, and the raw name where that differs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelName {
    /// Demangled C++ name, or the raw name where it is not an Itanium-mangled one.
    pub display: Arc<str>,
    /// The raw name, when `display` differs from it.
    pub mangled: Option<Arc<str>>,
    /// The probe cut the name at its 4 KiB limit: `display` is what was captured.
    pub truncated: bool,
}

/// Demangles an Itanium C++ ABI name; `None` for names that are not mangled
/// (`extern "C"`, cuBLAS's `sm90_xmma_gemm_...`, Triton's) or do not parse.
pub fn demangle(raw: &str) -> Option<String> {
    if !raw.starts_with("_Z") {
        return None;
    }
    cpp_demangle::Symbol::new(raw.as_bytes())
        .ok()?
        .demangle()
        .ok()
}

/// Raw name -> [`KernelName`], shared by all processes so each name is demangled once.
#[derive(Default)]
pub struct KernelNames {
    by_raw: HashMap<String, Arc<KernelName>>,
}

impl KernelNames {
    /// The name for `raw`. A name the probe cut short is kept as captured, never
    /// demangled: a prefix could demangle into a different, wrong name.
    pub fn get(&mut self, raw: &str, truncated: bool) -> Arc<KernelName> {
        if let Some(name) = self.by_raw.get(raw) {
            return name.clone();
        }
        let demangled = if truncated { None } else { demangle(raw) };
        let name = Arc::new(match demangled {
            Some(display) if display != raw => KernelName {
                display: display.into(),
                mangled: Some(raw.into()),
                truncated,
            },
            _ => KernelName {
                display: raw.into(),
                mangled: None,
                truncated,
            },
        });
        self.by_raw.insert(raw.to_owned(), name.clone());
        name
    }
}

/// One process's handle tables (handles are addresses in its address space).
#[derive(Default)]
pub struct KernelTable {
    functions: HashMap<u64, Arc<KernelName>>,
    kernels: HashMap<u64, Arc<KernelName>>,
}

impl KernelTable {
    /// Registers names from successful creation calls; names launches.
    pub fn observe(&mut self, names: &mut KernelNames, role: Role, record: &mut CallLine) {
        let ok = record.ok();
        match role {
            Role::GetFunction | Role::GetKernel if ok => {
                let (Some(symbol), Some(Hex(handle))) = (
                    record.symbol.as_deref(),
                    if role == Role::GetFunction {
                        record.function
                    } else {
                        record.kernel_handle
                    },
                ) else {
                    return;
                };
                let table = if role == Role::GetFunction {
                    &mut self.functions
                } else {
                    &mut self.kernels
                };
                // An unreadable name (empty) must not name launches: they stay unknown@.
                if symbol.is_empty() {
                    table.remove(&handle);
                    return;
                }
                let truncated = record.warnings.iter().any(|w| w == "string_truncated");
                table.insert(handle, names.get(symbol, truncated));
            }
            Role::KernelGetFunction if ok => {
                let (Some(Hex(kernel)), Some(Hex(function))) =
                    (record.kernel_handle, record.function)
                else {
                    return;
                };
                match self.kernels.get(&kernel) {
                    Some(name) => {
                        self.functions.insert(function, name.clone());
                    }
                    // A kernel from before attaching: its function must not keep a stale name.
                    None => {
                        self.functions.remove(&function);
                    }
                }
            }
            Role::Launch if record.kernel.is_none() => {
                let Some(Hex(handle)) = record.function else {
                    return;
                };
                match self.name_of(handle) {
                    Some(name) => {
                        record.kernel = Some(name.display.to_string());
                        record.kernel_mangled = name.mangled.as_deref().map(str::to_owned);
                        if name.truncated {
                            record
                                .warnings
                                .push(std::borrow::Cow::Borrowed("kernel_name_truncated"));
                        }
                    }
                    None => record.kernel = Some(format!("unknown@{handle:#x}")),
                }
            }
            _ => {}
        }
    }

    /// A launch handle's name: a CUfunction, else a CUkernel launched directly.
    fn name_of(&self, handle: u64) -> Option<&Arc<KernelName>> {
        self.functions
            .get(&handle)
            .or_else(|| self.kernels.get(&handle))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{Analysis, testing::Script};

    const VECTOR_ADD: &str = "_Z10vector_addPKfS0_Pfi";
    const ADD_KERNEL: &str = "_ZN5torch6native10add_kernelEPKfS2_Pfi";

    fn analyse(script: &Script) -> Vec<CallLine> {
        let mut analysis = Analysis::default();
        let mut records = script.records.clone();
        for record in &mut records {
            analysis.observe(record);
        }
        records
    }

    fn kernel(record: &CallLine) -> (Option<&str>, Option<&str>) {
        (record.kernel.as_deref(), record.kernel_mangled.as_deref())
    }

    #[test]
    fn demangling_follows_the_itanium_abi() {
        assert_eq!(
            demangle(VECTOR_ADD).as_deref(),
            Some("vector_add(float const*, float const*, float*, int)")
        );
        assert_eq!(
            demangle(ADD_KERNEL).as_deref(),
            Some("torch::native::add_kernel(float const*, float const*, float*, int)")
        );
        assert_eq!(demangle("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n"), None);
        assert_eq!(demangle("_Z"), None);
        assert_eq!(demangle("_Zfoo bar"), None);
    }

    #[test]
    fn module_function_launched_by_handle_gets_the_demangled_name() {
        let mut script = Script::new(10);
        script
            .call("cuModuleGetFunction", |r| {
                r.function = Some(Hex(0x1030));
                r.module = Some(Hex(0x1020));
                r.symbol = Some(VECTOR_ADD.into());
            })
            .launch(0x1030)
            .call("cuLaunchKernelEx_ptsz", |r| r.function = Some(Hex(0x1030)));
        let records = analyse(&script);
        let expected = (
            Some("vector_add(float const*, float const*, float*, int)"),
            Some(VECTOR_ADD),
        );
        assert_eq!(kernel(&records[1]), expected);
        assert_eq!(kernel(&records[2]), expected);
        assert_eq!(kernel(&records[0]), (None, None), "only launches are named");
    }

    #[test]
    fn library_kernel_and_its_function_share_the_name() {
        let mut script = Script::new(10);
        script
            .call("cuLibraryGetKernel", |r| {
                r.kernel_handle = Some(Hex(0x1050));
                r.library = Some(Hex(0x1040));
                r.symbol = Some(ADD_KERNEL.into());
            })
            .call("cuKernelGetFunction", |r| {
                r.function = Some(Hex(0x1060));
                r.kernel_handle = Some(Hex(0x1050));
            })
            .launch(0x1060)
            // Launching the CUkernel handle itself, as CUDA 12 allows.
            .launch(0x1050)
            .call("cuLaunchCooperativeKernel", |r| {
                r.function = Some(Hex(0x1050))
            });
        let records = analyse(&script);
        let expected = (
            Some("torch::native::add_kernel(float const*, float const*, float*, int)"),
            Some(ADD_KERNEL),
        );
        for record in &records[2..] {
            assert_eq!(kernel(record), expected, "{}", record.name);
        }
    }

    #[test]
    fn unmangled_names_are_kept_without_a_mangled_copy() {
        let gemm = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas";
        let mut script = Script::new(10);
        script
            .call("cuModuleGetFunction", |r| {
                r.function = Some(Hex(0x2000));
                r.symbol = Some(gemm.into());
            })
            .launch(0x2000);
        assert_eq!(kernel(&analyse(&script)[1]), (Some(gemm), None));
    }

    #[test]
    fn unknown_handles_are_reported_never_guessed() {
        let mut script = Script::new(10);
        script
            // A failed lookup registers nothing.
            .call("cuModuleGetFunction", |r| {
                r.ret = Some(500);
                r.function = Some(Hex(0x3000));
                r.symbol = Some("missing_kernel".into());
            })
            .launch(0x3000)
            // A kernel created before attaching: its function stays unknown.
            .call("cuKernelGetFunction", |r| {
                r.function = Some(Hex(0x4000));
                r.kernel_handle = Some(Hex(0x3500));
            })
            .launch(0x4000);
        let records = analyse(&script);
        assert_eq!(kernel(&records[1]), (Some("unknown@0x3000"), None));
        assert_eq!(kernel(&records[3]), (Some("unknown@0x4000"), None));
    }

    #[test]
    fn unreadable_names_leave_launches_unknown() {
        let mut analysis = Analysis::default();
        let mut script = Script::new(10);
        script.call("cuLibraryGetKernel", |r| {
            r.kernel_handle = Some(Hex(0x5000));
            r.symbol = Some(String::new());
            r.warnings.push("entry_read_failed".into());
        });
        script.launch(0x5000);
        let mut records = script.records.clone();
        for record in &mut records {
            analysis.observe(record);
        }
        assert_eq!(records[1].kernel.as_deref(), Some("unknown@0x5000"));
    }

    #[test]
    fn handles_are_per_process_and_die_with_exec() {
        let mut analysis = Analysis::default();
        let mut script = Script::new(10);
        script.call("cuModuleGetFunction", |r| {
            r.function = Some(Hex(0x1030));
            r.symbol = Some(VECTOR_ADD.into());
        });
        let mut other = Script::new(11);
        other.launch(0x1030);
        let mut again = Script::new(10);
        again.launch(0x1030);
        let mut records: Vec<CallLine> = script.records.clone();
        analysis.observe(&mut records[0]);
        let mut foreign = other.records[0].clone();
        analysis.observe(&mut foreign);
        assert_eq!(foreign.kernel.as_deref(), Some("unknown@0x1030"));
        analysis.process_event(10, "exec");
        let mut after_exec = again.records[0].clone();
        analysis.observe(&mut after_exec);
        assert_eq!(after_exec.kernel.as_deref(), Some("unknown@0x1030"));
    }

    #[test]
    fn truncated_names_are_not_demangled() {
        let mut script = Script::new(10);
        script
            .call("cuModuleGetFunction", |r| {
                r.function = Some(Hex(0x1030));
                r.symbol = Some("_Z10vector_addPKf".into());
                r.warnings = vec!["string_truncated".into()];
            })
            .launch(0x1030);
        assert_eq!(
            kernel(&analyse(&script)[1]),
            (Some("_Z10vector_addPKf"), None)
        );
    }
}
