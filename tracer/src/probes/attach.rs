//! Attaching plans: the generic entry and return programs on every planned symbol, each
//! with its probe id as the attach cookie. One uprobe_multi link per program and plan where
//! the kernel has them (6.6+), else one perf-event link per symbol and program; detaching
//! everything at the end.

use std::{collections::HashSet, path::Path};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::Array,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use tracer_common::{MAX_PROBES, ProbeSpec};

use super::{
    object::PROBES_OBJECT,
    plan::{Plan, Plans},
    programs::program,
    uprobe_multi::{self, MultiLink},
};

/// A symbol that could not be attached, and why.
#[derive(Clone, Debug)]
pub struct AttachFailure {
    pub symbol: String,
    pub error: String,
}

/// How the probes were attached.
#[derive(Debug, Default)]
pub struct Attached {
    /// Two uprobe_multi links per plan (kernels with uprobe_multi, 6.6+).
    multi: Vec<MultiLink>,
    /// Per-symbol perf-event links otherwise.
    links: Vec<(&'static str, UProbeLinkId)>,
    /// Why a plan's uprobe_multi attach failed and per-symbol links were used instead.
    pub multi_fallback: Option<String>,
}

impl Attached {
    /// `uprobe_multi`, `perf_event`, or both when some plans fell back.
    pub fn mechanism(&self) -> &'static str {
        match (self.multi.is_empty(), self.links.is_empty()) {
            (false, false) => "uprobe_multi+perf_event",
            (false, true) => "uprobe_multi",
            _ => "perf_event",
        }
    }
}

/// Writes the specs and attaches entry and return probes to every planned symbol.
/// Return probes go first so no entry is ever pushed without a return to pop it.
pub fn attach(
    bpf: &mut Ebpf,
    plans: &Plans,
    attached: &mut Attached,
) -> Result<Vec<AttachFailure>> {
    if plans.probe_count() > MAX_PROBES as usize {
        bail!(
            "{} symbols to attach, more than the {MAX_PROBES} the probes support",
            plans.probe_count()
        );
    }
    {
        let mut specs: Array<_, ProbeSpec> =
            Array::try_from(bpf.map_mut("SPECS").context("map SPECS missing")?)?;
        for probe in plans.probes() {
            specs.set(probe.id, probe.spec.probe_spec(), 0)?;
        }
    }
    let mut failures = Vec::new();
    for plan in plans.iter() {
        failures.extend(attach_plan(bpf, plan, attached)?);
    }
    Ok(failures)
}

fn attach_plan(bpf: &mut Ebpf, plan: &Plan, attached: &mut Attached) -> Result<Vec<AttachFailure>> {
    if uprobe_multi::supported() {
        match attach_multi(bpf, &plan.library.path, plan) {
            Ok(links) => {
                attached.multi.extend(links);
                return Ok(Vec::new());
            }
            // One bad offset fails a whole multi link: per-symbol links name the culprit.
            Err(error) => {
                let why = format!("{error:#}");
                attached.multi_fallback.get_or_insert(why);
            }
        }
    }
    attach_per_symbol(bpf, &plan.library.path, plan, attached)
}

/// Two links for all symbols: returns first, so no entry is pushed without its return.
fn attach_multi(bpf: &Ebpf, lib_path: &Path, plan: &Plan) -> Result<Vec<MultiLink>> {
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
    plan: &Plan,
    attached: &mut Attached,
) -> Result<Vec<AttachFailure>> {
    let mut failures = Vec::new();
    let mut failed: HashSet<u32> = HashSet::new();
    for program_name in ["call_return", "call_enter"] {
        let program: &mut UProbe = program(bpf, program_name)?;
        // A second plan finds the programs loaded already.
        if program.fd().is_err() {
            program
                .load()
                .with_context(|| format!("loading {program_name}"))?;
        }
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
