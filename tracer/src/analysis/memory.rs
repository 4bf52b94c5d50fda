//! Live device memory of one process, from matching allocations to frees.
//!
//! **Device bytes** are the bytes of device memory the process holds through the driver:
//! - classic allocations from a successful `cuMemAlloc*` (`bytes`), `cuMemAllocPitch`
//!   (`pitch * height`), `cuMemAllocManaged`, `cuMemAllocAsync` or
//!   `cuMemAllocFromPoolAsync`, until the `cuMemFree*`/`cuMemFreeAsync` of the same `dptr`
//!   (stream-ordered calls count when they are made, not when the stream reaches them);
//! - physical memory from a successful `cuMemCreate` (`bytes`, by `handle`), until it is
//!   both released (`cuMemRelease`) and unmapped everywhere (`cuMemUnmap`): the driver
//!   keeps a released handle's memory while a mapping uses it.
//!
//! Not device bytes, tracked beside them: page-locked host memory (`cuMemAllocHost`,
//! `cuMemHostAlloc` until `cuMemFreeHost`), mapped bytes (`cuMemMap` until `cuMemUnmap`:
//! views of physical memory already counted) and reserved address space
//! (`cuMemAddressReserve` until `cuMemAddressFree`). Failed calls change nothing. Frees of
//! addresses never seen allocated (made before attaching) are counted as unmatched.

use std::{collections::BTreeMap, ops::Bound};

use foldhash::HashMap;

use super::role::Role;
use crate::schema::{CallLine, Hex, Leak, ProcessMemory};

/// At most this many leaks are listed per process (in the footer and `summary --json`);
/// the counts and byte totals cover all of them.
pub const MAX_LISTED_LEAKS: usize = 1000;

#[derive(Clone, Copy, Debug)]
struct Allocation {
    bytes: u64,
    call: &'static str,
    ts_ns: u64,
    /// The allocating call's Python stack (`--stacks`).
    stack: Option<u64>,
}

/// A device allocation's bytes: `pitch * height` for a pitched one.
fn device_allocation_bytes(record: &CallLine) -> u64 {
    match (record.pitch, record.height) {
        (Some(pitch), Some(height)) => pitch.saturating_mul(height),
        _ => record.bytes.unwrap_or(0),
    }
}

/// The device bytes a successful call allocates, as [`MemoryState`] counts them
/// (`cuMemAlloc*` with its `dptr`, `cuMemCreate` with its `handle`).
pub fn allocated_device_bytes(role: Role, record: &CallLine) -> Option<u64> {
    if !record.ok() {
        return None;
    }
    match role {
        Role::DeviceAlloc => record.dptr.map(|_| device_allocation_bytes(record)),
        Role::PhysicalCreate => record.handle.and(record.bytes),
        _ => None,
    }
}

#[derive(Clone, Copy, Debug)]
struct Physical {
    allocation: Allocation,
    released: bool,
    mappings: u64,
}

#[derive(Clone, Copy, Debug)]
struct Mapping {
    bytes: u64,
    handle: u64,
}

/// A figure and its high-water mark.
#[derive(Clone, Copy, Debug, Default)]
struct Level {
    now: u64,
    peak: u64,
    peak_ts_ns: u64,
}

impl Level {
    fn add(&mut self, bytes: u64, ts_ns: u64) {
        self.now = self.now.saturating_add(bytes);
        if self.now > self.peak {
            self.peak = self.now;
            self.peak_ts_ns = ts_ns;
        }
    }

    fn sub(&mut self, bytes: u64) {
        self.now = self.now.saturating_sub(bytes);
    }
}

/// One process's allocations.
#[derive(Debug, Default)]
pub struct MemoryState {
    device: HashMap<u64, Allocation>,
    host: HashMap<u64, Allocation>,
    physical: HashMap<u64, Physical>,
    mappings: BTreeMap<u64, Mapping>,
    reservations: HashMap<u64, u64>,
    device_bytes: Level,
    host_bytes: Level,
    mapped_bytes: Level,
    reserved_bytes: Level,
    allocations: u64,
    frees: u64,
    unmatched_frees: u64,
    /// Device pointers of other processes' memory opened here (CUDA IPC), still open.
    ipc_open: HashMap<u64, u64>,
    ipc_opens: u64,
}

