//! Calls drawn: a slice on the thread's track named by [`call_label`], the flows from
//! launches to their synchronisation and GPU work, the live-bytes counter, and NCCL
//! collectives again on their rank's track.

use std::io;

use super::{Exporter, RankSlice, call_label, stacks::stack_args};
use crate::{
    analysis::Role,
    catalog::{SyncOn, nccl::collective_op},
    export::{
        arguments::Arguments,
        call_args::{CallArgs, SliceArgs},
        flows::{FlowStart, StreamKey, TO_GPU, TO_SYNC},
        timeline::{Slice, TimelineSink, Track},
    },
    format::format_bytes,
    schema::CallLine,
};

impl<'f, S: TimelineSink> Exporter<'f, S> {
    /// `no_escapes`: the line had none, so neither have its strings.
    pub(super) fn call(&mut self, record: &mut CallLine, no_escapes: bool) -> io::Result<()> {
        let named = (record.kernel.is_some(), record.warnings.len());
        let role = self.analysis.annotate(record);
        // A kernel name the analysis added comes from another line, which may have had
        // escapes; its numbers need none.
        let plain = no_escapes && named == (record.kernel.is_some(), record.warnings.len());
        let ts = self.relative(record.ts_ns);
        let label = call_label(record, role);
        let pid_kept = self.filters.pid(record.pid);
        let kept = pid_kept
            && self.filters.span(ts, record.dur_or_zero())
            && self.filters.name(&record.name, &label);

        // Flows follow every call, kept or not: a filtered-out sync still ends its launches'
        // wait (the arrow needs both ends).
        // To its GPU work and to its synchronisation: at most two (not allocated).
        let mut flow_out = [0u64; 2];
        let mut flows_out = 0;
        let mut flows_in = Vec::new();
        let start = |id, name| FlowStart {
            id,
            pid: record.pid,
            tid: record.tid,
            ts_ns: ts + record.dur_or_zero() / 2,
            slice_ts_ns: ts,
            launch_ts_ns: record.ts_ns,
            kept,
            name,
        };
        if let Some(gpu_flows) = &mut self.gpu_flows
            && record.ok()
            && matches!(
                role,
                Role::Launch | Role::GraphLaunch | Role::Copy | Role::Memset
            )
        {
            let id = self.flows.next_id();
            gpu_flows.call(start(id, TO_GPU));
            if kept {
                flow_out[flows_out] = id;
                flows_out += 1;
            }
        }
        match role {
            Role::Launch | Role::GraphLaunch if record.ok() => {
                if let Some(stream) = StreamKey::of(record) {
                    let id = self.flows.next_id();
                    self.flows.launch(stream, start(id, TO_SYNC));
                    if kept {
                        flow_out[flows_out] = id;
                        flows_out += 1;
                    }
                }
            }
            Role::Sync(SyncOn::Context) => {
                flows_in = self.flows.sync_process(record.pid, record.ts_ns);
            }
            Role::Sync(SyncOn::Stream) => {
                if let Some(stream) = StreamKey::of(record) {
                    flows_in = self.flows.sync_stream(record.pid, stream, record.ts_ns);
                }
            }
            _ => {}
        }
        flows_in.retain(|start| start.kept && kept);

        if self.stacks.is_some() {
            self.layer_call(record, role)?;
        }
        if kept {
            let track = Track::Thread {
                pid: record.pid,
                tid: record.tid,
            };
            self.track(track)?;
            let category = self.families.of(&record.name).unwrap_or("other");
            let call_args = CallArgs {
                record,
                // A launch's slice is named by its kernel: the function called is an
                // argument.
                with_call: role == Role::Launch,
                plain,
            };
            // `--stacks`: the frames as the `stack` argument, collected; every other
            // call's arguments are read straight off it.
            let stacked = self.stacks.is_some()
                && stack_args(&mut self.stacks, record.stack, &call_args, &mut self.args);
            let args = if stacked {
                SliceArgs::Collected(&self.args)
            } else {
                SliceArgs::Call(call_args)
            };
            // A call probed at entry alone (--launch-entry-only) is a zero-length slice.
            self.sink.slice(&Slice {
                track,
                ts_ns: ts,
                dur_ns: record.dur_or_zero(),
                name: &label,
                plain_name: plain,
                category,
                args,
                flow_out: &flow_out[..flows_out],
                flows_in: &flows_in,
            })?;
            self.stats.slices += 1;
            self.stats.flows += flows_in.len() as u64;
            if let Some(op) = collective_op(&record.name) {
                self.collective(record, op, ts)?;
            }
        } else {
            self.stats.filtered += 1;
        }
        if self.stacks.is_some() {
            self.call_sample(record, role, ts, kept)?;
        }

        if let (Some(bytes), true) = (record.live_bytes, pid_kept) {
            // The bytes are those after the call.
            let end = ts.saturating_add(record.dur_or_zero());
            if self.filters.before_window(end) {
                self.counter_before_window.insert(record.pid, bytes);
            } else if self.filters.span(end, 0) {
                if let Some(before) = self.counter_before_window.remove(&record.pid) {
                    self.counter(record.pid, self.filters.start_ns.unwrap_or(0), before)?;
                }
                self.counter(record.pid, end, bytes)?;
            }
        }
        Ok(())
    }

