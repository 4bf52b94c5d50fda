//! `--stacks` traces read back: what each Python stack did. Every call counts toward its
//! stack's figures (calls, time in calls, launches, bytes copied and allocated), each
//! kernel's GPU time toward the stack of the call that launched it, and each allocation
//! still live at the end toward the stack that allocated it. Calls and kernels without a
//! stack count toward "(no stack)", so each figure adds up to the trace's.
//!
//! Memory grows with the number of distinct stacks, frames and functions, plus the window
//! of calls kept per thread for `--gpu` kernels (`gpu.rs`), never with the number of calls.
//! `summary` rolls the stacks up by layer and line (`rows.rs`); `flame` writes them as a
//! profile.
//!
//! | file | |
//! |---|---|
//! | `frames.rs` | the stack table; which frame is the layer, which the user's line |
//! | `gpu.rs` | `--gpu`: the stack of the call each kernel came from |
//! | `rows.rs` | the summary's rows: by layer, by line, by the user's line |

pub mod frames;
pub mod gpu;
pub mod rows;

use foldhash::HashMap;
use serde::Serialize;

use self::{
    frames::StackTable,
    gpu::{GpuStacks, KernelSite},
};
use super::{Role, classify, memory::allocated_device_bytes, summary::call_bytes};
use crate::schema::{CallLine, GpuKernelLine, GpuLine, Line, StackRecordCounts, StacklessCounts};

/// What the calls of one stack (or of none) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StackFigures {
    /// Call lines.
    pub calls: u64,
    /// Time in those calls (those with a duration).
    pub time_ns: u64,
    /// Successful kernel launches (the summary's `kernel_launches`).
    pub launches: u64,
    /// Bytes of successful copies.
    pub copied_bytes: u64,
    /// Device bytes allocated (successful `cuMemAlloc*` and `cuMemCreate`, as the memory
    /// figures count them).
    pub allocated_bytes: u64,
    /// Of those, still allocated at the end (or when the process exited): leaks.
    pub live_bytes: u64,
    pub live_allocations: u64,
    /// `--gpu`: the GPU time of the kernels these calls launched.
    pub gpu_ns: u64,
    pub gpu_kernels: u64,
}

impl StackFigures {
    pub fn add(&mut self, other: &StackFigures) {
        self.calls += other.calls;
        self.time_ns += other.time_ns;
        self.launches += other.launches;
        self.copied_bytes += other.copied_bytes;
        self.allocated_bytes += other.allocated_bytes;
        self.live_bytes += other.live_bytes;
        self.live_allocations += other.live_allocations;
        self.gpu_ns += other.gpu_ns;
        self.gpu_kernels += other.gpu_kernels;
    }

    /// Every figure times `factor`: a sample's figures as an estimate of the whole.
    fn scaled(&self, factor: u64) -> StackFigures {
        let times = |figure: u64| figure.saturating_mul(factor);
        StackFigures {
            calls: times(self.calls),
            time_ns: times(self.time_ns),
            launches: times(self.launches),
            copied_bytes: times(self.copied_bytes),
            allocated_bytes: times(self.allocated_bytes),
            live_bytes: times(self.live_bytes),
            live_allocations: times(self.live_allocations),
            gpu_ns: times(self.gpu_ns),
            gpu_kernels: times(self.gpu_kernels),
        }
    }

    /// Each figure less `other`'s, 0 at the least.
    fn less(&self, other: &StackFigures) -> StackFigures {
        StackFigures {
            calls: self.calls.saturating_sub(other.calls),
            time_ns: self.time_ns.saturating_sub(other.time_ns),
            launches: self.launches.saturating_sub(other.launches),
            copied_bytes: self.copied_bytes.saturating_sub(other.copied_bytes),
            allocated_bytes: self.allocated_bytes.saturating_sub(other.allocated_bytes),
            live_bytes: self.live_bytes.saturating_sub(other.live_bytes),
            live_allocations: self.live_allocations.saturating_sub(other.live_allocations),
            gpu_ns: self.gpu_ns.saturating_sub(other.gpu_ns),
            gpu_kernels: self.gpu_kernels.saturating_sub(other.gpu_kernels),
        }
    }
}

