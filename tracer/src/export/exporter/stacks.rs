//! `--stacks` traces drawn: each call's slice carries its Python stack as text (`stack`,
//! innermost frame first, `QUALNAME (FILE:LINE) ← CALLER (FILE:LINE) ← ...`), and each thread with layers gets a "Python layers" track
//! beside it, a slice per layer entry.
//!
//! **A layer entry** is a run of consecutive calls of one thread made under the same
//! layer instance, as far as frames tell instances apart: calls whose stacks have the
//! same layer (innermost Module forward, `analysis/stacks/frames.rs`) and the same frames
//! (function and line) from the layer's caller outward. The layer's own line may change
//! within an entry. A call with another layer, or with a stack without one, ends it; calls
//! without a stack (families without stacks) neither end nor extend it. The slice spans
//! its first call's start to its last call's end. Frames cannot tell apart two instances
//! of one class called one after the other from one line (`for block in self.h:
//! x = block(x)` where nothing else comes between): their calls are one entry.
//!
//! With `--gpu`, an entry's slice also has the GPU time of the kernels its launches ran
//! (`gpu_ns`, `gpu_kernels`): it is drawn once every launch of it has had its first
//! kernel (kernel lines come some 200 ms after their calls), or, past
//! [`MAX_PENDING_ENTRIES`] entries waiting, as it is (its launches still without a
//! kernel are counted, and said on stderr).

use std::{collections::BTreeMap, io};

use foldhash::HashMap;
use serde_json::Map;

use super::{Exporter, samples::StackSamples};
use crate::{
    analysis::{Role, stacks::frames::StackTable},
    export::{
        arguments::Arguments,
        call_args::{CallArgs, SliceArgs, collect},
        timeline::{Slice, TimelineSink, Track},
    },
    schema::{CallLine, GpuKernelLine, StackLine},
};

/// Between a frame and its caller's in a `stack` argument: one line, which viewers show
/// whole (the trace processor keeps a JSON string's `\n` escaped).
pub const CALLED_FROM: &str = " ← ";

/// A stack cut at the frame budget ends with this where its outer frames would be.
pub const CUT_MARKER: &str = "(cut at the frame budget)";

/// Ended entries kept waiting for their kernels; beyond, the oldest is drawn as it is.
pub const MAX_PENDING_ENTRIES: usize = 1 << 16;

/// One layer entry (see the module's doc).
pub struct LayerEntry {
    pub pid: u32,
    pub tid: u32,
    /// The layer's class.
    pub name: String,
    /// Its `forward`'s qualified name and file.
    pub function: String,
    pub file: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub calls: u64,
    pub launches: u64,
    pub time_ns: u64,
    pub gpu_ns: u64,
    pub gpu_kernels: u64,
    key: u32,
    /// Launches still waiting for their first kernel (when drawn: that never had one).
    pub waiting: u64,
    /// The launches' `(pid, tid, ts_ns)`.
    launch_keys: Vec<(u32, u32, u64)>,
}

#[derive(Default)]
pub struct ExportStacks {
    pub(super) table: StackTable,
    /// The stacks as profile samples (`samples.rs`).
    pub(super) samples: StackSamples,
    /// Per stack (its index in the table): its frames as text, once written.
    text: Vec<Option<Box<str>>>,
    /// Per stack: its entry key (layer function and the frames outside it), if it has a
    /// layer.
    entry_key: Vec<Option<u32>>,
    keys: HashMap<(u32, Vec<u32>), u32>,
    /// Per thread, the entry its calls are in.
    open: HashMap<(u32, u32), (u64, LayerEntry)>,
    /// Ended entries waiting for kernels, by sequence number.
    pending: BTreeMap<u64, LayerEntry>,
    /// Launches of entries not drawn yet → their entry's sequence number, and whether a
    /// kernel of theirs came (a graph launch runs several).
    launches: HashMap<(u32, u32, u64), (u64, bool)>,
    next: u64,
    /// The trace has `--gpu` lines: entries wait for their kernels.
    pub gpu: bool,
}

