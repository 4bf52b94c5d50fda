//! The trace's header: what is traced, on which clock and machine, with which probes on
//! which library; and each library's `library` line, which follows it (or comes later, for
//! a library found while tracing).

use std::{
    collections::{BTreeMap, HashSet},
    time::UNIX_EPOCH,
};

use crate::{
    clock::Clocks,
    probes::{
        attach::AttachFailure,
        discovery::NewLibrary,
        plan::{Plan, PlannedProbe, Plans},
        probe_set::LIBCUDA,
    },
    schema::{
        AttachFailureInfo, AttachInfo, FORMAT_VERSION, GpuHeaderInfo, Header, JOB_ID_VARIABLES,
        KernelHooksInfo, LibcudaInfo, LibraryLine, PowerInfo, ProbeInfo, StacksInfo,
    },
};

/// What the header says of the flags.
pub struct HeaderFlags {
    /// `command`, `pid` (`-p` alone) or `all`.
    pub mode: &'static str,
    pub command: Vec<String>,
    /// `--functions`, as given.
    pub functions: String,
    /// `--launch-entry-only`, or `--gpu`.
    pub launch_entry_only: bool,
    pub ring_bytes: u32,
    pub stacks: Option<StacksInfo>,
    /// The launcher's job ids in cudatrace's environment.
    pub job_ids: BTreeMap<String, String>,
}

/// The launcher's job ids in this process's environment ([`JOB_ID_VARIABLES`] set).
pub fn job_ids() -> BTreeMap<String, String> {
    JOB_ID_VARIABLES
        .iter()
        .filter_map(|name| Some((name.to_string(), std::env::var(name).ok()?)))
        .collect()
}

/// What the header says that is known before anything is attached: the flags, the clocks,
/// and the objects of `--power` and `--gpu` (from their own set-up).
pub struct HeaderBase {
    pub flags: HeaderFlags,
    pub clocks: Clocks,
    pub power: Option<PowerInfo>,
    pub gpu: Option<GpuHeaderInfo>,
}

impl HeaderBase {
    /// The header of a run. `plans` are the libraries attached at start (each has its
    /// `library` line after the header); `pids` the processes traced from the start (the
    /// command's first); symbols in `failures` did not attach and are left out of `probes`.
    pub fn header(
        &self,
        plans: &Plans,
        attach: AttachInfo,
        pids: &[u32],
        failures: Vec<AttachFailureInfo>,
        kernel_hooks: Option<KernelHooksInfo>,
    ) -> Header {
        let flags = &self.flags;
        let (host, kernel) = uname();
        let failed: HashSet<&str> = failures.iter().map(|f| f.symbol.as_str()).collect();
        Header {
            format: "cudatrace".into(),
            version: FORMAT_VERSION,
            cudatrace_version: env!("CARGO_PKG_VERSION").into(),
            mode: flags.mode.into(),
            command: flags.command.clone(),
            pids: pids.to_vec(),
            start_wall: humantime::format_rfc3339_nanos(self.clocks.wall).to_string(),
            start_wall_ns: self
                .clocks
                .wall
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as u64,
            clock: "CLOCK_MONOTONIC".into(),
            start_monotonic_ns: Some(self.clocks.monotonic_ns),
            host,
            kernel,
            functions: flags.functions.clone(),
            launch_entry_only: flags.launch_entry_only,
            libcuda: plans
                .of(&LIBCUDA)
                .map(|plan| LibcudaInfo {
                    path: plan.library.path.display().to_string(),
                    version: plan.library.version.clone(),
                    standin: plan.library.standin,
                })
                .unwrap_or_default(),
            attach,
            ring_bytes: flags.ring_bytes,
            probes: plans
                .probes()
                .filter(|p| !failed.contains(p.symbol.as_str()))
                .map(probe_info)
                .collect(),
            missing_functions: plans
                .iter()
                .flat_map(|plan| &plan.missing)
                .map(|f| f.to_string())
                .collect(),
            aliases: plans
                .iter()
                .flat_map(|plan| plan.aliases.iter().cloned())
                .collect(),
            attach_failures: failures,
            kernel_hooks,
            power: self.power.clone(),
            gpu: self.gpu.clone(),
            stacks: flags.stacks.clone(),
            job_ids: flags.job_ids.clone(),
            ..Header::default()
        }
    }

    /// The header of a start that failed before writing its own: what was known by then.
    pub fn failed_start(
        &self,
        attach: Option<AttachInfo>,
        kernel_hooks: Option<KernelHooksInfo>,
    ) -> Header {
        self.header(
            &Plans::default(),
            attach.unwrap_or_default(),
            &[],
            Vec::new(),
            kernel_hooks,
        )
    }
}

/// A probe as the header and the `library` lines list it.
fn probe_info(probe: &PlannedProbe) -> ProbeInfo {
    ProbeInfo {
        id: probe.id,
        lib: probe.library,
        symbol: probe.symbol.clone(),
        function: probe.function().into(),
        family: probe.spec.family.as_str().into(),
        entry_only: probe.entry_only,
    }
}

/// A symbol that did not attach, as the header and the `library` lines list it.
pub fn failure_info(failure: &AttachFailure) -> AttachFailureInfo {
    AttachFailureInfo {
        symbol: failure.symbol.clone(),
        error: failure.error.clone(),
    }
}

/// The `library` line of a library file planned for the first time (`plan` is its).
pub fn library_line(plan: &Plan, new: &NewLibrary) -> LibraryLine {
    let failed: HashSet<&str> = new
        .outcome
        .failures
        .iter()
        .map(|f| f.symbol.as_str())
        .collect();
    LibraryLine {
        id: plan.id,
        set: plan.set.library.to_owned(),
        path: plan.library.path.display().to_string(),
        device: plan.library.device,
        inode: plan.library.inode,
        version: plan.library.version.clone(),
        standin: plan.library.standin,
        found: new.found.as_str().to_owned(),
        pid: new.pid,
        ts_ns: new.ts_ns,
        probes: plan
            .probes
            .iter()
            .filter(|p| !failed.contains(p.symbol.as_str()))
            .map(probe_info)
            .collect(),
        missing_functions: plan.missing.iter().map(|f| f.to_string()).collect(),
        aliases: plan.aliases.clone(),
        attach_failures: new.outcome.failures.iter().map(failure_info).collect(),
        ..LibraryLine::default()
    }
}

/// This machine's host name, as the header says it.
pub fn host_name() -> String {
    uname().0
}

/// (host name, `sysname release`).
fn uname() -> (String, String) {
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname fills the struct with NUL-terminated fields.
    unsafe { libc::uname(&mut uts) };
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| u8::from_ne_bytes(c.to_ne_bytes()))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (
        field(&uts.nodename),
        format!("{} {}", field(&uts.sysname), field(&uts.release)),
    )
}
