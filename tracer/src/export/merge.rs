//! Several traces of one job in one timeline (`cudatrace merge`): each trace exported as
//! `export` does, through a [`MergeSink`] that puts it on the job's clock and keeps its
//! processes, threads, GPUs and arrows apart from the other traces' (two hosts may have
//! the same pid, the same GPU 0).
//!
//! - **Clock**: a trace's times (ns since its header's start) are shifted by its start on
//!   the job's clock (wall time by its header, plus the offset `analysis::ranks` fitted),
//!   less the earliest such start: time 0 is the first trace's start.
//! - **Ids**: trace `i` (from 0) gives its pids and tids `(i + 1) << 22 | pid` (Linux pids
//!   are below 2^22), its GPUs `(i << 8) | device`, its flow ids `(i + 1) << 48 | id`;
//!   names keep the real ones.
//! - **Names**: each process is `HOST rank R/N: NAME (pid P)` (the rank on its largest
//!   communicator), each GPU `HOST: GPU ...`; the `cudatrace` track has one marker per
//!   trace, at its start, with its clock's offset, uncertainty and method.

use std::io;

use serde_json::json;

use super::{
    arguments::Arguments,
    flows::FlowStart,
    timeline::{
        ExportStats, GpuCounter, Instant, ProcessName, Slice, StackFrame, StackSample,
        TimelineSink, Track,
    },
};
use crate::schema::Header;

/// Traces a merge takes at most (their pids must stay below the GPU groups' 2^30).
pub const MAX_TRACES: usize = 255;

/// One trace's place in the merged timeline.
pub struct TracePlace {
    /// Its index among the traces.
    pub index: usize,
    /// Added to its times (ns since its header's start).
    pub shift_ns: u64,
    /// Its host, for names.
    pub host: String,
    /// `(pid, "rank R/N")` of its processes with NCCL ranks.
    pub ranks: Vec<(u32, String)>,
}

impl TracePlace {
    fn pid(&self, pid: u32) -> u32 {
        ((self.index as u32 + 1) << 22) | (pid & ((1 << 22) - 1))
    }

    fn device(&self, device: u32) -> u32 {
        ((self.index as u32) << 8) | (device & 0xff)
    }

    fn flow(&self, id: u64) -> u64 {
        ((self.index as u64 + 1) << 48) | (id & ((1 << 48) - 1))
    }

    fn track(&self, track: Track) -> Track {
        match track {
            Track::Thread { pid, tid } => Track::Thread {
                pid: self.pid(pid),
                tid: self.pid(tid),
            },
            Track::Driver { pid, tid } => Track::Driver {
                pid: self.pid(pid),
                tid: self.pid(tid),
            },
            Track::Layers { pid, tid } => Track::Layers {
                pid: self.pid(pid),
                tid: self.pid(tid),
            },
            Track::Global => Track::Global,
            Track::Nccl { pid, index } => Track::Nccl {
                pid: self.pid(pid),
                index,
            },
            Track::Gpu {
                device,
                pid,
                stream,
                lane,
            } => Track::Gpu {
                device: self.device(device),
                pid: self.pid(pid),
                stream,
                lane,
            },
        }
    }
}

/// The sink of one trace of a merge: its events, moved to its place, into `inner`.
pub struct MergeSink<'s, S> {
    pub inner: &'s mut S,
    pub place: &'s TracePlace,
    /// The header goes to `inner` once, from the first trace.
    pub first: bool,
}

