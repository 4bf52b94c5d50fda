//! `--gpu` traces with stacks: the stack of the call that issued each kernel. A
//! `gpu_kernel` line names its call by `(pid, call_tid, call_ts_ns)`, and comes after it
//! in the trace (when CUPTI flushed, some 200 ms later). So the stack of each launch,
//! copy and memset call is kept here for the kernels to come: per thread, the latest
//! [`CALL_WINDOW`] of them, the window `run` links GPU work within (`gpu_link.rs`), so
//! that every kernel `run` linked finds its call. Memory is bounded by that window per
//! thread, whatever the trace's length. A process's calls are kept past its exit: its
//! last kernels' lines may come after its `exit` line.

use std::collections::VecDeque;

use foldhash::HashMap;

use crate::analysis::gpu_link::CALL_WINDOW;

/// A call's stack as kept: the index of its stack in the table, or none.
pub type CallStack = Option<u32>;

/// Where a kernel's GPU time goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSite {
    /// Its call's stack.
    Stack(u32),
    /// Its call has no stack (a family without stacks, or the walk failed).
    CallWithoutStack,
    /// The kernel has no link to a call (`unlinked`), or the call was not found.
    NoCall,
}

/// The calls kept for the kernels to come.
#[derive(Default)]
pub struct GpuStacks {
    calls: HashMap<(u32, u32, u64), CallStack>,
    /// Per thread, the calls kept, oldest first.
    order: HashMap<(u32, u32), VecDeque<u64>>,
    /// Issue 24: calls captured into a CUDA graph, by `(pid, tid, ts_ns)`, kept for as
    /// long as their graphs may run (few: a graph's nodes, not its replays).
    captured: HashMap<(u32, u32, u64), CallStack>,
}

impl GpuStacks {
    /// A successful launch, copy or memset call (the calls `run` links work to).
    pub fn call(&mut self, pid: u32, tid: u32, ts_ns: u64, stack: CallStack) {
        let order = self.order.entry((pid, tid)).or_default();
        if self.calls.insert((pid, tid, ts_ns), stack).is_none() {
            order.push_back(ts_ns);
        }
        if order.len() > CALL_WINDOW
            && let Some(old) = order.pop_front()
        {
            self.calls.remove(&(pid, tid, old));
        }
    }

    /// A call captured into a CUDA graph (its line marked `captured`), whose kernels run
    /// later in replays and name it as their capture site.
    pub fn captured_call(&mut self, pid: u32, tid: u32, ts_ns: u64, stack: CallStack) {
        self.captured.insert((pid, tid, ts_ns), stack);
    }

    /// Where a kernel of process `pid` goes: to its capture site's stack where the line
    /// names one (`capture`, issue 24: a kernel replayed from a graph), else to its call's
    /// (`call`, the link every kernel line has: a graph kernel's is its `cuGraphLaunch`).
    pub fn site(
        &self,
        pid: u32,
        call: Option<(u32, u64)>,
        capture: Option<(u32, u64)>,
    ) -> KernelSite {
        let found = |stack: CallStack| match stack {
            Some(index) => KernelSite::Stack(index),
            None => KernelSite::CallWithoutStack,
        };
        if let Some(stack) = capture.and_then(|(tid, ts)| self.captured.get(&(pid, tid, ts))) {
            return found(*stack);
        }
        match call.and_then(|(tid, ts)| self.calls.get(&(pid, tid, ts))) {
            Some(stack) => found(*stack),
            None => KernelSite::NoCall,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_find_their_calls_stack_within_the_window() {
        let mut gpu = GpuStacks::default();
        gpu.call(1, 2, 100, Some(7));
        gpu.call(1, 2, 200, None);
        assert_eq!(gpu.site(1, Some((2, 100)), None), KernelSite::Stack(7));
        assert_eq!(
            gpu.site(1, Some((2, 200)), None),
            KernelSite::CallWithoutStack
        );
        assert_eq!(gpu.site(1, Some((2, 300)), None), KernelSite::NoCall);
        assert_eq!(gpu.site(1, None, None), KernelSite::NoCall);
        assert_eq!(gpu.site(9, Some((2, 100)), None), KernelSite::NoCall);
        for ts in 0..CALL_WINDOW as u64 {
            gpu.call(1, 2, 1_000 + ts, None);
        }
        assert_eq!(
            gpu.site(1, Some((2, 100)), None),
            KernelSite::NoCall,
            "beyond"
        );
        assert_eq!(gpu.order[&(1, 2)].len(), CALL_WINDOW);
        assert_eq!(gpu.calls.len(), CALL_WINDOW);
    }

    #[test]
    fn a_replayed_kernel_goes_to_its_capture_site_where_known() {
        let mut gpu = GpuStacks::default();
        gpu.captured_call(1, 2, 50, Some(3));
        gpu.call(1, 2, 900, Some(8));
        // The graph launch at 900 replays the node captured at 50.
        assert_eq!(
            gpu.site(1, Some((2, 900)), Some((2, 50))),
            KernelSite::Stack(3)
        );
        assert_eq!(
            gpu.site(1, Some((2, 900)), Some((2, 51))),
            KernelSite::Stack(8)
        );
    }
}
