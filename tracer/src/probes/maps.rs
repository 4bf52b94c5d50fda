//! The object's maps as the loader uses them, each taken out of the object once, at load
//! ([`super::loaded::LoadedObject`]), and owned by the part of the run that uses it: the
//! traced-process set, the events ring, the per-CPU loss and entry counters, the probe
//! table (`SPECS`), and discovery's: the library name patterns, the processes with
//! per-process probes, the processes stopped for attaching. [`SIZED_MAPS`] are the hash maps
//! whose size the hidden `--map-entries` flag can change (tests shrink them to prove that a
//! full map is counted, never silent).

use std::os::fd::{AsFd, BorrowedFd};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::{
        Array, HashMap as BpfHashMap, IterableMap, Map, MapData, MapError, PerCpuArray, RingBuf,
    },
};
use tracer_common::{
    MAX_PATTERNS, NamePattern, PATTERN_LEN, PendingChild, ProbeSpec, SLOT_MASK, counter,
};

use super::plan::Plan;

/// Hash maps whose inserts can fail when full, each counted by its own `lost` reason.
pub const SIZED_MAPS: &[&str] = &[
    "TRACED",
    "FRAMES",
    "NV_FDS",
    "PENDING_OPEN",
    "SYSCALLS",
    "KFUNCS",
    "OPENING",
    "PENDING_CHILD",
    "MAPPINGS",
];

/// Takes map `name` out of the object, as its type (for the maps a part of the run owns
/// outside this module: `--stacks`'s).
pub fn take_map<M: TryFrom<Map, Error = MapError>>(bpf: &mut Ebpf, name: &str) -> Result<M> {
    take(bpf, name)
}

/// Takes map `name` out of the object, as its type.
fn take<M: TryFrom<Map, Error = MapError>>(bpf: &mut Ebpf, name: &str) -> Result<M> {
    let map = bpf
        .take_map(name)
        .with_context(|| format!("map {name} missing"))?;
    Ok(M::try_from(map)?)
}

/// Marks a process as traced (the command, or a `-p` target), in an object that still
/// holds its maps (tests; a run's is [`TracedSet::add`]).
#[cfg(test)]
pub fn trace_pid(bpf: &mut Ebpf, pid: u32) -> Result<()> {
    let mut traced: BpfHashMap<_, u32, u32> =
        BpfHashMap::try_from(bpf.map_mut("TRACED").context("map TRACED missing")?)?;
    traced
        .insert(pid, 1, 0)
        .context("adding the pid to the traced set")?;
    Ok(())
}

/// The traced processes (`TRACED`) and the flag that says recording stopped
/// (`TRACING_STOPPED`).
pub struct TracedSet {
    traced: BpfHashMap<MapData, u32, u32>,
    stopped: Array<MapData, u32>,
}

impl TracedSet {
    pub fn take(bpf: &mut Ebpf) -> Result<Self> {
        Ok(TracedSet {
            traced: take(bpf, "TRACED")?,
            stopped: take(bpf, "TRACING_STOPPED")?,
        })
    }

    /// Marks a process as traced (the command, or a `-p` target).
    pub fn add(&mut self, pid: u32) -> Result<()> {
        self.traced
            .insert(pid, 1, 0)
            .context("adding the pid to the traced set")
    }

    /// Stops recording: no process is traced from now on, and the `TRACING_STOPPED` flag
    /// says so (for `--all` and per-process links, which skip the traced-process lookup),
    /// so probes that still fire return at once. Calls already in flight still complete
    /// their events. Detaching, which waits for the kernel, can follow at leisure.
    pub fn stop_tracing(&mut self) -> Result<()> {
        // A few passes: a child forked by a process removed in this pass is inserted by the
        // kernel before its parent leaves the map.
        for _ in 0..8 {
            let pids: Vec<u32> = self.traced.keys().filter_map(Result::ok).collect();
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                let _ = self.traced.remove(&pid);
            }
        }
        self.stopped.set(0, 1, 0).context("marking tracing stopped")
    }
}

/// The probe table (`SPECS`): how the programs read each probe's arguments, by its
/// symbol's slot (a probe id's low bits, `tracer_common::SLOT_BITS`): every copy of a
/// library shares them ([`super::plan::Plans::add`] gives the slots).
pub struct ProbeTable {
    specs: Array<MapData, ProbeSpec>,
}

