//! One process (one pid between exec and exit) as the analysis sees it: the trackers that
//! keep state per process, joined in one chain that each call of the process goes through.

use super::{
    Role, capture::CaptureState, devices::ContextState, kernels::KernelNames, kernels::KernelTable,
    memory::MemoryState, nccl::NcclState, stacks::LiveByStack, stages::ProcessStages,
    stages::StageTracker,
};
use crate::schema::{CallLine, ProcessMemory};

/// One process's trackers. A tracker of per-process state is a field here and joins the
/// chain once: [`annotate`](ProcessState::annotate) for what it adds to calls,
/// [`observe`](ProcessState::observe) for figures, [`finish`](ProcessState::finish) for
/// its report.
#[derive(Default)]
pub(super) struct ProcessState {
    pub kernels: KernelTable,
    pub memory: MemoryState,
    pub stages: StageTracker,
    pub nccl: NcclState,
    pub contexts: ContextState,
    pub capture: CaptureState,
}

/// The per-process results of a process that exec'd, exited or was live at the end.
pub(super) struct Finished {
    pub memory: ProcessMemory,
    pub stages: ProcessStages,
    /// `--stacks`: device memory still allocated, by allocating stack.
    pub live_by_stack: LiveByStack,
}

impl ProcessState {
    /// What a call of this process gets from the process's state: its device (its
    /// thread's current context), kernel name, live device bytes, NCCL ranks and groups,
    /// its stream capture.
    /// Inlined: every call of a trace goes through it, and the readers' speed is measured.
    #[inline(always)]
    pub fn annotate(
        &mut self,
        names: &mut KernelNames,
        role: Role,
        symbol: Option<&'static str>,
        record: &mut CallLine,
    ) {
        self.contexts.observe(role, record);
        self.kernels.observe(names, role, record);
        self.memory.observe(role, symbol, record);
        self.nccl.observe(record);
        self.capture.observe(role, symbol, record);
    }

    /// As [`annotate`](ProcessState::annotate), and the call counts toward the process's
    /// figures.
    #[inline(always)]
    pub fn observe(
        &mut self,
        names: &mut KernelNames,
        role: Role,
        symbol: Option<&'static str>,
        record: &mut CallLine,
    ) {
        self.annotate(names, role, symbol, record);
        self.stages.observe(role, record);
    }

    pub fn finish(self, pid: u32) -> Finished {
        Finished {
            memory: self.memory.report(pid),
            stages: self.stages.report(pid),
            live_by_stack: self.memory.live_by_stack(),
        }
    }
}
