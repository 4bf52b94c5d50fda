//! What to attach and attaching it: the catalog matched against libcuda's exports, the
//! generic entry/return programs attached to each symbol with its cookie, and the
//! process-tracking tracepoints.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        Program, ProgramError, TracePoint, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use tracer_common::{MAX_PROBES, ProbeSpec, counter};

use crate::{
    catalog::{CATALOG, FnSpec, STREAM_VARIANTS},
    libcuda::Libcuda,
    uprobe_multi::{self, MultiLink},
};

/// The eBPF object built by `cargo xtask build-ebpf`, embedded at compile time.
pub static PROBES_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("CUDATRACE_PROBES_OBJ"));

/// What to do when a catalog function is absent from the library or fails to attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MissingProbes {
    /// Stop with an error.
    Error,
    /// Print one line naming them and go on.
    Warn,
    /// Go on silently (they are still listed in the trace header).
    Ignore,
}

/// One symbol to attach.
#[derive(Clone, Debug)]
pub struct PlannedProbe {
    /// The attach cookie, and the index in [`AttachPlan::probes`].
    pub id: u32,
    pub symbol: String,
    pub spec: &'static FnSpec,
    pub file_offset: u64,
}

/// The catalog matched against one library.
#[derive(Clone, Debug, Default)]
pub struct AttachPlan {
    pub probes: Vec<PlannedProbe>,
    /// Catalog functions none of whose symbols the library exports.
    pub missing: Vec<&'static str>,
    /// Exported names skipped because another name shares their address.
    pub aliases: Vec<(String, String)>,
}

/// Matches the catalog against the library's exports: every listed symbol and its
/// per-thread-stream variants, each file offset once.
pub fn plan(lib: &Libcuda) -> AttachPlan {
    let mut plan = AttachPlan::default();
    let mut by_offset: HashMap<u64, String> = HashMap::new();
    for spec in CATALOG {
        let mut found = false;
        for symbol in spec.symbols {
            let variants = std::iter::once(symbol.to_string()).chain(
                STREAM_VARIANTS
                    .iter()
                    .map(|suffix| format!("{symbol}{suffix}")),
            );
            for name in variants {
                let Some(export) = lib.functions.get(&name) else {
                    continue;
                };
                found = true;
                if let Some(first) = by_offset.get(&export.file_offset) {
                    plan.aliases.push((name, first.clone()));
                    continue;
                }
                by_offset.insert(export.file_offset, name.clone());
                plan.probes.push(PlannedProbe {
                    id: plan.probes.len() as u32,
                    symbol: name,
                    spec,
                    file_offset: export.file_offset,
                });
            }
        }
        if !found {
            plan.missing.push(spec.name());
        }
    }
    plan
}

/// Load-time settings of the eBPF object.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub trace_all: bool,
    pub ring_bytes: u32,
    /// Path prefix of NVIDIA device files (`--kernel`; tests point it elsewhere).
    pub device_prefix: String,
}

/// Field offsets of the scheduler tracepoints on the running kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TracepointOffsets {
    newtask_pid: u32,
    newtask_flags: u32,
    exec_filename: u32,
    exit_group_dead: u32,
}

/// Finds tracefs, mounting it at /sys/kernel/tracing if nothing is mounted.
pub fn tracefs() -> Result<PathBuf> {
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(dir.into());
        }
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: plain mount(2) with static NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "tracefs is not mounted and mounting it at /sys/kernel/tracing failed: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok("/sys/kernel/tracing".into())
}

/// The byte offset of `field` in a tracefs `format` file, if present.
pub fn field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let line = line.trim();
        let decl = line.strip_prefix("field:")?.split(';').next()?;
        let name = decl.rsplit([' ', '*']).next()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        let offset = line.split("offset:").nth(1)?.split(';').next()?;
        offset.trim().parse().ok()
    })
}