impl ProbeTable {
    pub fn take(bpf: &mut Ebpf) -> Result<Self> {
        Ok(ProbeTable {
            specs: take(bpf, "SPECS")?,
        })
    }

    /// Writes a plan's specs: before any of its probes can fire. A slot already written
    /// (another copy of the library) gets the same spec again.
    pub fn write(&mut self, plan: &Plan) -> Result<()> {
        for probe in &plan.probes {
            self.specs
                .set(probe.id & SLOT_MASK, probe.spec.probe_spec(), 0)?;
        }
        Ok(())
    }
}

/// A file name the eBPF side recognises as probe set `set`'s library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryName {
    pub set: u32,
    pub name: String,
    /// Exactly this name, not also with a version after it.
    pub exact: bool,
}

/// The names that make an opened file a library to attach (`NAME_PATTERNS`).
pub struct NamePatterns {
    patterns: Array<MapData, NamePattern>,
}

impl NamePatterns {
    pub fn take(bpf: &mut Ebpf) -> Result<Self> {
        Ok(NamePatterns {
            patterns: take(bpf, "NAME_PATTERNS")?,
        })
    }

    /// Sets the names that make an opened file a library to attach.
    pub fn set(&mut self, names: &[LibraryName]) -> Result<()> {
        if names.len() > MAX_PATTERNS as usize {
            bail!(
                "{} library names, more than the {MAX_PATTERNS} the probes hold",
                names.len()
            );
        }
        for (index, library) in names.iter().enumerate() {
            let bytes = library.name.as_bytes();
            if bytes.is_empty() || bytes.len() > PATTERN_LEN {
                bail!(
                    "library name {:?} must be 1 to {PATTERN_LEN} bytes",
                    library.name
                );
            }
            let mut name = [0u8; PATTERN_LEN];
            name[..bytes.len()].copy_from_slice(bytes);
            let pattern = NamePattern {
                len: bytes.len() as u32,
                set: library.set,
                exact: u32::from(library.exact),
                _pad: 0,
                name,
            };
            self.patterns.set(index as u32, pattern, 0)?;
        }
        Ok(())
    }
}

/// The processes with per-process probes (`LINKED`): their fork children stop for their
/// own.
pub struct LinkedSet {
    linked: BpfHashMap<MapData, u32, u32>,
}

impl LinkedSet {
    pub fn take(bpf: &mut Ebpf) -> Result<Self> {
        Ok(LinkedSet {
            linked: take(bpf, "LINKED")?,
        })
    }

    /// Marks `pid` as having per-process probes.
    pub fn mark(&mut self, pid: u32) -> Result<()> {
        self.linked
            .insert(pid, 1, 0)
            .context("adding the pid to the linked set")
    }
}

/// Whether the eBPF side may stop processes (`CONTROL`), and those it stopped (`STOPPED`).
pub struct StopMaps {
    control: Array<MapData, u32>,
    stopped: BpfHashMap<MapData, u32, u64>,
}

impl StopMaps {
    pub fn take(bpf: &mut Ebpf) -> Result<Self> {
        Ok(StopMaps {
            control: take(bpf, "CONTROL")?,
            stopped: take(bpf, "STOPPED")?,
        })
    }

    /// Allows or forbids the eBPF side to stop processes.
    pub fn allow(&mut self, allowed: bool) -> Result<()> {
        Ok(self.control.set(0, u32::from(allowed), 0)?)
    }

    /// The `STOPPED` map's descriptor, for the keeper (`crate::keeper`).
    pub fn stopped_fd(&self) -> BorrowedFd<'_> {
        self.stopped.map().fd().as_fd()
    }

    /// Processes the eBPF side stopped and nobody continued yet.
    pub fn stopped_pids(&self) -> Vec<u32> {
        self.stopped.keys().filter_map(|key| key.ok()).collect()
    }

    /// Counts one of `pid`'s stops as handled; true when none is left (continue it then).
    /// Two threads stopping the process at once are both counted in the kernel; the
    /// process goes on after the second is handled.
    pub fn handled(&mut self, pid: u32) -> bool {
        match self.stopped.get(&pid, 0) {
            Ok(count) if count > 1 => self.stopped.insert(pid, count - 1, 0).is_err(),
            _ => {
                let _ = self.stopped.remove(&pid);
                true
            }
        }
    }

    /// Forgets every stop of `pid` (continued at the end).
    pub fn forget(&mut self, pid: u32) {
        let _ = self.stopped.remove(&pid);
    }
}

