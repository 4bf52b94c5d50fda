//! One trace read for the cross-rank analysis: its clocks and host (the header), every
//! collective call numbered on its communicator (`comm_id`, `comm_seq`, added by the
//! analysis where the trace lacks them) with the GPU span of its NCCL kernels, and each
//! GPU's busy time and compute kernels (for `--gpu` traces).

use std::{
    collections::{BTreeMap, HashMap},
    io::BufRead,
};

use serde_json::Value;

use super::intervals::Intervals;
use crate::{
    analysis::Analysis,
    catalog::nccl::collective_op,
    reader::{ReadError, TraceLines},
    schema::{GpuLine, Line, WindowInfo},
};

/// What the cross-rank analysis takes from a header (read leniently: a field of another
/// type reads as absent).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobHeader {
    pub version: u32,
    pub host: String,
    pub start_wall_ns: u64,
    pub start_monotonic_ns: u64,
    pub command: Vec<String>,
    /// A `--gpu` trace.
    pub gpu: bool,
    pub window: Option<WindowInfo>,
    /// The launcher's job ids (`job_ids`), by variable.
    pub job_ids: BTreeMap<String, String>,
}

impl JobHeader {
    /// From a trace's first line; an error when it is not a cudatrace header.
    pub fn parse(first_line: &[u8]) -> Result<Self, String> {
        let value: Value = serde_json::from_slice(first_line)
            .map_err(|e| format!("its first line is not JSON ({e})"))?;
        if value["type"] != "header" || value["format"] != "cudatrace" {
            return Err("its first line is not a cudatrace header".into());
        }
        let number = |key: &str| value[key].as_u64();
        Ok(JobHeader {
            version: number("version").unwrap_or(0) as u32,
            host: value["host"].as_str().unwrap_or("").to_owned(),
            start_wall_ns: number("start_wall_ns")
                .ok_or("its header has no start_wall_ns: no wall clock to align it by")?,
            start_monotonic_ns: number("start_monotonic_ns")
                .ok_or("its header has no start_monotonic_ns")?,
            command: value["command"]
                .as_array()
                .map(|args| {
                    args.iter()
                        .filter_map(|a| a.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default(),
            gpu: value.get("gpu").is_some_and(Value::is_object),
            window: serde_json::from_value(value["window"].clone()).ok(),
            job_ids: value["job_ids"]
                .as_object()
                .map(|ids| {
                    ids.iter()
                        .filter_map(|(name, id)| Some((name.clone(), id.as_str()?.to_owned())))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// `ts_ns` of this trace as wall-clock ns, by the header's own pair of clocks.
    pub fn wall_ns(&self, ts_ns: u64) -> i128 {
        i128::from(self.start_wall_ns) + i128::from(ts_ns) - i128::from(self.start_monotonic_ns)
    }
}

/// One collective call of one rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CollectiveCall {
    pub pid: u32,
    pub tid: u32,
    pub comm: u64,
    pub comm_id: String,
    pub seq: u64,
    /// `AllReduce`, `Broadcast`, ...
    pub op: &'static str,
    pub rank: Option<i32>,
    pub nranks: Option<i32>,
    pub bytes: u64,
    /// The call (the trace's clock).
    pub ts_ns: u64,
    pub end_ns: u64,
    pub group: Option<u64>,
    /// `--gpu`: the first start and last end of its NCCL kernels, their device and number.
    pub gpu_start_ns: Option<u64>,
    pub gpu_end_ns: Option<u64>,
    pub device: Option<u32>,
    pub kernels: u32,
}

/// A trace as the cross-rank analysis reads it.
#[derive(Debug, Default)]
pub struct JobTrace {
    pub label: String,
    pub header: JobHeader,
    /// It ends with its footer.
    pub complete: bool,
    /// Its last line, cut mid-line (its number), and the malformed lines passed over
    /// (`--skip-bad-lines`): how many, and the first few (number, message).
    pub cut_line: Option<u64>,
    pub skipped_lines: u64,
    pub first_skipped: Vec<(u64, String)>,
    /// The last time of an event in it (its clock), where it has one.
    pub last_ts_ns: Option<u64>,
    /// Its collective calls, numbered on their communicator; nested ones (NCCL's
    /// `ncclBcast` calling `ncclBroadcast`) left out: the outer call stands for both.
    pub collectives: Vec<CollectiveCall>,
    /// Successful collective calls without a number: their communicator's creation was
    /// not traced (`-p`, or a trace cut before it), so they cannot be matched.
    pub unnumbered: u64,
    /// `--gpu`: per (pid, device), the GPU's busy time (kernels, copies, memsets) and its
    /// compute kernels (all but NCCL's).
    pub busy: HashMap<(u32, u32), Intervals>,
    pub compute: HashMap<(u32, u32), Intervals>,
}

/// An NCCL kernel, by the launch that issued it.
struct NcclKernel {
    pid: u32,
    call_tid: u32,
    call_ts_ns: u64,
    start: u64,
    end: u64,
    device: u32,
}

/// Whether a kernel is NCCL's (`ncclDevKernel_...`, `ncclKernel_...`).
pub fn is_nccl_kernel(name: &str) -> bool {
    name.contains("nccl")
}

/// Reads `lines` (a trace whose header is `header`) for the cross-rank analysis.
pub fn collect<R: BufRead>(
    mut lines: TraceLines<R>,
    header: JobHeader,
) -> Result<JobTrace, ReadError> {
    let mut analysis = Analysis::default();
    let mut trace = JobTrace {
        label: lines.label().to_owned(),
        header,
        ..JobTrace::default()
    };
    let mut kernels: Vec<NcclKernel> = Vec::new();
    // (pid, tid, ts, end, group) of each ncclGroupEnd.
    let mut group_ends: Vec<(u32, u32, u64, u64, u64)> = Vec::new();
    while let Some(line) = lines.next_line()? {
        let end = match &*line {
            Line::Call(call) => Some(call.ts_ns.saturating_add(call.dur_or_zero())),
            Line::Gpu(gpu) => gpu
                .work()
                .map(|work| work.ts_ns.saturating_add(work.dur_ns)),
            Line::Process(process) => Some(process.ts_ns),
            _ => None,
        };
        if let Some(end) = end {
            trace.last_ts_ns = Some(trace.last_ts_ns.map_or(end, |last| last.max(end)));
        }
        match line {
            Line::Call(call) => {
                analysis.annotate(call);
                if !call.ok() || !call.name.starts_with("nccl") {
                    continue;
                }
                if call.name == "ncclGroupEnd" {
                    if let Some(group) = call.group {
                        let end = call.ts_ns + call.dur_or_zero();
                        group_ends.push((call.pid, call.tid, call.ts_ns, end, group));
                    }
                    continue;
                }
                let Some(op) = collective_op(&call.name) else {
                    continue;
                };
                let (Some(comm_id), Some(seq)) = (call.comm_id.take(), call.comm_seq) else {
                    trace.unnumbered += u64::from(!matches!(op, "Send" | "Recv"));
                    continue;
                };
                trace.collectives.push(CollectiveCall {
                    pid: call.pid,
                    tid: call.tid,
                    comm: call.comm.map_or(0, |comm| comm.0),
                    comm_id,
                    seq,
                    op,
                    rank: call.rank,
                    nranks: call.nranks,
                    bytes: call.bytes.unwrap_or(0),
                    ts_ns: call.ts_ns,
                    end_ns: call.ts_ns + call.dur_or_zero(),
                    group: call.group,
                    ..CollectiveCall::default()
                });
            }
            Line::Gpu(gpu) => {
                let (pid, device, start, dur) = match &**gpu {
                    GpuLine::Kernel(kernel) => {
                        let end = kernel.ts_ns + kernel.dur_ns;
                        if is_nccl_kernel(&kernel.kernel) {
                            if let (Some(tid), Some(ts)) =
                                (kernel.link.call_tid, kernel.link.call_ts_ns)
                            {
                                kernels.push(NcclKernel {
                                    pid: kernel.pid,
                                    call_tid: tid,
                                    call_ts_ns: ts,
                                    start: kernel.ts_ns,
                                    end,
                                    device: kernel.device,
                                });
                            }
                        } else {
                            trace
                                .compute
                                .entry((kernel.pid, kernel.device))
                                .or_default()
                                .push(kernel.ts_ns, end);
                        }
                        (kernel.pid, kernel.device, kernel.ts_ns, kernel.dur_ns)
                    }
                    GpuLine::Copy(copy) => (copy.pid, copy.device, copy.ts_ns, copy.dur_ns),
                    GpuLine::Memset(set) => (set.pid, set.device, set.ts_ns, set.dur_ns),
                    GpuLine::Info(_) | GpuLine::Error(_) | GpuLine::Gap(_) => continue,
                };
                trace
                    .busy
                    .entry((pid, device))
                    .or_default()
                    .push(start, start + dur);
            }
            Line::Process(process) => analysis.process_event(process.pid, process.event.clone()),
            Line::Footer(_) => trace.complete = true,
            _ => {}
        }
    }
    trace.cut_line = lines.cut;
    trace.skipped_lines = lines.skipped_lines;
    trace.first_skipped = std::mem::take(&mut lines.first_skipped);
    drop_nested(&mut trace.collectives);
    attribute(&mut trace.collectives, &kernels, &group_ends);
    for set in trace.busy.values_mut().chain(trace.compute.values_mut()) {
        set.normalize();
    }
    Ok(trace)
}

/// Leaves out collective calls made inside another of the same thread (they return
/// first, so come first): the outer call is what the program asked for.
fn drop_nested(calls: &mut Vec<CollectiveCall>) {
    calls.sort_by_key(|call| {
        (
            call.pid,
            call.tid,
            call.ts_ns,
            std::cmp::Reverse(call.end_ns),
        )
    });
    let mut kept: Vec<CollectiveCall> = Vec::with_capacity(calls.len());
    for call in calls.drain(..) {
        let inside = kept.last().is_some_and(|outer| {
            (outer.pid, outer.tid) == (call.pid, call.tid)
                && outer.ts_ns <= call.ts_ns
                && call.end_ns <= outer.end_ns
        });
        if !inside {
            kept.push(call);
        }
    }
    *calls = kept;
}

/// Gives each NCCL kernel to the collective whose call launched it (same thread, launch
/// inside the call), or, launched inside an `ncclGroupEnd`, to the group's collectives:
/// within one process, the group's ranks in order take its devices in order (JAX and
/// `ncclCommInitAll` give rank k the k-th device); where they do not pair up, each gets
/// the whole group's span.
fn attribute(
    calls: &mut [CollectiveCall],
    kernels: &[NcclKernel],
    group_ends: &[(u32, u32, u64, u64, u64)],
) {
    // `calls` are sorted by (pid, tid, ts_ns).
    let mut by_group: HashMap<(u32, u64), Vec<usize>> = HashMap::new();
    for (index, call) in calls.iter().enumerate() {
        if let Some(group) = call.group {
            by_group.entry((call.pid, group)).or_default().push(index);
        }
    }
    let mut group_kernels: HashMap<(u32, u64), Vec<&NcclKernel>> = HashMap::new();
    for kernel in kernels {
        let at = calls.partition_point(|call| {
            (call.pid, call.tid, call.ts_ns) <= (kernel.pid, kernel.call_tid, kernel.call_ts_ns)
        });
        if let Some(call) = at.checked_sub(1).map(|i| &mut calls[i])
            && (call.pid, call.tid) == (kernel.pid, kernel.call_tid)
            && kernel.call_ts_ns <= call.end_ns
        {
            add_kernel(call, kernel.start, kernel.end, kernel.device);
            continue;
        }
        let group = group_ends.iter().find(|(pid, tid, ts, end, _)| {
            (*pid, *tid) == (kernel.pid, kernel.call_tid)
                && (*ts..=*end).contains(&kernel.call_ts_ns)
        });
        if let Some((pid, _, _, _, group)) = group {
            group_kernels
                .entry((*pid, *group))
                .or_default()
                .push(kernel);
        }
    }
    for (key, kernels) in group_kernels {
        let Some(members) = by_group.get(&key) else {
            continue;
        };
        let mut devices: Vec<u32> = kernels.iter().map(|k| k.device).collect();
        devices.sort_unstable();
        devices.dedup();
        let mut ranked = members.clone();
        ranked.sort_by_key(|&index| (calls[index].rank, index));
        let paired = devices.len() == members.len() && devices.len() > 1;
        for (position, &index) in ranked.iter().enumerate() {
            for kernel in &kernels {
                if !paired || kernel.device == devices[position] {
                    add_kernel(&mut calls[index], kernel.start, kernel.end, kernel.device);
                }
            }
        }
    }
}

fn add_kernel(call: &mut CollectiveCall, start: u64, end: u64, device: u32) {
    call.gpu_start_ns = Some(call.gpu_start_ns.map_or(start, |s| s.min(start)));
    call.gpu_end_ns = Some(call.gpu_end_ns.map_or(end, |e| e.max(end)));
    call.device.get_or_insert(device);
    call.kernels += 1;
}