fn tracepoint_offsets(tracefs: &Path) -> Result<TracepointOffsets> {
    let read = |event: &str| {
        let path = tracefs.join("events").join(event).join("format");
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let newtask = read("task/task_newtask")?;
    let exec = read("sched/sched_process_exec")?;
    let exit = read("sched/sched_process_exit")?;
    let need = |format: &str, field: &str, event: &str| {
        field_offset(format, field)
            .with_context(|| format!("tracepoint {event} has no field {field}"))
    };
    Ok(TracepointOffsets {
        newtask_pid: need(&newtask, "pid", "task_newtask")?,
        newtask_flags: need(&newtask, "clone_flags", "task_newtask")?,
        exec_filename: need(&exec, "filename", "sched_process_exec")?,
        exit_group_dead: field_offset(&exit, "group_dead").unwrap_or(0),
    })
}

/// Loads the probes object with its globals set; nothing is attached yet.
pub fn load(options: &LoadOptions) -> Result<Ebpf> {
    let tracefs = tracefs()?;
    let offsets = tracepoint_offsets(&tracefs)?;
    let trace_all = u32::from(options.trace_all);
    let (prefix, prefix_used) = crate::kernel_hooks::prefix_bytes(&options.device_prefix)?;
    let (xid_code, xid_dev, xid_msg) =
        crate::kernel_hooks::xid_offsets(&tracefs).unwrap_or((0, 0, 0));
    EbpfLoader::new()
        .override_global("DEVICE_PREFIX", &prefix, true)
        .override_global("DEVICE_PREFIX_USED", &prefix_used, true)
        .override_global("XID_CODE_OFF", &xid_code, true)
        .override_global("XID_DEV_OFF", &xid_dev, true)
        .override_global("XID_MSG_OFF", &xid_msg, true)
        .override_global("TRACE_ALL", &trace_all, true)
        .override_global("WAKEUP_BYTES", &(options.ring_bytes / 16), true)
        .override_global("NEWTASK_PID_OFF", &offsets.newtask_pid, true)
        .override_global("NEWTASK_FLAGS_OFF", &offsets.newtask_flags, true)
        .override_global("EXEC_FILENAME_OFF", &offsets.exec_filename, true)
        .override_global("EXIT_GROUP_DEAD_OFF", &offsets.exit_group_dead, true)
        .map_max_entries("EVENTS", options.ring_bytes)
        .load(PROBES_OBJECT)
        .context("loading the eBPF probes")
}

/// A symbol that could not be attached, and why.
#[derive(Clone, Debug)]
pub struct AttachFailure {
    pub symbol: String,
    pub error: String,
}

/// How the libcuda probes were attached.
#[derive(Debug, Default)]
pub struct Attached {
    /// One uprobe_multi link per program (kernels with uprobe_multi, 6.6+).
    multi: Vec<MultiLink>,
    /// Per-symbol perf-event links otherwise.
    links: Vec<(&'static str, UProbeLinkId)>,
}

impl Attached {
    /// `uprobe_multi` or `perf_event`, for the header and doctor.
    pub fn mechanism(&self) -> &'static str {
        if self.multi.is_empty() {
            "perf_event"
        } else {
            "uprobe_multi"
        }
    }
}

/// Writes the specs and attaches entry and return probes to every planned symbol.
/// Return probes go first so no entry is ever pushed without a return to pop it.
pub fn attach_libcuda(
    bpf: &mut Ebpf,
    lib_path: &Path,
    plan: &AttachPlan,
    attached: &mut Attached,
) -> Result<Vec<AttachFailure>> {
    if plan.probes.len() > MAX_PROBES as usize {
        bail!(
            "{} symbols to attach, more than the {MAX_PROBES} the probes support",
            plan.probes.len()
        );
    }
    {
        let mut specs: Array<_, ProbeSpec> =
            Array::try_from(bpf.map_mut("SPECS").context("map SPECS missing")?)?;
        for probe in &plan.probes {
            specs.set(probe.id, probe.spec.probe_spec(), 0)?;
        }
    }
    if uprobe_multi::supported() {
        match attach_multi(bpf, lib_path, plan) {
            Ok(links) => {
                attached.multi = links;
                return Ok(Vec::new());
            }
            // One bad offset fails a whole multi link: per-symbol links name the culprit.
            Err(error) => log::debug!("uprobe_multi attach failed, falling back: {error:#}"),
        }
    }
    attach_per_symbol(bpf, lib_path, plan, attached)
}

/// Two links for all symbols: returns first, so no entry is pushed without its return.
fn attach_multi(bpf: &Ebpf, lib_path: &Path, plan: &AttachPlan) -> Result<Vec<MultiLink>> {
    let offsets: Vec<u64> = plan.probes.iter().map(|p| p.file_offset).collect();
    let cookies: Vec<u64> = plan.probes.iter().map(|p| u64::from(p.id)).collect();
    let returns = uprobe_multi::attach(
        bpf,
        PROBES_OBJECT,
        "call_return",
        lib_path,
        &offsets,
        &cookies,
        true,
    )?;
    let entries = uprobe_multi::attach(
        bpf,
        PROBES_OBJECT,
        "call_enter",
        lib_path,
        &offsets,
        &cookies,
        false,
    )?;
    Ok(vec![returns, entries])
}

/// One perf-event link per symbol and program (kernels before 6.6). Detaching these is
/// slow: each close waits for an RCU grace period, one after another.
fn attach_per_symbol(
    bpf: &mut Ebpf,
    lib_path: &Path,
    plan: &AttachPlan,
    attached: &mut Attached,
) -> Result<Vec<AttachFailure>> {
    let mut failures = Vec::new();
    let mut failed: std::collections::HashSet<u32> = std::collections::HashSet::new();
    for program_name in ["call_return", "call_enter"] {
        let program: &mut UProbe = program(bpf, program_name)?;
        program
            .load()
            .with_context(|| format!("loading {program_name}"))?;
        for probe in &plan.probes {
            if failed.contains(&probe.id) {
                continue;
            }
            let point = UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(probe.file_offset),
                cookie: Some(u64::from(probe.id)),
            };
            match program.attach(point, lib_path, UProbeScope::AllProcesses) {
                Ok(link) => attached.links.push((program_name, link)),
                Err(error) => {
                    failed.insert(probe.id);
                    failures.push(AttachFailure {
                        symbol: probe.symbol.clone(),
                        error: format!("{:#}", anyhow::Error::from(error)),
                    });
                }
            }
        }
    }
    Ok(failures)
}