/// Takes the events ring buffer out of the object.
pub fn take_ring(bpf: &mut Ebpf) -> Result<RingBuf<MapData>> {
    take(bpf, "EVENTS")
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
    /// `--gpu`: GPU records the ring refused, or that could not be read.
    pub gpu_ring_full: u64,
    pub gpu_read_failed: u64,
    /// `--gpu`: records CUPTI dropped, as its DROPPED records said (counted in userspace).
    pub cupti_dropped: u64,
    /// Libraries a process could not be given its probes on (counted in userspace).
    pub library_not_attached: u64,
    /// `--gpu`: launches, copies and memsets whose work was not recorded, by reason
    /// (counted in userspace, `analysis::gpu_link`).
    pub gpu_cupti_held: u64,
    pub gpu_no_api_record: u64,
    pub gpu_not_flushed: u64,
    pub gpu_not_recorded: u64,
    pub gpu_missing: u64,
    pub traced_full: u64,
    pub fds_full: u64,
    pub opens_full: u64,
    pub syscalls_full: u64,
    pub kfuncs_full: u64,
    pub abandoned_frames: u64,
    pub attach_ring_full: u64,
    pub unidentified_probe: u64,
    pub child_unseen: u64,
}

impl Counters {
    /// Call events the kernel had to drop.
    pub fn calls_lost(&self) -> u64 {
        self.ring_full + self.too_deep + self.frames_full + self.unidentified_probe
    }

    /// GPU records lost on their way (in the ring, reading them, or in CUPTI), and GPU
    /// work never recorded.
    pub fn gpu_lost(&self) -> u64 {
        self.gpu_ring_full
            + self.gpu_read_failed
            + self.cupti_dropped
            + self.gpu_cupti_held
            + self.gpu_no_api_record
            + self.gpu_not_flushed
            + self.gpu_not_recorded
            + self.gpu_missing
    }

    /// All events lost, and the processes, fds and opens the kernel could not follow
    /// (whose events then go unrecorded).
    pub fn lost(&self) -> u64 {
        self.calls_lost()
            + self.process_ring_full
            + self.driver_ring_full
            + self.gpu_lost()
            + self.traced_full
            + self.fds_full
            + self.opens_full
            + self.syscalls_full
            + self.kfuncs_full
            + self.attach_ring_full
            + self.child_unseen
    }
}

/// Reads the per-CPU counters.
pub struct CounterReader {
    map: PerCpuArray<MapData, u64>,
    /// Fork children not yet caught in their own context (`tracer-ebpf/src/process.rs`).
    pending_children: BpfHashMap<MapData, u32, PendingChild>,
}

/// A fork child still waiting to be caught this long after its creation has run without
/// its hook (a new task runs within milliseconds): [`CounterReader::children_unseen`].
const CHILD_UNSEEN_AFTER_NS: u64 = 1_000_000_000;

impl CounterReader {
    pub fn take(bpf: &mut Ebpf) -> Result<Self> {
        Ok(Self {
            map: take(bpf, "COUNTERS")?,
            pending_children: take(bpf, "PENDING_CHILD")?,
        })
    }