    /// An NCCL collective call, again on its rank's track: one track per process,
    /// communicator (its unique id's start where known, else the `ncclComm_t`) and rank.
    fn collective(&mut self, record: &CallLine, op: &str, ts: u64) -> io::Result<()> {
        let comm = record.comm.map_or(0, |comm| comm.0);
        let communicator = self
            .analysis
            .nccl_comm(record.pid, comm)
            .and_then(|info| info.unique_id.as_deref())
            .map_or_else(
                || format!("{comm:#x}"),
                |id| format!("{}…", id.chars().take(16).collect::<String>()),
            );
        let key = (record.pid, communicator, record.rank, record.nranks);
        let track = match self.nccl_tracks.get(&key) {
            Some(track) => *track,
            None => {
                let track = Track::Nccl {
                    pid: record.pid,
                    index: self.nccl_tracks.len() as u32 + 1,
                };
                let name = nccl_track_name(&key.1, record.rank, record.nranks);
                self.nccl_tracks.insert(key, track);
                self.announce_process(record.pid)?;
                self.sink.thread(track, &name)?;
                track
            }
        };
        let mut label = match record.bytes {
            Some(bytes) => format!("{op} {}", format_bytes(bytes)),
            None => op.to_owned(),
        };
        if !record.ok() {
            label.push_str(" → ");
            match &record.ret_name {
                Some(name) => label.push_str(name),
                None => label.push_str(&format!("error {}", record.ret.unwrap_or(0))),
            }
        }
        let mut args = Arguments::default();
        args.fill(record, |key| !NCCL_ARGS.contains(&key));
        args.insert_text("call", &record.name);
        // A collective NCCL made inside another (ncclBcast runs as ncclBroadcast) is
        // drawn once: the outer call, which names the inner one.
        let thread = (record.pid, record.tid);
        let end = record.ts_ns + record.dur_or_zero();
        if let Some(previous) = self.pending_rank_slices.remove(&thread) {
            if record.ts_ns <= previous.call_ts_ns && previous.call_end_ns <= end {
                args.insert_text("ran_as", &previous.function);
            } else {
                self.rank_slice(previous)?;
            }
        }
        self.pending_rank_slices.insert(
            thread,
            RankSlice {
                track,
                ts_ns: ts,
                dur_ns: record.dur_or_zero(),
                label,
                args,
                call_ts_ns: record.ts_ns,
                call_end_ns: end,
                function: record.name.clone(),
            },
        );
        Ok(())
    }

    pub(super) fn rank_slice(&mut self, mut slice: RankSlice) -> io::Result<()> {
        slice.args.sort();
        self.sink.slice(&Slice {
            track: slice.track,
            ts_ns: slice.ts_ns,
            dur_ns: slice.dur_ns,
            name: &slice.label,
            plain_name: false,
            category: "nccl_rank",
            args: SliceArgs::Collected(&slice.args),
            flow_out: &[],
            flows_in: &[],
        })?;
        self.stats.slices += 1;
        self.stats.nccl_slices += 1;
        Ok(())
    }
}

/// The fields of a collective call its rank-track slice carries.
const NCCL_ARGS: [&str; 12] = [
    "comm", "rank", "nranks", "count", "datatype", "bytes", "op", "root", "peer", "stream",
    "group", "ret",
];

/// `NCCL rank 0/2 (comm 0a1b2c3d4e5f6071…)`; `?` for what is not known.
pub fn nccl_track_name(communicator: &str, rank: Option<i32>, nranks: Option<i32>) -> String {
    let known = |value: Option<i32>| value.map_or_else(|| "?".to_owned(), |v| v.to_string());
    format!(
        "NCCL rank {}/{} (comm {communicator})",
        known(rank),
        known(nranks)
    )
}