/// The program `name` of the object, as its type.
pub fn program<'a, P>(bpf: &'a mut Ebpf, name: &str) -> Result<&'a mut P>
where
    &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    let program = bpf
        .program_mut(name)
        .with_context(|| format!("program {name} missing"))?;
    Ok(program.try_into()?)
}

/// Loads and attaches tracepoint programs; each program is named after its event.
pub fn attach_tracepoints(bpf: &mut Ebpf, events: &[(&str, &str)]) -> Result<()> {
    for (category, event) in events {
        let program: &mut TracePoint = program(bpf, event)?;
        program.load().with_context(|| format!("loading {event}"))?;
        program
            .attach(category, event)
            .with_context(|| format!("attaching tracepoint {category}:{event}"))?;
    }
    Ok(())
}

/// Attaches the process-tree tracepoints.
pub fn attach_process_tracking(bpf: &mut Ebpf) -> Result<()> {
    attach_tracepoints(
        bpf,
        &[
            ("task", "task_newtask"),
            ("sched", "sched_process_exec"),
            ("sched", "sched_process_exit"),
        ],
    )
}

/// Detaches everything. Each uprobe link close waits for an RCU grace period (about
/// 0.1 s in our VMs), so links are closed from several threads at once.
pub fn detach_all(bpf: &mut Ebpf, attached: &mut Attached) {
    std::thread::scope(|scope| {
        for link in attached.multi.drain(..) {
            scope.spawn(move || drop(link));
        }
    });
    let mut links = Vec::with_capacity(attached.links.len());
    for (program_name, link_id) in attached.links.drain(..) {
        let program: Option<&mut UProbe> = bpf
            .program_mut(program_name)
            .and_then(|p| p.try_into().ok());
        if let Some(link) = program.and_then(|p| p.take_link(link_id).ok()) {
            links.push(link);
        }
    }
    let per_thread = links.len().div_ceil(64).max(1);
    std::thread::scope(|scope| {
        while !links.is_empty() {
            let chunk: Vec<_> = links.drain(..per_thread.min(links.len())).collect();
            scope.spawn(move || drop(chunk));
        }
    });
    let names: Vec<String> = bpf.programs().map(|(name, _)| name.to_owned()).collect();
    for name in names {
        if let Some(program) = bpf.program_mut(&name) {
            let _ = match program {
                aya::programs::Program::UProbe(p) => p.unload(),
                aya::programs::Program::TracePoint(p) => p.unload(),
                _ => Ok(()),
            };
        }
    }
}

/// Marks a process as traced (the command, or a `-p` target).
pub fn trace_pid(bpf: &mut Ebpf, pid: u32) -> Result<()> {
    let mut traced: BpfHashMap<_, u32, u32> =
        BpfHashMap::try_from(bpf.map_mut("TRACED").context("map TRACED missing")?)?;
    traced
        .insert(pid, 1, 0)
        .context("adding the pid to the traced set")?;
    Ok(())
}

/// Takes the events ring buffer out of the object.
pub fn take_ring(bpf: &mut Ebpf) -> Result<RingBuf<MapData>> {
    Ok(RingBuf::try_from(
        bpf.take_map("EVENTS").context("map EVENTS missing")?,
    )?)
}

/// Kernel-side counters summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub ring_full: u64,
    pub too_deep: u64,
    pub frames_full: u64,
    pub unmatched_returns: u64,
    pub entries: u64,
    pub process_ring_full: u64,
    pub driver_ring_full: u64,
}