fn is_zero(count: &u64) -> bool {
    *count == 0
}

/// Device memory still allocated at the end, by the `stack` of the allocating call (the
/// trace's id; `None`: allocated without one): `(allocations, bytes)`.
pub type LiveByStack = HashMap<Option<u64>, (u64, u64)>;

/// Fed a `--stacks` trace's lines in order (by `summarise`, after the analysis).
#[derive(Default)]
pub struct StackAccumulator {
    table: StackTable,
    /// By index in the table.
    per_stack: Vec<StackFigures>,
    no_stack: StackFigures,
    gpu: GpuStacks,
    /// The trace has `--gpu` lines to come (its header says so): calls are kept for them.
    kernels: bool,
    counts: StackCounts,
    /// `--stack-every N` (the header's `stacks.every`): a call had a stack with a chance
    /// of 1 in N.
    every: u32,
    /// The footer's reasons for the calls without a stack.
    without: Option<StacklessCounts>,
    /// The footer's `stack_records`: how the probes sent the stacks.
    records: Option<StackRecordCounts>,
}

/// How the calls and kernels were attributed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StackCounts {
    /// Call lines with a `stack`.
    pub calls_with_stack: u64,
    /// Of those, calls whose stack was cut at the frame budget.
    pub cut: u64,
    /// Calls naming a stack id whose line the trace does not have (counted without one).
    pub unknown_stack: u64,
    /// `stack` lines repeating an id seen before: the first line is kept.
    #[serde(skip_serializing_if = "is_zero")]
    pub duplicate_stack_ids: u64,
    /// `--gpu`: kernels whose call has no stack.
    pub kernels_call_without_stack: u64,
    /// `--gpu`: kernels with no link to a call, or whose call was not found.
    pub kernels_without_call: u64,
}

impl StackAccumulator {
    /// `kernels`: the trace's header says `--gpu` (launches' stacks are kept for the
    /// kernels to come); `every`: its `stacks.every` (1 when absent).
    pub fn new(kernels: bool, every: u32) -> Self {
        StackAccumulator {
            kernels,
            every,
            ..StackAccumulator::default()
        }
    }

    pub fn line(&mut self, line: &Line) {
        match line {
            Line::Stack(stack) => {
                if !self.table.add(stack) {
                    self.counts.duplicate_stack_ids += 1;
                }
                self.per_stack
                    .resize(self.table.stacks().len(), StackFigures::default());
            }
            Line::Call(call) => self.call(call),
            Line::Footer(footer) => {
                self.without = footer.stacks_without;
                self.records = footer.stack_records;
            }
            Line::Gpu(gpu) => {
                if let GpuLine::Kernel(kernel) = &**gpu {
                    self.kernel(kernel);
                }
            }
            _ => {}
        }
    }

    fn call(&mut self, record: &CallLine) {
        let role = classify(&record.name).0;
        let index = record.stack.and_then(|id| self.table.index(id));
        if let Some(index) = index {
            self.counts.calls_with_stack += 1;
            self.counts.cut += u64::from(self.table.stack(index).cut);
        } else if record.stack.is_some() {
            self.counts.unknown_stack += 1;
        }
        let figures = match index {
            Some(index) => &mut self.per_stack[index as usize],
            None => &mut self.no_stack,
        };
        figures.calls += 1;
        figures.time_ns = figures.time_ns.saturating_add(record.dur_or_zero());
        figures.allocated_bytes += allocated_device_bytes(role, record).unwrap_or(0);
        if !record.ok() {
            return;
        }
        match role {
            Role::Launch if record.kernel.is_some() => figures.launches += 1,
            Role::Copy => {
                figures.copied_bytes = figures
                    .copied_bytes
                    .saturating_add(call_bytes(record).unwrap_or(0));
            }
            _ => {}
        }
        if !self.kernels
            || !matches!(
                role,
                Role::Launch | Role::GraphLaunch | Role::Copy | Role::Memset
            )
        {
            return;
        }
        if record.captured.is_some() {
            // Its work runs in the graph's replays, which name it as their capture site.
            self.gpu
                .captured_call(record.pid, record.tid, record.ts_ns, index);
        } else {
            self.gpu.call(record.pid, record.tid, record.ts_ns, index);
        }
    }

