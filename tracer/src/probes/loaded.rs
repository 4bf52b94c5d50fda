//! The eBPF object as a run holds it: loaded once, and what the run reads and writes while
//! tracing taken out of it at load, each part then owned by whoever uses it (as aya's own
//! ring-buffer tests hold `RingBufTest { bpf, ring_buf, .. }`). What is left in the
//! object, its programs and the maps only attaching touches (`--kernel`'s), is lent to the
//! attach layer to attach and detach.

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
};
use tracer_common::stacks::PyProcess;

use super::{
    attach::MultiPrograms,
    maps::{self, CounterReader, LinkedSet, NamePatterns, ProbeTable, StopMaps, TracedSet},
    object::{self, LoadOptions},
    stack_programs::StackPrograms,
};

/// The loaded object, taken apart.
pub struct LoadedObject {
    /// The programs, and the maps nothing takes out: attached and detached by the attach
    /// layer.
    pub bpf: Ebpf,
    /// The probe sets' programs loaded for uprobe_multi links, or why there are none.
    pub uprobe_multi: Result<MultiPrograms, String>,
    /// The events ring: the event loop's.
    pub ring: RingBuf<MapData>,
    /// The kernel's loss and entry counters: the event loop's.
    pub counters: CounterReader,
    /// Each probe's spec, written as libraries are planned.
    pub probe_table: ProbeTable,
    /// The traced processes, and the flag that stops recording.
    pub traced: TracedSet,
    /// The file names discovery recognises libraries by.
    pub names: NamePatterns,
    /// The processes with per-process probes.
    pub linked: LinkedSet,
    /// Whether processes may be stopped, and those stopped.
    pub stops: StopMaps,
    /// `--stacks`: the stack programs loaded, and the maps the run uses.
    pub stacks: Option<StackMaps>,
}

/// What `--stacks` uses of the object.
pub struct StackMaps {
    pub programs: StackPrograms,
    /// Each process's interpreter layout.
    pub interpreters: BpfHashMap<MapData, u32, PyProcess>,
    /// The stack programs' counters.
    pub counters: PerCpuArray<MapData, u64>,
    /// The code objects of known stacks, by (process image, address): `KNOWN_CODES`.
    pub known_codes: BpfHashMap<MapData, [u64; 2], u32>,
}

impl LoadedObject {
    /// Loads the object with this run's globals (nothing is attached yet) and takes it
    /// apart.
    pub fn load(options: &LoadOptions) -> Result<Self> {
        let mut bpf = object::load(options)?;
        crate::phases::reached("object_loaded");
        // The uprobe_multi copies of the programs are relocated against the object's maps:
        // loaded before any map is taken out.
        let uprobe_multi = MultiPrograms::load(&bpf);
        crate::phases::reached("uprobe_multi_copies_loaded");
        let stacks = match options.stacks {
            Some(_) => Some(StackMaps {
                // Tail-called by the call programs of the same kind only.
                programs: StackPrograms::load(&mut bpf, uprobe_multi.is_ok())
                    .context("loading the stack programs (--stacks)")?,
                interpreters: maps::take_map(&mut bpf, "PYPROC")?,
                counters: maps::take_map(&mut bpf, "STACK_COUNTERS")?,
                known_codes: maps::take_map(&mut bpf, "KNOWN_CODES")?,
            }),
            None => None,
        };
        Ok(LoadedObject {
            stacks,
            uprobe_multi,
            ring: maps::take_ring(&mut bpf)?,
            counters: CounterReader::take(&mut bpf)?,
            probe_table: ProbeTable::take(&mut bpf)?,
            traced: TracedSet::take(&mut bpf)?,
            names: NamePatterns::take(&mut bpf)?,
            linked: LinkedSet::take(&mut bpf)?,
            stops: StopMaps::take(&mut bpf)?,
            bpf,
        })
    }
}
