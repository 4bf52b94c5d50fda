//! Attaching plans: the programs of each plan's probe set on every planned symbol, each
//! with its probe id as the attach cookie: the generic entry and return programs (libcuda),
//! or a set's own entry program (the injection library's `gpu_records`). One uprobe_multi
//! link per program and plan where the kernel has them (6.6+); when the kernel refuses it
//! (one function it cannot probe fails the whole link), smaller links around the refused
//! functions; else one perf-event link per symbol and program. Detaching everything at the
//! end.

use std::{collections::HashSet, path::Path};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::Array,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeLinkId, UProbeScope},
    },
};
use tracer_common::{MAX_PROBES, ProbeSpec};

use super::{
    object::PROBES_OBJECT,
    plan::{Plan, PlannedProbe, Plans},
    probe_set::Programs,
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

/// The programs of a plan, return probes first; whether each is a return probe.
fn programs_of(programs: Programs) -> Vec<(&'static str, bool)> {
    match programs {
        Programs::Calls => vec![("call_return", true), ("call_enter", false)],
        Programs::Entry(program) => vec![(program, false)],
    }
}

fn attach_plan(bpf: &mut Ebpf, plan: &Plan, attached: &mut Attached) -> Result<Vec<AttachFailure>> {
    let path = &plan.library.path;
    let programs = plan.set.programs;
    if uprobe_multi::supported() {
        match attach_multi(bpf, path, programs, &plan.probes) {
            Ok(links) => {
                attached.multi.extend(links);
                return Ok(Vec::new());
            }
            Err(error) => {
                attached
                    .multi_fallback
                    .get_or_insert_with(|| format!("{error:#}"));
                // The kernel refused the link (a function it cannot probe fails all of
                // them): split the set until the refused functions stand alone. Per-symbol
                // links would do as well but take a grace period each to detach, one after
                // another: minutes for `--functions all`.
                if is_link_refused(&error) {
                    return attach_multi_split(bpf, path, programs, &plan.probes, attached);
                }
            }
        }
    }
    attach_per_symbol(bpf, path, programs, &plan.probes, attached)
}

/// The kernel refused to create a link (an errno from `BPF_LINK_CREATE`), as opposed to the
/// program failing to load, which no subset of the symbols would change.
fn is_link_refused(error: &anyhow::Error) -> bool {
    error.downcast_ref::<std::io::Error>().is_some()
}

/// Failed uprobe_multi attempts after which the rest goes to per-symbol links.
const MAX_REFUSED_LINKS: usize = 64;

/// Attaches `probes` with uprobe_multi links, halving every set the kernel refuses, so the
/// refused functions end up alone and the others keep a link (2 log n links per refused
/// function). Past [`MAX_REFUSED_LINKS`] refusals, what is left goes to per-symbol links.
fn attach_multi_split(
    bpf: &mut Ebpf,
    lib_path: &Path,
    programs: Programs,
    probes: &[PlannedProbe],
    attached: &mut Attached,
) -> Result<Vec<AttachFailure>> {
    let mut failures = Vec::new();
    let (first, second) = probes.split_at(probes.len() / 2);
    let mut pending: Vec<&[PlannedProbe]> = vec![second, first];
    let mut refused = 0;
    let mut left_over: Vec<PlannedProbe> = Vec::new();
    while let Some(chunk) = pending.pop() {
        if chunk.is_empty() {
            continue;
        }
        if refused >= MAX_REFUSED_LINKS {
            left_over.extend_from_slice(chunk);
            continue;
        }
        match attach_multi(bpf, lib_path, programs, chunk) {
            Ok(links) => attached.multi.extend(links),
            Err(error) => {
                refused += 1;
                if let [probe] = chunk {
                    failures.push(AttachFailure {
                        symbol: probe.symbol.clone(),
                        error: format!("{error:#}"),
                    });
                } else {
                    let (first, second) = chunk.split_at(chunk.len() / 2);
                    pending.push(second);
                    pending.push(first);
                }
            }
        }
    }
    if !left_over.is_empty() {
        failures.extend(attach_per_symbol(
            bpf, lib_path, programs, &left_over, attached,
        )?);
    }
    Ok(failures)
}

/// One link per program for all symbols: returns first, so no entry is pushed without its
/// return.
fn attach_multi(
    bpf: &Ebpf,
    lib_path: &Path,
    programs: Programs,
    probes: &[PlannedProbe],
) -> Result<Vec<MultiLink>> {
    let offsets: Vec<u64> = probes.iter().map(|p| p.file_offset).collect();
    let cookies: Vec<u64> = probes.iter().map(|p| u64::from(p.id)).collect();
    programs_of(programs)
        .iter()
        .map(|&(program, retprobe)| {
            uprobe_multi::attach(
                bpf,
                PROBES_OBJECT,
                program,
                lib_path,
                &offsets,
                &cookies,
                retprobe,
            )
        })
        .collect()
}

/// One perf-event link per symbol and program (kernels before 6.6). Detaching these is
/// slow: each close waits for an RCU grace period, one after another.
fn attach_per_symbol(
    bpf: &mut Ebpf,
    lib_path: &Path,
    programs: Programs,
    probes: &[PlannedProbe],
    attached: &mut Attached,
) -> Result<Vec<AttachFailure>> {
    let mut failures = Vec::new();
    let mut failed: HashSet<u32> = HashSet::new();
    for (program_name, _) in programs_of(programs) {
        let program: &mut UProbe = program(bpf, program_name)?;
        // A second plan finds the programs loaded already.
        if program.fd().is_err() {
            program
                .load()
                .with_context(|| format!("loading {program_name}"))?;
        }
        for probe in probes {
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

/// The links of attached probes, taken out of the object: closing them detaches the
/// probes. Each uprobe link close waits for an RCU grace period (about 0.1 s in our VMs,
/// several times that on a loaded machine), so [`Links::close`] closes them from several
/// threads at once, and can run in a thread of its own while the ring is drained.
pub struct Links {
    multi: Vec<MultiLink>,
    per_symbol: Vec<UProbeLink>,
}

impl Links {
    /// Closes every link: the probes are gone when this returns.
    pub fn close(self) {
        let Links {
            multi,
            mut per_symbol,
        } = self;
        let per_thread = per_symbol.len().div_ceil(64).max(1);
        std::thread::scope(|scope| {
            for link in multi {
                scope.spawn(move || drop(link));
            }
            while !per_symbol.is_empty() {
                let chunk: Vec<_> = per_symbol
                    .drain(..per_thread.min(per_symbol.len()))
                    .collect();
                scope.spawn(move || drop(chunk));
            }
        });
    }
}

/// Takes every link out of `attached` and the object, without closing them yet.
pub fn take_links(bpf: &mut Ebpf, attached: &mut Attached) -> Links {
    let mut per_symbol = Vec::with_capacity(attached.links.len());
    for (program_name, link_id) in attached.links.drain(..) {
        let program: Option<&mut UProbe> = bpf
            .program_mut(program_name)
            .and_then(|p| p.try_into().ok());
        if let Some(link) = program.and_then(|p| p.take_link(link_id).ok()) {
            per_symbol.push(link);
        }
    }
    Links {
        multi: attached.multi.drain(..).collect(),
        per_symbol,
    }
}

/// Detaches everything: closes the links, then unloads the programs.
pub fn detach_all(bpf: &mut Ebpf, attached: &mut Attached) {
    take_links(bpf, attached).close();
    unload_programs(bpf);
}

/// Unloads the object's uprobe, tracepoint and kprobe programs, detaching what is still
/// attached. Each detach waits for the kernel (a grace period), so the programs are
/// unloaded from several threads at once.
pub fn unload_programs(bpf: &mut Ebpf) {
    std::thread::scope(|scope| {
        for (_, program) in bpf.programs_mut() {
            scope.spawn(move || {
                let _ = match program {
                    aya::programs::Program::UProbe(p) => p.unload(),
                    aya::programs::Program::TracePoint(p) => p.unload(),
                    aya::programs::Program::KProbe(p) => p.unload(),
                    _ => Ok(()),
                };
            });
        }
    });
}

/// Detaches everything and drops the object, from a thread of its own: the caller can
/// drain the ring meanwhile. Joining the handle means everything is detached.
pub fn detach_in_background(mut bpf: Ebpf, mut attached: Attached) -> std::thread::JoinHandle<()> {
    let links = take_links(&mut bpf, &mut attached);
    std::thread::spawn(move || {
        std::thread::scope(|scope| {
            scope.spawn(move || links.close());
            unload_programs(&mut bpf);
        });
        drop(bpf);
    })
}