impl Counters {
    /// Call events the kernel had to drop.
    pub fn calls_lost(&self) -> u64 {
        self.ring_full + self.too_deep + self.frames_full
    }

    /// All events the kernel had to drop.
    pub fn lost(&self) -> u64 {
        self.calls_lost() + self.process_ring_full + self.driver_ring_full
    }
}

/// Reads the per-CPU counters.
pub struct CounterReader {
    map: PerCpuArray<MapData, u64>,
}

impl CounterReader {
    pub fn take(bpf: &mut Ebpf) -> Result<Self> {
        let map = bpf.take_map("COUNTERS").context("map COUNTERS missing")?;
        Ok(Self {
            map: PerCpuArray::try_from(map)?,
        })
    }

    pub fn read(&self) -> Result<Counters> {
        let sum =
            |index: u32| -> Result<u64> { Ok(self.map.get(&index, 0)?.iter().copied().sum()) };
        Ok(Counters {
            ring_full: sum(counter::RING_FULL)?,
            too_deep: sum(counter::TOO_DEEP)?,
            frames_full: sum(counter::FRAMES_FULL)?,
            unmatched_returns: sum(counter::UNMATCHED_RETURN)?,
            entries: sum(counter::ENTRIES)?,
            process_ring_full: sum(counter::PROC_RING_FULL)?,
            driver_ring_full: sum(counter::DRIVER_RING_FULL)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXIT_FORMAT: &str = "name: sched_process_exit\nID: 369\nformat:\n\
        \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
        \tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;\n\
        \tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;\n\
        \tfield:bool group_dead;\toffset:32;\tsize:1;\tsigned:0;\n";

    #[test]
    fn format_files_give_field_offsets() {
        assert_eq!(field_offset(EXIT_FORMAT, "pid"), Some(24));
        assert_eq!(field_offset(EXIT_FORMAT, "comm"), Some(8));
        assert_eq!(field_offset(EXIT_FORMAT, "group_dead"), Some(32));
        assert_eq!(field_offset(EXIT_FORMAT, "prio"), None);
        let exec = "\tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;\n";
        assert_eq!(field_offset(exec, "filename"), Some(8));
    }

    #[test]
    fn plan_attaches_variants_once_per_address_and_lists_missing() {
        use crate::libcuda::ExportedFn;
        let mut functions = HashMap::new();
        for (name, offset) in [
            ("cuMemAlloc_v2", 0x100),
            ("cuLaunchKernel", 0x200),
            ("cuLaunchKernel_ptsz", 0x210),
            ("cuMemcpyHtoD_v2", 0x300),
            ("cuMemcpyHtoD_v2_ptds", 0x300),
            ("cuSomethingElse", 0x400),
        ] {
            functions.insert(
                name.into(),
                ExportedFn {
                    name: name.into(),
                    file_offset: offset,
                },
            );
        }
        let lib = Libcuda {
            path: "/x".into(),
            version: None,
            standin: false,
            functions,
        };
        let plan = plan(&lib);
        let names: Vec<&str> = plan.probes.iter().map(|p| p.symbol.as_str()).collect();
        assert_eq!(
            names,
            [
                "cuMemAlloc_v2",
                "cuMemcpyHtoD_v2",
                "cuLaunchKernel",
                "cuLaunchKernel_ptsz"
            ]
        );
        assert_eq!(
            plan.probes.iter().map(|p| p.id).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert_eq!(
            plan.aliases,
            [("cuMemcpyHtoD_v2_ptds".into(), "cuMemcpyHtoD_v2".into())]
        );
        assert!(plan.missing.contains(&"cuInit"));
        assert!(!plan.missing.contains(&"cuMemAlloc_v2"));
        assert_eq!(plan.missing.len(), CATALOG.len() - 3);
    }

    #[test]
    fn shared_text_code_touches_no_maps() {
        // uprobe_multi relinks every .text function into each program it loads by hand;
        // a map reference there breaks relocation (keep eBPF helpers inline(always)).
        use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
        let elf = object::File::parse(PROBES_OBJECT).unwrap();
        let text = elf.section_by_name(".text").unwrap();
        for (offset, relocation) in text.relocations() {
            if let RelocationTarget::Symbol(index) = relocation.target() {
                let symbol = elf.symbol_by_index(index).unwrap();
                assert_ne!(
                    symbol.kind(),
                    object::SymbolKind::Data,
                    ".text+{offset:#x} refers to {}",
                    symbol.name().unwrap()
                );
            }
        }
    }
}
