//! The trace's header: what is traced, on which clock and machine, with which probes on
//! which library.

use std::{collections::HashSet, time::UNIX_EPOCH};

use super::args::RunArgs;
use crate::clock::Clocks;
use crate::{
    probes::{plan::Plans, probe_set::LIBCUDA},
    schema::{
        AttachFailureInfo, AttachInfo, FORMAT_VERSION, Header, KernelHooksInfo, LibcudaInfo,
        ProbeInfo,
    },
};

/// The header of a run. `plans` are the libraries attached at start (each has its
/// `library` line after the header); `pids` the processes traced from the start (the
/// command's first); symbols in `failures` did not attach and are left out of `probes`.
pub fn header(
    args: &RunArgs,
    plans: &Plans,
    attach: AttachInfo,
    clocks: Clocks,
    pids: &[u32],
    failures: Vec<AttachFailureInfo>,
    kernel_hooks: Option<KernelHooksInfo>,
) -> Header {
    let (host, kernel) = uname();
    let mode = if args.all {
        "all"
    } else if args.command.is_empty() {
        "pid"
    } else {
        "command"
    };
    let failed: HashSet<&str> = failures.iter().map(|f| f.symbol.as_str()).collect();
    Header {
        format: "cudatrace".into(),
        version: FORMAT_VERSION,
        cudatrace_version: env!("CARGO_PKG_VERSION").into(),
        mode: mode.into(),
        command: args
            .command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pids: pids.to_vec(),
        start_wall: humantime::format_rfc3339_nanos(clocks.wall).to_string(),
        start_wall_ns: clocks
            .wall
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64,
        clock: "CLOCK_MONOTONIC".into(),
        start_monotonic_ns: Some(clocks.monotonic_ns),
        host,
        kernel,
        functions: args.functions.to_string(),
        launch_entry_only: args.launch_entry_only,
        libcuda: plans
            .of(&LIBCUDA)
            .map(|plan| LibcudaInfo {
                path: plan.library.path.display().to_string(),
                version: plan.library.version.clone(),
                standin: plan.library.standin,
            })
            .unwrap_or_default(),
        attach,
        ring_bytes: args.ring_kib * 1024,
        probes: plans
            .probes()
            .filter(|p| !failed.contains(p.symbol.as_str()))
            .map(|p| ProbeInfo {
                id: p.id,
                lib: p.library,
                symbol: p.symbol.clone(),
                function: p.function().into(),
                family: p.spec.family.as_str().into(),
                entry_only: p.entry_only,
            })
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
        ..Header::default()
    }
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
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (
        field(&uts.nodename),
        format!("{} {}", field(&uts.sysname), field(&uts.release)),
    )
}