impl MemoryState {
    /// Accounts a call and sets `live_bytes` on the calls that can change device memory.
    pub fn observe(&mut self, role: Role, symbol: Option<&'static str>, record: &mut CallLine) {
        if !record.ok() {
            return;
        }
        let call = symbol.unwrap_or("unknown");
        let ts_ns = record.ts_ns;
        let stack = record.stack;
        let dptr = record.dptr.map(|h| h.0);
        match role {
            Role::DeviceAlloc => {
                let bytes = device_allocation_bytes(record);
                if let Some(dptr) = dptr {
                    let allocation = Allocation {
                        bytes,
                        call,
                        ts_ns,
                        stack,
                    };
                    // The same address twice means its free was lost: replace it.
                    if let Some(old) = self.device.insert(dptr, allocation) {
                        self.device_bytes.sub(old.bytes);
                    }
                    self.device_bytes.add(bytes, ts_ns);
                    self.allocations += 1;
                }
            }
            Role::DeviceFree => match dptr {
                Some(0) | None => {}
                Some(dptr) => match self.device.remove(&dptr) {
                    Some(old) => {
                        self.device_bytes.sub(old.bytes);
                        self.frees += 1;
                    }
                    None => self.unmatched_frees += 1,
                },
            },
            Role::HostAlloc => {
                if let (Some(Hex(host)), Some(bytes)) = (record.host, record.bytes) {
                    let allocation = Allocation {
                        bytes,
                        call,
                        ts_ns,
                        stack,
                    };
                    if let Some(old) = self.host.insert(host, allocation) {
                        self.host_bytes.sub(old.bytes);
                    }
                    self.host_bytes.add(bytes, ts_ns);
                    self.allocations += 1;
                }
                return;
            }
            Role::HostFree => {
                match record.host.map(|h| h.0) {
                    Some(0) | None => {}
                    Some(host) => match self.host.remove(&host) {
                        Some(old) => {
                            self.host_bytes.sub(old.bytes);
                            self.frees += 1;
                        }
                        None => self.unmatched_frees += 1,
                    },
                }
                return;
            }
            Role::PhysicalCreate => {
                if let (Some(Hex(handle)), Some(bytes)) = (record.handle, record.bytes) {
                    let physical = Physical {
                        allocation: Allocation {
                            bytes,
                            call,
                            ts_ns,
                            stack,
                        },
                        released: false,
                        mappings: 0,
                    };
                    if let Some(old) = self.physical.insert(handle, physical) {
                        self.device_bytes.sub(old.allocation.bytes);
                    }
                    self.device_bytes.add(bytes, ts_ns);
                    self.allocations += 1;
                }
            }
            Role::PhysicalRelease => {
                if let Some(Hex(handle)) = record.handle {
                    match self.physical.get_mut(&handle) {
                        Some(physical) => {
                            physical.released = true;
                            self.frees += 1;
                            self.drop_if_unused(handle);
                        }
                        None => self.unmatched_frees += 1,
                    }
                }
            }
            Role::Map => {
                if let (Some(dptr), Some(bytes), Some(Hex(handle))) =
                    (dptr, record.bytes, record.handle)
                {
                    if let Some(old) = self.mappings.insert(dptr, Mapping { bytes, handle }) {
                        self.unmap_one(old);
                    }
                    self.mapped_bytes.add(bytes, ts_ns);
                    if let Some(physical) = self.physical.get_mut(&handle) {
                        physical.mappings += 1;
                    }
                }
            }
            Role::Unmap => {
                if let (Some(dptr), Some(bytes)) = (dptr, record.bytes) {
                    // One unmap may cover several adjacent mappings.
                    let end = dptr.saturating_add(bytes);
                    let starts: Vec<u64> = self
                        .mappings
                        .range((Bound::Included(dptr), Bound::Excluded(end)))
                        .map(|(start, _)| *start)
                        .collect();
                    for start in starts {
                        if let Some(mapping) = self.mappings.remove(&start) {
                            self.unmap_one(mapping);
                        }
                    }
                }
            }
            Role::AddressReserve => {
                if let (Some(dptr), Some(bytes)) = (dptr, record.bytes) {
                    if let Some(old) = self.reservations.insert(dptr, bytes) {
                        self.reserved_bytes.sub(old);
                    }
                    self.reserved_bytes.add(bytes, ts_ns);
                }
                return;
            }
            Role::AddressFree => {
                if let Some(old) = dptr.and_then(|dptr| self.reservations.remove(&dptr)) {
                    self.reserved_bytes.sub(old);
                }
                return;
            }
            // Another process's allocation, already counted there: mappings, not bytes.
            Role::IpcOpen => {
                if let Some(dptr) = dptr {
                    self.ipc_open.insert(dptr, ts_ns);
                    self.ipc_opens += 1;
                }
                return;
            }
            Role::IpcClose => {
                if let Some(dptr) = dptr {
                    self.ipc_open.remove(&dptr);
                }
                return;
            }
            _ => return,
        }
        record.live_bytes = Some(self.device_bytes.now);
    }

