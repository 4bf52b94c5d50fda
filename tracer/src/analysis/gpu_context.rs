//! The GPU figures that need the whole first pass: what the CPU did in the GPU's largest
//! idle gaps, and each process's GPU busy time per stage. Both need what only the end of
//! the trace tells (the gaps, the stages' bounds), so `cudatrace summary` reads a `--gpu`
//! trace a second time through this (`summarise.rs`).
//!
//! - **In a gap** `[start, start + duration)`: every call line that overlaps it counts, with
//!   the part of its time inside the gap, by function; and the stage each process was in
//!   at the gap's middle.
//! - **Per stage**: the union of one process's work intervals (as in `gpu.rs`), each
//!   closed interval clipped to each of the process's stages.

use std::collections::HashMap;

use super::{
    gpu::{GapCpu, GapFunction, GpuSummary, IntervalUnion},
    stages::ProcessStages,
};
use crate::schema::{CallLine, GpuLine};

/// Functions listed per gap.
const GAP_FUNCTIONS: usize = 5;

struct Gap {
    start: u64,
    end: u64,
    calls: u64,
    in_calls_ns: u64,
    functions: HashMap<String, (u64, u64)>,
}

/// One process's union, and its stages' bounds and busy time.
struct ProcessBusy {
    union: IntervalUnion,
    /// `(start, end)` per stage.
    stages: Vec<(u64, u64)>,
    busy: Vec<u64>,
}

pub struct GpuContext {
    gaps: Vec<Gap>,
    processes: HashMap<u32, ProcessBusy>,
}

fn overlap(a: u64, b: u64, start: u64, end: u64) -> u64 {
    end.min(b).saturating_sub(start.max(a))
}

impl GpuContext {
    /// For the gaps of `gpu` and the stages of `stages`, from the first pass.
    pub fn new(gpu: &GpuSummary, stages: &[ProcessStages]) -> Self {
        let gaps = gpu
            .devices
            .iter()
            .flat_map(|device| &device.gaps)
            .map(|gap| Gap {
                start: gap.start_ns,
                end: gap.start_ns + gap.duration_ns,
                calls: 0,
                in_calls_ns: 0,
                functions: HashMap::new(),
            })
            .collect();
        // A pid that exec'd has one entry per image: their stages follow one another.
        let mut processes: HashMap<u32, ProcessBusy> = HashMap::new();
        for process in stages {
            let entry = processes.entry(process.pid).or_insert_with(|| ProcessBusy {
                union: IntervalUnion::default(),
                stages: Vec::new(),
                busy: Vec::new(),
            });
            for stage in &process.stages {
                entry
                    .stages
                    .push((stage.start_ns, stage.start_ns + stage.duration_ns));
                entry.busy.push(0);
            }
        }
        GpuContext { gaps, processes }
    }

    /// Whether a second pass has anything to find.
    pub fn wanted(gpu: &GpuSummary) -> bool {
        gpu.work > gpu.untimed
    }

    pub fn call(&mut self, call: &CallLine) {
        let end = call.ts_ns.saturating_add(call.dur_or_zero());
        for gap in &mut self.gaps {
            if call.ts_ns >= gap.end || end <= gap.start {
                continue;
            }
            let inside = overlap(gap.start, gap.end, call.ts_ns, end);
            gap.calls += 1;
            gap.in_calls_ns += inside;
            let entry = match gap.functions.get_mut(&call.name) {
                Some(entry) => entry,
                None => gap.functions.entry(call.name.clone()).or_default(),
            };
            entry.0 += 1;
            entry.1 += inside;
        }
    }

    pub fn gpu(&mut self, line: &GpuLine) {
        let Some(work) = line.work() else { return };
        if !work.link.timed() {
            return;
        }
        let Some(process) = self.processes.get_mut(&work.pid) else {
            return;
        };
        let ProcessBusy {
            union,
            stages,
            busy,
        } = process;
        union.insert(
            work.ts_ns,
            work.ts_ns.saturating_add(work.dur_ns),
            &mut |s, e| add_to_stages(stages, busy, s, e),
        );
    }

    /// Puts the findings into the first pass's figures.
    pub fn finish(mut self, gpu: &mut GpuSummary, stages: &mut [ProcessStages]) {
        for process in self.processes.values_mut() {
            let ProcessBusy {
                union,
                stages,
                busy,
            } = process;
            union.finish(&mut |s, e| add_to_stages(stages, busy, s, e));
        }
        let mut taken: HashMap<u32, usize> = HashMap::new();
        for process in stages.iter_mut() {
            let Some(found) = self.processes.get(&process.pid) else {
                continue;
            };
            let first = taken.entry(process.pid).or_default();
            for (stage, busy) in process.stages.iter_mut().zip(&found.busy[*first..]) {
                stage.gpu_busy_ns = Some(*busy);
            }
            *first += process.stages.len();
        }
        let mut gaps = self.gaps.into_iter();
        for gap_out in gpu.devices.iter_mut().flat_map(|d| &mut d.gaps) {
            let Some(gap) = gaps.next() else { break };
            let mut functions: Vec<GapFunction> = gap
                .functions
                .into_iter()
                .map(|(name, (calls, in_gap_ns))| GapFunction {
                    name,
                    calls,
                    in_gap_ns,
                })
                .collect();
            functions.sort_by(|a, b| b.in_gap_ns.cmp(&a.in_gap_ns).then(a.name.cmp(&b.name)));
            functions.truncate(GAP_FUNCTIONS);
            let middle = gap.start + (gap.end - gap.start) / 2;
            let in_stages = stages
                .iter()
                .filter_map(|process| {
                    process
                        .stages
                        .iter()
                        .find(|s| {
                            s.duration_ns > 0
                                && s.start_ns <= middle
                                && middle < s.start_ns + s.duration_ns
                        })
                        .map(|s| format!("pid {}: {}", process.pid, s.name))
                })
                .collect();
            gap_out.cpu = Some(GapCpu {
                calls: gap.calls,
                in_calls_ns: gap.in_calls_ns,
                functions,
                stages: in_stages,
            });
        }
    }
}

fn add_to_stages(stages: &[(u64, u64)], busy: &mut [u64], start: u64, end: u64) {
    for (bounds, total) in stages.iter().zip(busy.iter_mut()) {
        *total += overlap(bounds.0, bounds.1, start, end);
    }
}