    /// The fork children that are still running at the end of tracing and were never
    /// caught in their own context: those that end while traced are counted by the kernel
    /// (`child_unseen`), these only here. A child created in the last second may not have
    /// run yet, and is not counted.
    pub fn children_unseen(&self) -> u64 {
        let now = crate::clock::monotonic_ns();
        self.pending_children
            .iter()
            .filter_map(|entry| entry.ok())
            .filter(|(_, child)| now.saturating_sub(child.ts_ns) >= CHILD_UNSEEN_AFTER_NS)
            .count() as u64
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
            gpu_ring_full: sum(counter::GPU_RING_FULL)?,
            gpu_read_failed: sum(counter::GPU_READ_FAILED)?,
            // Counted in userspace (`run::pipeline`).
            cupti_dropped: 0,
            library_not_attached: 0,
            gpu_cupti_held: 0,
            gpu_no_api_record: 0,
            gpu_not_flushed: 0,
            gpu_not_recorded: 0,
            gpu_missing: 0,
            traced_full: sum(counter::TRACED_FULL)?,
            fds_full: sum(counter::FDS_FULL)?,
            opens_full: sum(counter::OPENS_FULL)?,
            syscalls_full: sum(counter::SYSCALLS_FULL)?,
            kfuncs_full: sum(counter::KFUNCS_FULL)?,
            abandoned_frames: sum(counter::ABANDONED_FRAMES)?,
            attach_ring_full: sum(counter::ATTACH_RING_FULL)?,
            unidentified_probe: sum(counter::UNIDENTIFIED_PROBE)?,
            child_unseen: sum(counter::CHILD_UNSEEN)?,
        })
    }
}

/// Kernels without attach cookies: the entry program tells a probe by the file offset it
/// fired at (`tracer-ebpf/src/identity.rs`). These maps stay in the object: attaching and
/// discovery write them while they hold it.
pub mod identity {
    use super::*;
    use tracer_common::{LibraryMapping, MAX_MAPPINGS, ProbeAt, ProcessMappings};

    /// Names probe `cookie` by where it is: `file_offset` in library `library`.
    pub fn add_probe(bpf: &mut Ebpf, library: u32, file_offset: u64, cookie: u64) -> Result<()> {
        let mut map: BpfHashMap<_, ProbeAt, u64> = borrow(bpf, "PROBES_AT")?;
        let key = ProbeAt {
            library,
            _pad: 0,
            file_offset,
        };
        map.insert(key, cookie, 0)
            .context("adding a probe to PROBES_AT")
    }

    /// Process `pid`'s fd `fd` is library `library`'s file: its mmaps are recorded.
    pub fn add_library_fd(bpf: &mut Ebpf, pid: u32, fd: i32, library: u32) -> Result<()> {
        let mut map: BpfHashMap<_, u64, u32> = borrow(bpf, "LIBRARY_FDS")?;
        let key = (u64::from(pid) << 32) | u64::from(fd as u32);
        map.insert(key, library, 0)
            .context("adding a library fd to LIBRARY_FDS")
    }

    /// Records mappings that process `pid` made before tracing saw them (`-p`, `--all`).
    pub fn add_mappings(bpf: &mut Ebpf, pid: u32, mappings: &[LibraryMapping]) -> Result<()> {
        if mappings.is_empty() {
            return Ok(());
        }
        let mut map: BpfHashMap<_, u32, ProcessMappings> = borrow(bpf, "MAPPINGS")?;
        let mut process = map.get(&pid, 0).unwrap_or(ProcessMappings {
            next: 0,
            _pad: 0,
            mappings: [LibraryMapping::default(); MAX_MAPPINGS],
        });
        for mapping in mappings {
            // Recorded already (before attaching, and again as the process's maps are
            // read): the ring's places are for other mappings.
            let kept = (process.next as usize).min(MAX_MAPPINGS);
            let same = |m: &LibraryMapping| {
                (m.start, m.end, m.file_offset, m.library)
                    == (
                        mapping.start,
                        mapping.end,
                        mapping.file_offset,
                        mapping.library,
                    )
            };
            if process.mappings[..kept].iter().any(same) {
                continue;
            }
            process.mappings[process.next as usize % MAX_MAPPINGS] = *mapping;
            process.next = process.next.wrapping_add(1);
        }
        map.insert(pid, process, 0)
            .context("adding a process's mappings to MAPPINGS")
    }

    fn borrow<'a, V: aya::Pod, K: aya::Pod>(
        bpf: &'a mut Ebpf,
        name: &str,
    ) -> Result<BpfHashMap<&'a mut MapData, K, V>> {
        let map = bpf
            .map_mut(name)
            .with_context(|| format!("map {name} missing"))?;
        Ok(BpfHashMap::try_from(map)?)
    }
}
