//! `--gpu` lines drawn: work as slices on its GPU stream's tracks (overlapping work on
//! lanes of its own), with the arrow from the call that issued it; recording status as
//! markers.

use std::io;

use serde_json::{Map, Value};

use super::Exporter;
use crate::{
    export::{
        arguments::Arguments,
        call_args::SliceArgs,
        flows::FlowStart,
        timeline::{Instant, Slice, TimelineSink, Track},
    },
    format::format_bytes,
    schema::GpuLine,
};

impl<'f, S: TimelineSink> Exporter<'f, S> {
    /// A `--gpu` line: work as a slice on its GPU stream's track, with the arrow from its
    /// call; a recording start or error as a marker on the process's main thread.
    pub(super) fn gpu(&mut self, line: &GpuLine) -> io::Result<()> {
        let Some(work) = line.work() else {
            return self.gpu_status(line);
        };
        if let (Some(stacks), GpuLine::Kernel(kernel)) = (&mut self.stacks, line) {
            stacks.kernel(kernel, &mut self.layers_ready);
            self.draw_layers()?;
        }
        let ts = self.relative(work.ts_ns);
        let label = gpu_label(line);
        let kind = match line {
            GpuLine::Kernel(_) => "gpu_kernel",
            GpuLine::Copy(_) => "gpu_copy",
            _ => "gpu_memset",
        };
        let kept = self.filters.pid(work.pid)
            && self.filters.span(ts, work.dur_ns)
            && self.filters.name(kind, &label)
            && work.link.timed();
        let flow = match (work.link.call(), &mut self.gpu_flows) {
            (Some((tid, call_ts)), Some(flows)) => flows.work(work.pid, tid, call_ts),
            _ => None,
        };
        if !kept {
            self.stats.filtered += 1;
            return Ok(());
        }
        if let (Some(_), GpuLine::Kernel(kernel)) = (&self.stacks, line) {
            self.kernel_samples(kernel)?;
        }
        // The first lane of the stream whose last slice ended by this one's start.
        let lanes = self
            .gpu_lanes
            .entry((work.device, work.pid, work.stream))
            .or_default();
        let lane = match lanes.iter().position(|end| *end <= ts) {
            Some(lane) => lane,
            None => {
                lanes.push(0);
                lanes.len() - 1
            }
        };
        lanes[lane] = ts.saturating_add(work.dur_ns);
        let track = Track::Gpu {
            device: self.gpus.group_of(work.device),
            pid: work.pid,
            stream: work.stream,
            lane: lane as u32,
        };
        self.announce_process(work.pid)?;
        self.track(track)?;
        let flows_in: Vec<FlowStart> = flow.into_iter().filter(|start| start.kept).collect();
        // Kernels can be as many as launches: their fields go into the reused arguments.
        let args = &mut self.args;
        args.clear();
        let skip = |key: &str| matches!(key, "type" | "pid" | "ts_ns" | "dur_ns");
        match line {
            GpuLine::Kernel(k) => args.fill(k, skip),
            GpuLine::Copy(c) => args.fill(c, skip),
            GpuLine::Memset(m) => args.fill(m, skip),
            GpuLine::Info(_) | GpuLine::Error(_) | GpuLine::Gap(_) => {}
        }
        args.sort();
        self.sink.slice(&Slice {
            track,
            ts_ns: ts,
            dur_ns: work.dur_ns,
            name: &label,
            plain_name: false,
            category: "gpu",
            args: SliceArgs::Collected(&self.args),
            flow_out: &[],
            flows_in: &flows_in,
        })?;
        self.stats.slices += 1;
        self.stats.gpu_slices += 1;
        self.stats.flows += flows_in.len() as u64;
        Ok(())
    }

    fn gpu_status(&mut self, line: &GpuLine) -> io::Result<()> {
        let (pid, ts_ns, name, args) = match line {
            GpuLine::Info(info) => (
                info.pid,
                info.ts_ns,
                format!("GPU recording: CUPTI {}", info.cupti_version),
                serde_json::to_value(info),
            ),
            GpuLine::Error(error) => (
                error.pid,
                error.ts_ns,
                format!("GPU recording error ({}): {}", error.stage, error.message),
                serde_json::to_value(error),
            ),
            GpuLine::Gap(gap) => (
                gap.pid,
                gap.from_ns,
                format!(
                    "GPU recording held by another CUPTI client ({} calls not recorded)",
                    gap.calls + gap.handed_over
                ),
                serde_json::to_value(gap),
            ),
            _ => return Ok(()),
        };
        let ts = self.relative(ts_ns);
        if !self.filters.pid(pid) || !self.filters.span(ts, 0) {
            self.stats.filtered += 1;
            return Ok(());
        }
        let mut args = match args {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        for key in ["type", "pid", "ts_ns"] {
            args.remove(key);
        }
        let track = Track::Thread { pid, tid: pid };
        self.track(track)?;
        self.sink.instant(&Instant {
            track,
            ts_ns: ts,
            name: &name,
            category: "gpu",
            args: &Arguments::from_map(&args),
        })?;
        self.stats.instants += 1;
        Ok(())
    }
}

/// A GPU work slice's name: the kernel, or the copy's direction and size, or the memset's
/// size.
pub fn gpu_label(line: &GpuLine) -> String {
    match line {
        GpuLine::Kernel(k) => k.kernel.clone(),
        GpuLine::Copy(c) => format!("{} {}", c.kind, format_bytes(c.bytes)),
        GpuLine::Memset(m) => format!("memset {}", format_bytes(m.bytes)),
        GpuLine::Info(_) => "GPU recording".into(),
        GpuLine::Error(e) => format!("GPU recording error ({})", e.stage),
        GpuLine::Gap(_) => "GPU recording held by another CUPTI client".into(),
    }
}