    fn unmap_one(&mut self, mapping: Mapping) {
        self.mapped_bytes.sub(mapping.bytes);
        if let Some(physical) = self.physical.get_mut(&mapping.handle) {
            physical.mappings = physical.mappings.saturating_sub(1);
            self.drop_if_unused(mapping.handle);
        }
    }

    /// Physical memory goes once released and no longer mapped.
    fn drop_if_unused(&mut self, handle: u64) {
        if let Some(physical) = self.physical.get(&handle)
            && physical.released
            && physical.mappings == 0
        {
            self.device_bytes.sub(physical.allocation.bytes);
            self.physical.remove(&handle);
        }
    }

    /// Device memory still allocated (`final_device_bytes`' allocations), by the stack of
    /// the allocating call: `(allocations, bytes)` each. Empty where no allocation has a
    /// stack (a trace without `--stacks`): nothing to split.
    pub fn live_by_stack(&self) -> HashMap<Option<u64>, (u64, u64)> {
        let device = self.device.values();
        let physical = self.physical.values().map(|p| &p.allocation);
        let mut live: HashMap<Option<u64>, (u64, u64)> = HashMap::default();
        for allocation in device.chain(physical) {
            let entry = live.entry(allocation.stack).or_default();
            entry.0 += 1;
            entry.1 += allocation.bytes;
        }
        if live.keys().all(Option::is_none) {
            live.clear();
        }
        live
    }

