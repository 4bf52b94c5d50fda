//! Which device each launch, copy, memset and allocation went to, and the figures per
//! device.
//!
//! **Contexts** ([`ContextState`], per process: a `CUcontext` is a pointer of its process).
//! A context's device is learnt where it is made: `cuDevicePrimaryCtxRetain(&ctx, dev)` and
//! `cuCtxCreate*(&ctx, ..., dev)`. Each thread has the driver's context stack:
//! `cuCtxCreate*` and `cuCtxPushCurrent` push, `cuCtxPopCurrent` pops, `cuCtxSetCurrent`
//! replaces the top (pops with NULL), `cuCtxDestroy` pops the context if it is on top. A
//! launch, copy, memset, device allocation or free gets `device`: the device of its
//! thread's current context; absent when the context or its device is not known (a
//! thread whose context was made current before tracing started).
//!
//! **The devices section** ([`DeviceAccumulator`]): per device, launches, copies and their
//! bytes, memsets and their bytes, allocations, allocated bytes and the peak of live bytes.

use std::collections::HashMap;

use serde::Serialize;

use crate::schema::CallLine;

use super::Role;

/// Contexts and each thread's context stack in one process.
#[derive(Default)]
pub struct ContextState {
    devices: HashMap<u64, i32>,
    stacks: HashMap<u32, Vec<u64>>,
}

/// Deeper stacks are not followed (the driver's own limit is far above what programs use).
const MAX_STACK: usize = 64;

/// The base name: `cuCtxPushCurrent_v2` → `cuCtxPushCurrent`.
fn base(name: &str) -> &str {
    let name = name
        .strip_suffix("_ptsz")
        .or_else(|| name.strip_suffix("_ptds"))
        .unwrap_or(name);
    match name.rsplit_once("_v") {
        Some((stem, version)) if version.chars().all(|c| c.is_ascii_digit()) => stem,
        _ => name,
    }
}

impl ContextState {
    /// Learns from a context call; adds `device` to launches, copies, memsets and device
    /// allocations and frees (where the line has none of its own).
    pub fn observe(&mut self, role: Role, record: &mut CallLine) {
        if matches!(
            role,
            Role::Launch
                | Role::GraphLaunch
                | Role::Copy
                | Role::Memset
                | Role::DeviceAlloc
                | Role::DeviceFree
        ) {
            if record.device.is_none() {
                record.device = self.current(record.tid);
            }
            return;
        }
        // Every call matched below is one of these (read for every call of a trace).
        let context_call =
            record.name.starts_with("cuCtx") || record.name.starts_with("cuDevicePrimaryCtx");
        if !record.ok() || !context_call {
            return;
        }
        let context = record.context.map(|c| c.0);
        match base(&record.name) {
            "cuDevicePrimaryCtxRetain" => {
                if let (Some(context), Some(device)) = (context, record.device) {
                    self.devices.insert(context, device);
                }
            }
            "cuCtxCreate" => {
                if let (Some(context), Some(device)) = (context, record.device) {
                    self.devices.insert(context, device);
                    self.push(record.tid, context);
                }
            }
            "cuCtxPushCurrent" => {
                if let Some(context) = context {
                    self.push(record.tid, context);
                }
            }
            "cuCtxPopCurrent" => {
                if let Some(stack) = self.stacks.get_mut(&record.tid) {
                    stack.pop();
                }
            }
            "cuCtxSetCurrent" => {
                let stack = self.stacks.entry(record.tid).or_default();
                stack.pop();
                if let Some(context) = context.filter(|c| *c != 0) {
                    stack.push(context);
                }
            }
            "cuCtxDestroy" => {
                if let Some(context) = context {
                    if let Some(stack) = self.stacks.get_mut(&record.tid)
                        && stack.last() == Some(&context)
                    {
                        stack.pop();
                    }
                    self.devices.remove(&context);
                }
            }
            _ => {}
        }
    }

    fn push(&mut self, tid: u32, context: u64) {
        let stack = self.stacks.entry(tid).or_default();
        if stack.len() < MAX_STACK {
            stack.push(context);
        }
    }