impl<S: TimelineSink> TimelineSink for MergeSink<'_, S> {
    fn header(&mut self, header: &Header, base_ns: u64) -> io::Result<()> {
        if self.first {
            self.inner.header(header, base_ns)?;
        }
        Ok(())
    }

    fn process(&mut self, process: &ProcessName<'_>) -> io::Result<()> {
        let place = self.place;
        let rank = place
            .ranks
            .iter()
            .find(|(pid, _)| *pid == process.pid)
            .map_or(String::new(), |(_, rank)| format!(" {rank}"));
        let name = format!(
            "{}{rank}: {} (pid {})",
            place.host, process.name, process.pid
        );
        self.inner.process(&ProcessName {
            pid: place.pid(process.pid),
            name: &name,
            parent: process.parent.map(|parent| place.pid(parent)),
        })
    }

    fn thread(&mut self, track: Track, name: &str) -> io::Result<()> {
        self.inner.thread(self.place.track(track), name)
    }

    fn slice(&mut self, slice: &Slice<'_>) -> io::Result<()> {
        let place = self.place;
        let flow_out: Vec<u64> = slice.flow_out.iter().map(|id| place.flow(*id)).collect();
        let flows_in: Vec<FlowStart> = slice
            .flows_in
            .iter()
            .map(|start| FlowStart {
                id: place.flow(start.id),
                pid: place.pid(start.pid),
                tid: place.pid(start.tid),
                ts_ns: start.ts_ns + place.shift_ns,
                slice_ts_ns: start.slice_ts_ns + place.shift_ns,
                ..*start
            })
            .collect();
        self.inner.slice(&Slice {
            track: place.track(slice.track),
            ts_ns: slice.ts_ns + place.shift_ns,
            dur_ns: slice.dur_ns,
            name: slice.name,
            plain_name: slice.plain_name,
            category: slice.category,
            args: slice.args,
            flow_out: &flow_out,
            flows_in: &flows_in,
        })
    }

    fn instant(&mut self, instant: &Instant<'_>) -> io::Result<()> {
        self.inner.instant(&Instant {
            track: self.place.track(instant.track),
            ts_ns: instant.ts_ns + self.place.shift_ns,
            ..*instant
        })
    }

    fn counter(&mut self, pid: u32, ts_ns: u64, bytes: u64) -> io::Result<()> {
        self.inner
            .counter(self.place.pid(pid), ts_ns + self.place.shift_ns, bytes)
    }

    fn gpu(&mut self, device: u32, name: &str) -> io::Result<()> {
        let name = format!("{}: {name}", self.place.host);
        self.inner.gpu(self.place.device(device), &name)
    }

    fn gpu_counter(
        &mut self,
        device: u32,
        counter: GpuCounter,
        ts_ns: u64,
        value: f64,
    ) -> io::Result<()> {
        self.inner.gpu_counter(
            self.place.device(device),
            counter,
            ts_ns + self.place.shift_ns,
            value,
        )
    }

    fn intern_stack(&mut self, frames: &[StackFrame<'_>], cut: bool) -> io::Result<Option<u64>> {
        // Interned by content: the traces' stacks share ids where their frames are one.
        self.inner.intern_stack(frames, cut)
    }

    fn stack_sample(&mut self, sample: &StackSample) -> io::Result<()> {
        self.inner.stack_sample(&StackSample {
            pid: self.place.pid(sample.pid),
            tid: self.place.pid(sample.tid),
            ts_ns: sample.ts_ns + self.place.shift_ns,
            ..*sample
        })
    }

    /// The merge finishes `inner` once, after the last trace.
    fn finish(&mut self, _stats: &ExportStats) -> io::Result<()> {
        Ok(())
    }
}

/// A trace's clock, as a marker at its start on the `cudatrace` track.
pub struct ClockMarker<'a> {
    pub label: &'a str,
    pub shift_ns: u64,
    pub text: String,
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// Writes the clock markers and finishes `sink`.
pub fn finish(
    sink: &mut impl TimelineSink,
    markers: &[ClockMarker<'_>],
    stats: &mut ExportStats,
) -> io::Result<()> {
    for marker in markers {
        let mut fields = marker.fields.clone();
        fields.insert("trace".into(), json!(marker.label));
        let args = Arguments::from_map(&fields);
        sink.instant(&Instant {
            track: Track::Global,
            ts_ns: marker.shift_ns,
            name: &marker.text,
            category: "clock",
            args: &args,
        })?;
        stats.instants += 1;
    }
    sink.finish(stats)
}