    /// The figures now, with what is still allocated listed as leaks (oldest first).
    pub fn report(&self, pid: u32) -> ProcessMemory {
        let leak = |kind, address: u64, allocation: &Allocation| {
            let mut leak = Leak {
                kind,
                dptr: None,
                handle: None,
                host: None,
                bytes: allocation.bytes,
                call: allocation.call,
                ts_ns: allocation.ts_ns,
                stack: allocation.stack,
            };
            match kind {
                "device" => leak.dptr = Some(Hex(address)),
                "physical" => leak.handle = Some(Hex(address)),
                _ => leak.host = Some(Hex(address)),
            }
            leak
        };
        let mut leaks: Vec<Leak> = self
            .device
            .iter()
            .map(|(dptr, a)| leak("device", *dptr, a))
            .chain(
                self.physical
                    .iter()
                    .map(|(handle, p)| leak("physical", *handle, &p.allocation)),
            )
            .chain(
                self.host
                    .iter()
                    .map(|(host, a)| leak("host_pinned", *host, a)),
            )
            .collect();
        leaks.sort_by_key(|l| (l.ts_ns, l.kind, l.dptr, l.handle, l.host));
        let leak_count = leaks.len() as u64;
        leaks.truncate(MAX_LISTED_LEAKS);
        ProcessMemory {
            pid,
            peak_device_bytes: self.device_bytes.peak,
            peak_ts_ns: self.device_bytes.peak_ts_ns,
            final_device_bytes: self.device_bytes.now,
            peak_host_pinned_bytes: self.host_bytes.peak,
            final_host_pinned_bytes: self.host_bytes.now,
            peak_mapped_bytes: self.mapped_bytes.peak,
            final_mapped_bytes: self.mapped_bytes.now,
            final_reserved_bytes: self.reserved_bytes.now,
            allocations: self.allocations,
            frees: self.frees,
            unmatched_frees: self.unmatched_frees,
            ipc_opens: self.ipc_opens,
            final_ipc_open: self.ipc_open.len() as u64,
            leak_count,
            leaks_not_listed: leak_count - leaks.len() as u64,
            leaks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{Analysis, testing::Script};

    const MIB: u64 = 1 << 20;

    fn run(script: &Script) -> (Vec<Option<u64>>, ProcessMemory) {
        let mut analysis = Analysis::default();
        let mut live = Vec::new();
        for record in &script.records {
            let mut record = record.clone();
            analysis.observe(&mut record);
            live.push(record.live_bytes);
        }
        let mut report = analysis.finish();
        (live, report.memory.remove(0))
    }

    #[test]
    fn classic_allocations_match_their_frees() {
        let mut script = Script::new(7);
        script
            .alloc(0x1000, MIB) // 1000
            .alloc(0x2000, 4096) // 2000
            .call("cuMemAlloc_v2", |r| {
                r.ret = Some(1);
                r.bytes = Some(0);
                r.dptr = Some(Hex(0));
            })
            .call("cuMemAllocPitch_v2", |r| {
                r.dptr = Some(Hex(0x3000));
                r.pitch = Some(512);
                r.width = Some(500);
                r.height = Some(16);
            })
            .call("cuMemAllocAsync_ptsz", |r| {
                r.dptr = Some(Hex(0x4000));
                r.bytes = Some(100);
            })
            .free(0x2000)
            .call("cuMemFreeAsync", |r| r.dptr = Some(Hex(0x4000)))
            .free(0x9999) // never allocated here
            .free(0) // cuMemFree(NULL) is a no-op
            .plain("cuCtxSynchronize");
        let (live, report) = run(&script);
        assert_eq!(
            live,
            [
                Some(MIB),
                Some(MIB + 4096),
                None,
                Some(MIB + 4096 + 8192),
                Some(MIB + 4096 + 8192 + 100),
                Some(MIB + 8192 + 100),
                Some(MIB + 8192),
                Some(MIB + 8192),
                Some(MIB + 8192),
                None
            ]
        );
        assert_eq!(report.peak_device_bytes, MIB + 4096 + 8192 + 100);
        assert_eq!(report.peak_ts_ns, 5000);
        assert_eq!(report.final_device_bytes, MIB + 8192);
        assert_eq!((report.allocations, report.frees), (4, 2));
        assert_eq!(report.unmatched_frees, 1);
        assert_eq!(report.leak_count, 2);
        assert_eq!(
            report.leaks,
            [
                Leak {
                    kind: "device",
                    dptr: Some(Hex(0x1000)),
                    handle: None,
                    host: None,
                    bytes: MIB,
                    call: "cuMemAlloc_v2",
                    ts_ns: 1000,
                    stack: None,
                },
                Leak {
                    kind: "device",
                    dptr: Some(Hex(0x3000)),
                    handle: None,
                    host: None,
                    bytes: 8192,
                    call: "cuMemAllocPitch_v2",
                    ts_ns: 4000,
                    stack: None,
                },
            ]
        );
    }

    #[test]
    fn host_pinned_memory_is_not_device_memory() {
        let mut script = Script::new(7);
        script
            .call("cuMemAllocHost_v2", |r| {
                r.host = Some(Hex(0x50));
                r.bytes = Some(300);
            })
            .call("cuMemHostAlloc", |r| {
                r.host = Some(Hex(0x60));
                r.bytes = Some(200);
            })
            .call("cuMemFreeHost", |r| r.host = Some(Hex(0x50)));
        let (live, report) = run(&script);
        assert_eq!(live, [None, None, None]);
        assert_eq!(report.peak_device_bytes, 0);
        assert_eq!(report.peak_host_pinned_bytes, 500);
        assert_eq!(report.final_host_pinned_bytes, 200);
        assert_eq!(report.leak_count, 1);
        assert_eq!(report.leaks[0].kind, "host_pinned");
        assert_eq!(report.leaks[0].host, Some(Hex(0x60)));
        assert_eq!(report.leaks[0].call, "cuMemHostAlloc");
    }

    #[test]
    fn virtual_memory_counts_physical_backing_until_released_and_unmapped() {
        let va = 0x7f80_0000_0000u64;
        let mut script = Script::new(7);
        script
            .call("cuMemAddressReserve", |r| {
                r.dptr = Some(Hex(va));
                r.bytes = Some(8 * MIB);
            })
            // PyTorch's expandable segments: create, map, ... unmap, release.
            .call("cuMemCreate", |r| {
                r.handle = Some(Hex(0xa0));
                r.bytes = Some(2 * MIB);
            })
            .call("cuMemMap", |r| {
                r.dptr = Some(Hex(va));
                r.bytes = Some(2 * MIB);
                r.handle = Some(Hex(0xa0));
            })
            .call("cuMemCreate", |r| {
                r.handle = Some(Hex(0xb0));
                r.bytes = Some(2 * MIB);
            })
            .call("cuMemMap", |r| {
                r.dptr = Some(Hex(va + 2 * MIB));
                r.bytes = Some(2 * MIB);
                r.handle = Some(Hex(0xb0));
            })
            // Release right after mapping (another common idiom): still held.
            .call("cuMemRelease", |r| r.handle = Some(Hex(0xb0)))
            .call("cuMemSetAccess", |r| {
                r.dptr = Some(Hex(va));
                r.bytes = Some(4 * MIB);
            })
            // One unmap covering both mappings frees 0xb0's memory.
            .call("cuMemUnmap", |r| {
                r.dptr = Some(Hex(va));
                r.bytes = Some(4 * MIB);
            })
            .call("cuMemRelease", |r| r.handle = Some(Hex(0xa0)))
            .call("cuMemCreate", |r| {
                r.handle = Some(Hex(0xc0));
                r.bytes = Some(6 * MIB);
            })
            .call("cuMemMap", |r| {
                r.dptr = Some(Hex(va));
                r.bytes = Some(6 * MIB);
                r.handle = Some(Hex(0xc0));
            })
            .call("cuMemCreate", |r| {
                r.ret = Some(2);
                r.bytes = Some(MIB);
            })
            .call("cuMemRelease", |r| r.handle = Some(Hex(0xdead)))
            .call("cuMemAddressFree", |r| {
                r.dptr = Some(Hex(va));
                r.bytes = Some(8 * MIB);
            });
        let (live, report) = run(&script);
        assert_eq!(
            live,
            [
                None,
                Some(2 * MIB),
                Some(2 * MIB),
                Some(4 * MIB),
                Some(4 * MIB),
                Some(4 * MIB),
                None,
                Some(2 * MIB),
                Some(0),
                Some(6 * MIB),
                Some(6 * MIB),
                None,
                Some(6 * MIB),
                None
            ]
        );
        assert_eq!(report.peak_device_bytes, 6 * MIB);
        assert_eq!(report.peak_ts_ns, 10_000);
        assert_eq!(report.final_device_bytes, 6 * MIB);
        assert_eq!(report.peak_mapped_bytes, 6 * MIB);
        assert_eq!(report.final_mapped_bytes, 6 * MIB);
        assert_eq!(report.final_reserved_bytes, 0);
        assert_eq!((report.allocations, report.frees), (3, 2));
        assert_eq!(report.unmatched_frees, 1);
        assert_eq!(report.leak_count, 1);
        assert_eq!(
            report.leaks[0],
            Leak {
                kind: "physical",
                dptr: None,
                handle: Some(Hex(0xc0)),
                host: None,
                bytes: 6 * MIB,
                call: "cuMemCreate",
                ts_ns: 10_000,
                stack: None,
            }
        );
    }

    #[test]
    fn processes_are_separate_and_leaks_are_capped() {
        let mut analysis = Analysis::default();
        let mut script = Script::new(1);
        for i in 0..(MAX_LISTED_LEAKS as u64 + 5) {
            script.alloc(0x1000 + i * 0x100, 1);
        }
        let mut other = Script::new(2);
        other.alloc(0x1000, 64).free(0x1000);
        for record in script.records.iter().chain(&other.records) {
            analysis.observe(&mut record.clone());
        }
        let report = analysis.finish();
        let first = &report.memory[0];
        assert_eq!(first.pid, 1);
        assert_eq!(first.leak_count, MAX_LISTED_LEAKS as u64 + 5);
        assert_eq!(first.leaks.len(), MAX_LISTED_LEAKS);
        assert_eq!(first.leaks_not_listed, 5);
        assert_eq!(first.final_device_bytes, MAX_LISTED_LEAKS as u64 + 5);
        let second = &report.memory[1];
        assert_eq!((second.pid, second.peak_device_bytes), (2, 64));
        assert_eq!((second.final_device_bytes, second.leak_count), (0, 0));
    }
}