    /// The device of `tid`'s current context, where known.
    pub fn current(&self, tid: u32) -> Option<i32> {
        let context = self.stacks.get(&tid)?.last()?;
        self.devices.get(context).copied()
    }
}

/// One device's figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceRow {
    pub device: i32,
    /// Successful launches (graph launches included).
    pub launches: u64,
    pub copies: u64,
    pub copy_bytes: u64,
    pub memsets: u64,
    pub memset_bytes: u64,
    /// Successful device allocations and their bytes.
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub frees: u64,
    /// The most device bytes live at once on the device (allocations made while its
    /// context was current, less those freed).
    pub peak_live_bytes: u64,
    /// Bytes still allocated at the end of the trace.
    pub live_bytes: u64,
}

/// The devices section: present when calls went to more than one device.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DevicesSummary {
    /// By device number.
    pub rows: Vec<DeviceRow>,
    /// Launches, copies, memsets and allocations whose device is not known.
    pub unattributed: u64,
}

/// The devices section, built call by call.
#[derive(Default)]
pub struct DeviceAccumulator {
    rows: HashMap<i32, DeviceRow>,
    /// Live allocations: (pid, address) → (device, bytes).
    live: HashMap<(u32, u64), (i32, u64)>,
    unattributed: u64,
}

impl DeviceAccumulator {
    pub fn observe(&mut self, role: Role, record: &CallLine) {
        if !record.ok()
            || !matches!(
                role,
                Role::Launch
                    | Role::GraphLaunch
                    | Role::Copy
                    | Role::Memset
                    | Role::DeviceAlloc
                    | Role::DeviceFree
            )
        {
            return;
        }
        let Some(device) = record.device else {
            self.unattributed += 1;
            return;
        };
        let row = self.rows.entry(device).or_insert_with(|| DeviceRow {
            device,
            ..DeviceRow::default()
        });
        let bytes = record.bytes.unwrap_or(0);
        match role {
            Role::Launch | Role::GraphLaunch => row.launches += 1,
            Role::Copy => {
                row.copies += 1;
                row.copy_bytes += bytes;
            }
            Role::Memset => {
                row.memsets += 1;
                row.memset_bytes += bytes;
            }
            Role::DeviceAlloc => {
                row.allocations += 1;
                row.allocated_bytes += bytes;
                if let Some(dptr) = record.dptr {
                    self.live.insert((record.pid, dptr.0), (device, bytes));
                }
                row.live_bytes += bytes;
                row.peak_live_bytes = row.peak_live_bytes.max(row.live_bytes);
            }
            _ => {
                row.frees += 1;
                // The bytes come off the device they were allocated on.
                if let Some((owner, bytes)) = record
                    .dptr
                    .and_then(|dptr| self.live.remove(&(record.pid, dptr.0)))
                    && let Some(owner) = self.rows.get_mut(&owner)
                {
                    owner.live_bytes = owner.live_bytes.saturating_sub(bytes);
                }
            }
        }
    }

    /// A process's address space is gone (exec, exit): its allocations are not freed by
    /// calls any more, but stay counted as live (leaked) on their devices.
    pub fn forget_process(&mut self, pid: u32) {
        self.live.retain(|(owner, _), _| *owner != pid);
    }

