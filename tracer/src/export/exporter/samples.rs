//! `--stacks` traces as profiles: each call drawn with a stack is also a sample of its
//! stack on its thread (weight: calls), and, in `--gpu` traces, each kernel's time goes to
//! its launch's stack on the launching thread as GPU-time samples, one per
//! `--gpu-sample-us` (1 µs by default): a stack's kernels on a thread get one each time
//! their summed time passes a multiple of it, at that point of the kernel that passes it.
//! The sink interns each stack once (Perfetto: interned callstacks); a format that draws
//! no samples gets none. Calls without a stack are not samples.

use std::io;

use foldhash::HashMap;

use super::Exporter;
use crate::{
    analysis::{
        Role,
        stacks::{
            frames::StackTable,
            gpu::{GpuStacks, KernelSite},
        },
    },
    export::timeline::{SampleWeight, StackFrame, StackSample, TimelineSink, Track},
    schema::{CallLine, GpuKernelLine},
};

#[derive(Default)]
pub struct StackSamples {
    /// Per stack (its index in the table): what the sink interned it as, once asked.
    callstacks: Vec<Option<Option<u64>>>,
    /// `--gpu`: the stacks of launches, copies and memsets, for their kernels to come.
    gpu_calls: GpuStacks,
    /// `--gpu`: per (pid, tid, stack), its kernels' GPU time so far.
    gpu_ns: HashMap<(u32, u32, u32), u64>,
}

impl StackSamples {
    /// The sink's id of stack `index`, interned on first use.
    fn callstack(
        &mut self,
        table: &StackTable,
        index: u32,
        sink: &mut impl TimelineSink,
    ) -> io::Result<Option<u64>> {
        let slot = index as usize;
        if self.callstacks.len() <= slot {
            self.callstacks.resize(slot + 1, None);
        }
        if let Some(interned) = self.callstacks[slot] {
            return Ok(interned);
        }
        let stack = table.stack(index);
        let frames: Vec<StackFrame<'_>> = stack
            .frames
            .iter()
            .map(|frame| {
                let function = table.function_of(*frame);
                let line = table.frame(*frame).line;
                StackFrame {
                    name: function.frame_text(line),
                    file: &function.file,
                    line,
                }
            })
            .collect();
        // A stack without a Python frame is no stack to draw.
        let interned = if frames.is_empty() {
            None
        } else {
            sink.intern_stack(&frames, stack.cut)?
        };
        self.callstacks[slot] = Some(interned);
        Ok(interned)
    }

    /// The thread's stack-`index` kernels had `before` ns and now `dur_ns` more: the
    /// offsets into this kernel where a sample (of `sample_ns`) falls.
    fn gpu_offsets(before: u64, dur_ns: u64, sample_ns: u64) -> impl Iterator<Item = u64> {
        let first = before / sample_ns + 1;
        let last = (before + dur_ns) / sample_ns;
        (first..=last).map(move |k| k * sample_ns - before)
    }

    /// The GPU time left below a whole sample, at the end.
    pub fn unsampled_gpu_ns(&self, sample_ns: u64) -> u64 {
        self.gpu_ns.values().map(|ns| ns % sample_ns).sum()
    }
}

impl<'f, S: TimelineSink> Exporter<'f, S> {
    /// A call drawn (`kept`) with stack `index`: a sample at its start, `ts_ns` since the
    /// base. Every launch, copy and memset keeps its stack for its kernels.
    pub(super) fn call_sample(
        &mut self,
        record: &CallLine,
        role: Role,
        ts_ns: u64,
        kept: bool,
    ) -> io::Result<()> {
        let Some(stacks) = &mut self.stacks else {
            return Ok(());
        };
        let index = record.stack.and_then(|id| stacks.table.index(id));
        if stacks.gpu
            && record.ok()
            && matches!(
                role,
                Role::Launch | Role::GraphLaunch | Role::Copy | Role::Memset
            )
        {
            let samples = &mut stacks.samples.gpu_calls;
            if record.captured.is_some() {
                samples.captured_call(record.pid, record.tid, record.ts_ns, index);
            } else {
                samples.call(record.pid, record.tid, record.ts_ns, index);
            }
        }
        let Some(index) = index else {
            return Ok(());
        };
        if !kept {
            return Ok(());
        }
        let Some(callstack) = stacks
            .samples
            .callstack(&stacks.table, index, &mut self.sink)?
        else {
            return Ok(());
        };
        self.sink.stack_sample(&StackSample {
            pid: record.pid,
            tid: record.tid,
            ts_ns,
            callstack,
            weight: SampleWeight::Call,
        })?;
        self.stats.call_samples += 1;
        Ok(())
    }

    /// A kernel drawn (the filters keep it; it has GPU times): its GPU time to its launch's stack, on the
    /// launching thread (a graph's replayed kernel: its capture site's).
    pub(super) fn kernel_samples(&mut self, kernel: &GpuKernelLine) -> io::Result<()> {
        let Some(stacks) = &mut self.stacks else {
            return Ok(());
        };
        let calls = &stacks.samples.gpu_calls;
        let capture = kernel.link.capture_call();
        let (tid, index) =
            match capture.map(|capture| (capture, calls.site(kernel.pid, None, Some(capture)))) {
                Some(((tid, _), KernelSite::Stack(index))) => (tid, index),
                _ => match (
                    kernel.link.call(),
                    calls.site(kernel.pid, kernel.link.call(), None),
                ) {
                    (Some((tid, _)), KernelSite::Stack(index)) => (tid, index),
                    _ => return Ok(()),
                },
            };
        let Some(callstack) = stacks
            .samples
            .callstack(&stacks.table, index, &mut self.sink)?
        else {
            return Ok(());
        };
        let summed = stacks
            .samples
            .gpu_ns
            .entry((kernel.pid, tid, index))
            .or_default();
        let before = *summed;
        *summed += kernel.dur_ns;
        let start = self.relative(kernel.ts_ns);
        let track = Track::Thread {
            pid: kernel.pid,
            tid,
        };
        let sample_ns = self.filters.gpu_sample_ns();
        for offset in StackSamples::gpu_offsets(before, kernel.dur_ns, sample_ns) {
            self.track(track)?;
            self.sink.stack_sample(&StackSample {
                pid: kernel.pid,
                tid,
                ts_ns: start + offset,
                callstack,
                weight: SampleWeight::GpuTime { sample_ns },
            })?;
            self.stats.gpu_samples += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::StackSamples;

    #[test]
    fn gpu_samples_fall_where_the_sum_passes_each_microsecond() {
        let offsets =
            |before, dur| StackSamples::gpu_offsets(before, dur, 1_000).collect::<Vec<_>>();
        assert_eq!(offsets(0, 999), Vec::<u64>::new());
        assert_eq!(offsets(0, 1_000), vec![1_000]);
        assert_eq!(offsets(999, 1), vec![1]);
        assert_eq!(offsets(300, 2_500), vec![700, 1_700]);
        assert_eq!(offsets(300, 2_700), vec![700, 1_700, 2_700]);
        assert_eq!(offsets(2_000, 0), Vec::<u64>::new());
        let coarse = StackSamples::gpu_offsets(9_000, 25_000, 10_000).collect::<Vec<_>>();
        assert_eq!(coarse, vec![1_000, 11_000, 21_000]);
    }
}