impl ExportStacks {
    pub fn stack_line(&mut self, line: &StackLine) {
        self.table.add(line);
        let stacks = self.table.stacks();
        while self.entry_key.len() < stacks.len() {
            let stack = &stacks[self.entry_key.len()];
            let key = stack.layer.map(|at| {
                let function = self.table.frame(stack.frames[at]).function;
                let outer = stack.frames[at + 1..].to_vec();
                let next = self.keys.len() as u32;
                *self.keys.entry((function, outer)).or_insert(next)
            });
            self.entry_key.push(key);
            self.text.push(None);
        }
    }

    /// The stack `id`'s frames as text, innermost first, each called from the next.
    pub fn text(&mut self, id: u64) -> Option<&str> {
        let index = self.table.index(id)? as usize;
        if self.text[index].is_none() {
            let stack = self.table.stack(index as u32);
            let mut text = String::new();
            for frame in &stack.frames {
                if !text.is_empty() {
                    text.push_str(CALLED_FROM);
                }
                let function = self.table.function_of(*frame);
                text.push_str(&function.frame_text(self.table.frame(*frame).line));
            }
            if stack.cut {
                text.push_str(CALLED_FROM);
                text.push_str(CUT_MARKER);
            }
            self.text[index] = Some(text.into_boxed_str());
        }
        self.text[index].as_deref()
    }

    /// A call: it joins its thread's entry, or ends it (and may start another). Entries
    /// ready to draw go to `ready`.
    pub fn call(&mut self, record: &CallLine, role: Role, ready: &mut Vec<LayerEntry>) {
        let Some(index) = record.stack.and_then(|id| self.table.index(id)) else {
            return;
        };
        let thread = (record.pid, record.tid);
        let key = self.entry_key[index as usize];
        if let Some((seq, entry)) = self.open.remove(&thread) {
            if Some(entry.key) == key {
                self.open.insert(thread, (seq, entry));
            } else {
                self.end(seq, entry, ready);
            }
        }
        let Some(key) = key else { return };
        let (seq, entry) = self.open.entry(thread).or_insert_with(|| {
            self.next += 1;
            let stack = self.table.stack(index);
            let forward = self
                .table
                .function_of(stack.frames[stack.layer.unwrap_or(0)]);
            (
                self.next,
                LayerEntry {
                    pid: record.pid,
                    tid: record.tid,
                    name: forward.layer_name(),
                    function: forward.qualname.clone(),
                    file: forward.file.clone(),
                    start_ns: record.ts_ns,
                    end_ns: record.ts_ns,
                    calls: 0,
                    launches: 0,
                    time_ns: 0,
                    gpu_ns: 0,
                    gpu_kernels: 0,
                    key,
                    waiting: 0,
                    launch_keys: Vec::new(),
                },
            )
        });
        entry.calls += 1;
        entry.time_ns += record.dur_or_zero();
        entry.end_ns = entry.end_ns.max(record.ts_ns + record.dur_or_zero());
        let launch = record.ok() && matches!(role, Role::Launch | Role::GraphLaunch);
        entry.launches += u64::from(launch && role == Role::Launch);
        if launch && self.gpu {
            let launch = (record.pid, record.tid, record.ts_ns);
            self.launches.insert(launch, (*seq, false));
            entry.launch_keys.push(launch);
            entry.waiting += 1;
        }
    }

    fn end(&mut self, seq: u64, entry: LayerEntry, ready: &mut Vec<LayerEntry>) {
        if entry.waiting == 0 {
            self.drawn(entry, ready);
            return;
        }
        self.pending.insert(seq, entry);
        while self.pending.len() > MAX_PENDING_ENTRIES {
            if let Some((_, oldest)) = self.pending.pop_first() {
                self.drawn(oldest, ready);
            }
        }
    }

    fn drawn(&mut self, entry: LayerEntry, ready: &mut Vec<LayerEntry>) {
        for launch in &entry.launch_keys {
            self.launches.remove(launch);
        }
        ready.push(entry);
    }

