//! The trace's other lines drawn: process and lost lines as markers, driver lines as
//! slices on the process's driver track, `--power` samples on their GPU's counter tracks.

use std::io;

use serde_json::{Map, Value};

use super::{Exporter, basename};
use crate::{
    export::{
        arguments::Arguments,
        call_args::SliceArgs,
        timeline::{Instant, Slice, TimelineSink, Track},
    },
    schema::{DriverLine, LostLine, PowerLine, ProcessEvent, ProcessLine},
};

impl<'f, S: TimelineSink> Exporter<'f, S> {
    pub(super) fn process(&mut self, line: &ProcessLine) -> io::Result<()> {
        self.analysis.process_event(line.pid, line.event.clone());
        let ts = self.relative(line.ts_ns);
        let kept = self.filters.pid(line.pid) && self.filters.span(ts, 0);
        let name = match &line.event {
            ProcessEvent::Fork => format!("fork: pid {}", line.child_pid.unwrap_or(0)),
            ProcessEvent::Exec => format!("exec {}", line.filename.as_deref().unwrap_or("?")),
            other => other.as_str().to_owned(),
        };
        if kept {
            let track = Track::Thread {
                pid: line.pid,
                tid: line.tid,
            };
            self.track(track)?;
            let mut args = Map::new();
            for (key, value) in [
                ("child_pid", line.child_pid.map(Value::from)),
                ("comm", line.comm.clone().map(Value::from)),
                ("filename", line.filename.clone().map(Value::from)),
            ] {
                if let Some(value) = value {
                    args.insert(key.to_owned(), value);
                }
            }
            let args = Arguments::from_map(&args);
            self.sink.instant(&Instant {
                track,
                ts_ns: ts,
                name: &name,
                category: "process",
                args: &args,
            })?;
            self.stats.instants += 1;
        } else {
            self.stats.filtered += 1;
        }
        // Names take effect for the events after this one.
        self.names.current = None;
        match (&line.event, line.child_pid, &line.comm, &line.filename) {
            (ProcessEvent::Fork, Some(child), comm, _) => {
                self.names.parents.insert(child, line.pid);
                if let Some(comm) = comm {
                    self.names.processes.insert(child, (comm.clone(), false));
                }
            }
            (ProcessEvent::Exec, _, _, Some(filename)) => {
                let from_command = self.names.processes.get(&line.pid).is_some_and(|n| n.1);
                if !from_command {
                    let name = basename(filename).to_owned();
                    self.names.processes.insert(line.pid, (name, false));
                }
                self.flows.forget_process(line.pid);
            }
            (ProcessEvent::Exit, ..) => self.flows.forget_process(line.pid),
            _ => {}
        }
        if line.event.ends_address_space()
            && let Some(gpu_flows) = &mut self.gpu_flows
        {
            gpu_flows.forget_process(line.pid);
        }
        Ok(())
    }

    /// A `--power` sample: a value on each of its GPU's counter tracks. The GPU's tracks
    /// are not any process's: `--pid` and `--name` keep them; the time window applies.
    pub(super) fn power(&mut self, line: &PowerLine) -> io::Result<()> {
        let values = self.gpus.values(line);
        let ts = self.relative(line.ts_ns);
        if !self.filters.span(ts, 0) {
            self.stats.filtered += 1;
            return Ok(());
        }
        if self.gpus.first_sight(line.device) {
            self.sink.gpu(line.device, &self.gpus.name(line.device))?;
        }
        for (counter, value) in values {
            self.sink.gpu_counter(line.device, counter, ts, value)?;
            self.stats.counters += 1;
        }
        Ok(())
    }

    pub(super) fn lost(&mut self, line: &LostLine) -> io::Result<()> {
        let ts = self.relative(line.ts_ns);
        if !self.filters.span(ts, 0) || !self.filters.pids.is_empty() {
            self.stats.filtered += 1;
            return Ok(());
        }
        let name = format!("lost {} events ({})", line.count, line.reason);
        let mut args = Map::new();
        args.insert("count".into(), line.count.into());
        args.insert("reason".into(), line.reason.clone().into());
        let args = Arguments::from_map(&args);
        self.sink.instant(&Instant {
            track: Track::Global,
            ts_ns: ts,
            name: &name,
            category: "lost",
            args: &args,
        })?;
        self.stats.instants += 1;
        Ok(())
    }

    pub(super) fn driver(&mut self, line: &DriverLine) -> io::Result<()> {
        let ts = self.relative(line.ts_ns);
        let name = line.what();
        let kept = self.filters.pid(line.pid)
            && self.filters.span(ts, line.dur_ns)
            && self.filters.name(&line.hook, &name);
        if !kept {
            self.stats.filtered += 1;
            return Ok(());
        }
        let track = Track::Driver {
            pid: line.pid,
            tid: line.tid,
        };
        self.track(track)?;
        self.sink.slice(&Slice {
            track,
            ts_ns: ts,
            dur_ns: line.dur_ns,
            name: &name,
            plain_name: false,
            category: "driver",
            args: SliceArgs::Collected(&Arguments::from_map(&line.details())),
            flow_out: &[],
            flows_in: &[],
        })?;
        self.stats.slices += 1;
        self.stats.driver_slices += 1;
        Ok(())
    }
}