    /// A kernel's GPU time, counted as the GPU section counts it (timed kernels only).
    fn kernel(&mut self, kernel: &GpuKernelLine) {
        if !kernel.link.timed() {
            return;
        }
        let site = self
            .gpu
            .site(kernel.pid, kernel.link.call(), kernel.link.capture_call());
        let figures = match site {
            KernelSite::Stack(index) => &mut self.per_stack[index as usize],
            KernelSite::CallWithoutStack => {
                self.counts.kernels_call_without_stack += 1;
                &mut self.no_stack
            }
            KernelSite::NoCall => {
                self.counts.kernels_without_call += 1;
                &mut self.no_stack
            }
        };
        figures.gpu_ns = figures.gpu_ns.saturating_add(kernel.dur_ns);
        figures.gpu_kernels += 1;
    }

    /// The figures, with the memory still live at the end put in; `gpu`: the trace has
    /// `--gpu` lines (its GPU columns mean something).
    pub fn finish(mut self, live: &LiveByStack, gpu: bool) -> StackProfile {
        for (stack, (allocations, bytes)) in live {
            let figures = match stack.and_then(|id| self.table.index(id)) {
                Some(index) => &mut self.per_stack[index as usize],
                None => &mut self.no_stack,
            };
            figures.live_allocations += allocations;
            figures.live_bytes += bytes;
        }
        let mut total = self.no_stack;
        for figures in &self.per_stack {
            total.add(figures);
        }
        let every = self.every.max(1);
        if every > 1 {
            // Each call had a stack with a chance of 1 in N, so N times a stack's figures
            // estimate what all of its calls did; "(no stack)" is the rest of the totals.
            let mut estimated = StackFigures::default();
            for figures in &mut self.per_stack {
                *figures = figures.scaled(u64::from(every));
                estimated.add(figures);
            }
            self.no_stack = total.less(&estimated);
        }
        StackProfile {
            table: self.table,
            per_stack: self.per_stack,
            no_stack: self.no_stack,
            total,
            counts: self.counts,
            without: self.without,
            records: self.records,
            gpu,
            every,
        }
    }
}

/// Each stack's figures: what `summary` rolls up and `flame` writes.
pub struct StackProfile {
    pub table: StackTable,
    /// By index in the table.
    pub per_stack: Vec<StackFigures>,
    /// Calls and kernels without a stack.
    pub no_stack: StackFigures,
    /// Every figure summed: the trace's own totals, exact.
    pub total: StackFigures,
    pub counts: StackCounts,
    /// The footer's reasons for the calls without a stack (absent without a footer).
    pub without: Option<StacklessCounts>,
    /// The footer's `stack_records` (absent without a footer, or one before they were
    /// counted).
    pub records: Option<StackRecordCounts>,
    /// The trace has `--gpu` lines.
    pub gpu: bool,
    /// `--stack-every N`: a call had a stack with a chance of 1 in N, so the stacks'
    /// figures are N times those of their sampled calls (estimates of all their calls'),
    /// and "(no stack)" is the rest of the totals (an estimate too).
    pub every: u32,
}

impl StackProfile {
    /// `FILE:LINE` of the innermost frame of the trace's stack `id` (a leak's allocating
    /// line), if the trace has that stack and it has a frame.
    pub fn site(&self, id: u64) -> Option<String> {
        let frame = *self.table.stack(self.table.index(id)?).frames.first()?;
        let file = &self.table.function_of(frame).file;
        Some(match self.table.frame(frame).line {
            Some(line) => format!("{file}:{line}"),
            None => file.clone(),
        })
    }
}

#[cfg(test)]
mod tests;