    pub fn finish(self) -> DevicesSummary {
        let mut rows: Vec<DeviceRow> = self.rows.into_values().collect();
        rows.sort_by_key(|row| row.device);
        DevicesSummary {
            rows,
            unattributed: self.unattributed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{analysis::classify, schema::Hex};

    fn call(name: &str, tid: u32, fields: impl FnOnce(&mut CallLine)) -> CallLine {
        let mut record = CallLine {
            name: name.into(),
            pid: 1,
            tid,
            ..CallLine::default()
        };
        fields(&mut record);
        record
    }

    #[test]
    fn the_current_context_follows_set_push_pop_create_and_destroy() {
        let mut state = ContextState::default();
        let mut run = |mut record: CallLine| {
            state.observe(classify(&record.name).0, &mut record);
            record.device
        };
        let retain = |ctx: u64, dev: i32| {
            call("cuDevicePrimaryCtxRetain", 10, |r| {
                r.context = Some(Hex(ctx));
                r.device = Some(dev);
            })
        };
        let launch = |tid| call("cuLaunchKernel", tid, |_| {});
        let with_ctx = |name: &str, tid, ctx: u64| call(name, tid, |r| r.context = Some(Hex(ctx)));
        assert_eq!(run(launch(10)), None, "no current context");
        run(retain(0xa0, 0));
        run(retain(0xb0, 1));
        assert_eq!(run(launch(10)), None, "retaining makes nothing current");
        run(with_ctx("cuCtxSetCurrent", 10, 0xa0));
        assert_eq!(run(launch(10)), Some(0));
        assert_eq!(run(launch(11)), None, "another thread");
        run(with_ctx("cuCtxPushCurrent_v2", 10, 0xb0));
        assert_eq!(run(launch(10)), Some(1));
        run(with_ctx("cuCtxPopCurrent_v2", 10, 0xb0));
        assert_eq!(run(launch(10)), Some(0));
        run(with_ctx("cuCtxSetCurrent", 10, 0xb0));
        assert_eq!(run(launch(10)), Some(1), "set replaces the top");
        run(with_ctx("cuCtxSetCurrent", 10, 0));
        assert_eq!(run(launch(10)), None, "set NULL pops");
        let create = call("cuCtxCreate_v4", 11, |r| {
            r.context = Some(Hex(0xc0));
            r.device = Some(1);
        });
        run(create);
        assert_eq!(run(launch(11)), Some(1), "a created context is current");
        let failed = call("cuCtxPushCurrent_v2", 11, |r| {
            r.context = Some(Hex(0xa0));
            r.ret = Some(1);
        });
        run(failed);
        assert_eq!(run(launch(11)), Some(1), "a failed push changes nothing");
        run(with_ctx("cuCtxDestroy_v2", 11, 0xc0));
        assert_eq!(
            run(launch(11)),
            None,
            "destroying the current context pops it"
        );
        // A line with its own device keeps it.
        run(with_ctx("cuCtxSetCurrent", 10, 0xa0));
        let peer = call("cuMemcpyHtoD_v2", 10, |r| r.device = Some(7));
        assert_eq!(run(peer), Some(7));
    }

    #[test]
    fn each_device_gets_its_launches_bytes_and_memory() {
        let mut devices = DeviceAccumulator::default();
        let mut add = |name: &str, device: Option<i32>, bytes: u64, dptr: u64| {
            let record = call(name, 10, |r| {
                r.device = device;
                r.bytes = Some(bytes).filter(|b| *b > 0);
                r.dptr = Some(Hex(dptr)).filter(|d| d.0 > 0);
            });
            devices.observe(classify(name).0, &record);
        };
        add("cuMemAlloc_v2", Some(0), 1000, 0x100);
        add("cuMemAlloc_v2", Some(1), 500, 0x200);
        add("cuMemAlloc_v2", Some(0), 24, 0x300);
        add("cuLaunchKernel", Some(0), 0, 0);
        add("cuLaunchKernel", Some(1), 0, 0);
        add("cuLaunchKernel", Some(1), 0, 0);
        add("cuLaunchKernel", None, 0, 0);
        add("cuMemcpyHtoD_v2", Some(1), 64, 0);
        add("cuMemsetD8_v2", Some(0), 16, 0);
        // Freed while device 1 is current: the bytes still come off device 0.
        add("cuMemFree_v2", Some(1), 0, 0x100);
        let summary = devices.finish();
        assert_eq!(summary.unattributed, 1);
        assert_eq!(
            summary.rows,
            [
                DeviceRow {
                    device: 0,
                    launches: 1,
                    memsets: 1,
                    memset_bytes: 16,
                    allocations: 2,
                    allocated_bytes: 1024,
                    peak_live_bytes: 1024,
                    live_bytes: 24,
                    ..DeviceRow::default()
                },
                DeviceRow {
                    device: 1,
                    launches: 2,
                    copies: 1,
                    copy_bytes: 64,
                    allocations: 1,
                    allocated_bytes: 500,
                    frees: 1,
                    peak_live_bytes: 500,
                    live_bytes: 500,
                    ..DeviceRow::default()
                },
            ]
        );
    }
}