    /// A kernel: its GPU time goes to its launch's entry.
    pub fn kernel(&mut self, kernel: &GpuKernelLine, ready: &mut Vec<LayerEntry>) {
        let Some((tid, ts)) = kernel.link.call() else {
            return;
        };
        let Some((seq, seen)) = self.launches.get_mut(&(kernel.pid, tid, ts)) else {
            return;
        };
        let (seq, first) = (*seq, !*seen);
        *seen = true;
        let thread = (kernel.pid, tid);
        let open = self.open.get(&thread).is_some_and(|(open, _)| *open == seq);
        let entry = match self.open.get_mut(&thread) {
            Some((_, entry)) if open => entry,
            _ => match self.pending.get_mut(&seq) {
                Some(entry) => entry,
                None => return,
            },
        };
        entry.gpu_ns += kernel.dur_ns;
        entry.gpu_kernels += 1;
        entry.waiting -= u64::from(first);
        if !open
            && entry.waiting == 0
            && let Some(entry) = self.pending.remove(&seq)
        {
            self.drawn(entry, ready);
        }
    }

    /// The end of the trace: every entry.
    pub fn finish(&mut self, ready: &mut Vec<LayerEntry>) {
        let mut open: Vec<(u64, LayerEntry)> = self.open.drain().map(|(_, open)| open).collect();
        open.sort_by_key(|(seq, _)| *seq);
        for (seq, entry) in open {
            self.pending.insert(seq, entry);
        }
        while let Some((_, entry)) = self.pending.pop_first() {
            self.drawn(entry, ready);
        }
    }
}

/// A call with a stack: its arguments collected into `arguments`, with its frames as
/// `stack`, if the trace has that stack. Out of line: traces without stacks never come.
#[inline(never)]
pub(super) fn stack_args(
    stacks: &mut Option<Box<ExportStacks>>,
    id: Option<u64>,
    call: &CallArgs<'_>,
    arguments: &mut Arguments,
) -> bool {
    match stacks
        .as_mut()
        .zip(id)
        .and_then(|(stacks, id)| stacks.text(id))
    {
        Some(stack) => {
            collect(call, Some(stack), arguments);
            true
        }
        None => false,
    }
}

impl<'f, S: TimelineSink> Exporter<'f, S> {
    /// `--stacks`: a call joins or ends its thread's layer entry; those ready are drawn.
    #[inline(never)]
    pub(super) fn layer_call(&mut self, record: &CallLine, role: Role) -> io::Result<()> {
        if let Some(stacks) = &mut self.stacks {
            stacks.call(record, role, &mut self.layers_ready);
        }
        self.draw_layers()
    }

    /// Draws the layer entries ready, each on its thread's layer track.
    pub(super) fn draw_layers(&mut self) -> io::Result<()> {
        if self.layers_ready.is_empty() {
            return Ok(());
        }
        let gpu = self.stacks.as_ref().is_some_and(|stacks| stacks.gpu);
        for entry in std::mem::take(&mut self.layers_ready) {
            let ts = self.relative(entry.start_ns);
            let dur = entry.end_ns - entry.start_ns;
            self.stats.layer_launches_without_kernel += entry.waiting;
            let kept = self.filters.pid(entry.pid)
                && self.filters.span(ts, dur)
                && self.filters.name("python layer", &entry.name);
            if !kept {
                self.stats.filtered += 1;
                continue;
            }
            let track = Track::Layers {
                pid: entry.pid,
                tid: entry.tid,
            };
            self.track(track)?;
            let mut args = Map::new();
            args.insert("function".into(), entry.function.into());
            args.insert("file".into(), entry.file.into());
            args.insert("calls".into(), entry.calls.into());
            args.insert("launches".into(), entry.launches.into());
            args.insert("time_in_calls_ns".into(), entry.time_ns.into());
            if gpu {
                args.insert("gpu_ns".into(), entry.gpu_ns.into());
                args.insert("gpu_kernels".into(), entry.gpu_kernels.into());
                if entry.waiting > 0 {
                    args.insert("launches_without_kernel".into(), entry.waiting.into());
                }
            }
            let mut args = Arguments::from_map(&args);
            args.sort();
            self.sink.slice(&Slice {
                track,
                ts_ns: ts,
                dur_ns: dur,
                name: &entry.name,
                plain_name: false,
                category: "python_layer",
                args: SliceArgs::Collected(&args),
                flow_out: &[],
                flows_in: &[],
            })?;
            self.stats.slices += 1;
            self.stats.layer_slices += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
