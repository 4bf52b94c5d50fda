//! The object's maps as the loader uses them: the traced-process set, the events ring
//! buffer, the per-CPU loss and entry counters, and discovery's: the library name
//! patterns, the processes with per-process probes, the processes stopped for attaching.
//! [`SIZED_MAPS`] are the hash maps whose size the hidden `--map-entries` flag can change
//! (tests shrink them to prove that a full map is counted, never silent).

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
};
use tracer_common::{MAX_PATTERNS, NamePattern, PATTERN_LEN, counter};

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
];

/// Marks a process as traced (the command, or a `-p` target).
pub fn trace_pid(bpf: &mut Ebpf, pid: u32) -> Result<()> {
    let mut traced: BpfHashMap<_, u32, u32> =
        BpfHashMap::try_from(bpf.map_mut("TRACED").context("map TRACED missing")?)?;
    traced
        .insert(pid, 1, 0)
        .context("adding the pid to the traced set")?;
    Ok(())
}

/// Stops recording: no process is traced from now on, and the `TRACING_STOPPED` flag says so (for
/// `--all` and per-process links, which skip the traced-process lookup), so probes that
/// still fire return at once. Calls already in flight still complete
/// their events. Detaching, which waits for the kernel, can follow at leisure.
pub fn stop_tracing(bpf: &mut Ebpf) -> Result<()> {
    let mut traced: BpfHashMap<_, u32, u32> =
        BpfHashMap::try_from(bpf.map_mut("TRACED").context("map TRACED missing")?)?;
    // A few passes: a child forked by a process removed in this pass is inserted by the
    // kernel before its parent leaves the map.
    for _ in 0..8 {
        let pids: Vec<u32> = traced.keys().filter_map(Result::ok).collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = traced.remove(&pid);
        }
    }
    let mut stopped: Array<_, u32> = Array::try_from(
        bpf.map_mut("TRACING_STOPPED")
            .context("map TRACING_STOPPED missing")?,
    )?;
    stopped.set(0, 1, 0).context("marking tracing stopped")?;
    Ok(())
}

/// A file name the eBPF side recognises as probe set `set`'s library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryName {
    pub set: u32,
    pub name: String,
    /// Exactly this name, not also with a version after it.
    pub exact: bool,
}

/// Sets the names that make an opened file a library to attach.
pub fn set_library_names(bpf: &mut Ebpf, names: &[LibraryName]) -> Result<()> {
    if names.len() > MAX_PATTERNS as usize {
        bail!(
            "{} library names, more than the {MAX_PATTERNS} the probes hold",
            names.len()
        );
    }
    let mut patterns: Array<_, NamePattern> = Array::try_from(
        bpf.map_mut("NAME_PATTERNS")
            .context("map NAME_PATTERNS missing")?,
    )?;
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
        patterns.set(index as u32, pattern, 0)?;
    }
    Ok(())
}

/// Marks `pid` as having per-process probes: its fork children stop for their own.
pub fn mark_linked(bpf: &mut Ebpf, pid: u32) -> Result<()> {
    let mut linked: BpfHashMap<_, u32, u32> =
        BpfHashMap::try_from(bpf.map_mut("LINKED").context("map LINKED missing")?)?;
    linked
        .insert(pid, 1, 0)
        .context("adding the pid to the linked set")?;
    Ok(())
}

/// Allows or forbids the eBPF side to stop processes.
pub fn allow_stops(bpf: &mut Ebpf, allowed: bool) -> Result<()> {
    let mut control: Array<_, u32> =
        Array::try_from(bpf.map_mut("CONTROL").context("map CONTROL missing")?)?;
    control.set(0, u32::from(allowed), 0)?;
    Ok(())
}

/// Processes the eBPF side stopped and nobody continued yet.
pub fn stopped_pids(bpf: &Ebpf) -> Result<Vec<u32>> {
    let stopped: BpfHashMap<_, u32, u64> =
        BpfHashMap::try_from(bpf.map("STOPPED").context("map STOPPED missing")?)?;
    Ok(stopped.keys().filter_map(|key| key.ok()).collect())
}

/// Counts one of `pid`'s stops as handled; true when none is left (continue it then).
/// Two threads stopping the process at once are both counted in the kernel; the process
/// goes on after the second is handled.
pub fn stop_handled(bpf: &mut Ebpf, pid: u32) -> bool {
    let Some(Ok(mut stopped)) = bpf
        .map_mut("STOPPED")
        .map(BpfHashMap::<_, u32, u64>::try_from)
    else {
        return true;
    };
    match stopped.get(&pid, 0) {
        Ok(count) if count > 1 => stopped.insert(pid, count - 1, 0).is_err(),
        _ => {
            let _ = stopped.remove(&pid);
            true
        }
    }
}

/// Forgets every stop of `pid` (continued at the end).
pub fn forget_stopped(bpf: &mut Ebpf, pid: u32) {
    if let Some(Ok(mut stopped)) = bpf
        .map_mut("STOPPED")
        .map(BpfHashMap::<_, u32, u64>::try_from)
    {
        let _ = stopped.remove(&pid);
    }
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
    /// `--gpu`: GPU records the ring refused, or that could not be read.
    pub gpu_ring_full: u64,
    pub gpu_read_failed: u64,
    /// `--gpu`: records CUPTI dropped, as its DROPPED records said (counted in userspace).
    pub cupti_dropped: u64,
    pub traced_full: u64,
    pub fds_full: u64,
    pub opens_full: u64,
    pub syscalls_full: u64,
    pub kfuncs_full: u64,
    pub abandoned_frames: u64,
    pub attach_ring_full: u64,
}

impl Counters {
    /// Call events the kernel had to drop.
    pub fn calls_lost(&self) -> u64 {
        self.ring_full + self.too_deep + self.frames_full
    }

    /// GPU records lost on their way: in the ring, reading them, or in CUPTI.
    pub fn gpu_lost(&self) -> u64 {
        self.gpu_ring_full + self.gpu_read_failed + self.cupti_dropped
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
            gpu_ring_full: sum(counter::GPU_RING_FULL)?,
            gpu_read_failed: sum(counter::GPU_READ_FAILED)?,
            cupti_dropped: 0,
            traced_full: sum(counter::TRACED_FULL)?,
            fds_full: sum(counter::FDS_FULL)?,
            opens_full: sum(counter::OPENS_FULL)?,
            syscalls_full: sum(counter::SYSCALLS_FULL)?,
            kfuncs_full: sum(counter::KFUNCS_FULL)?,
            abandoned_frames: sum(counter::ABANDONED_FRAMES)?,
            attach_ring_full: sum(counter::ATTACH_RING_FULL)?,
        })
    }
}
