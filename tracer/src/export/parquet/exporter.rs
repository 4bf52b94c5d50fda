//! Lines → rows: each line read goes to its table (a call to `calls`, and also to
//! `copies`, `memsets` or `collectives` where it is one), through the analysis, so that
//! traces without kernel names, devices or NCCL ranks get them as `summary` does.

use std::{borrow::Cow, io::BufRead};

use foldhash::HashMap;
use parquet::errors::ParquetError;
use serde_json::Value;

use super::{
    calls::CallRow,
    collectives::{Collective, Collectives},
    columns::{int, pointer},
    ranks::Ranks,
    table::Origin,
    tables::{
        TABLES, Tables, copies, gpu_copies, gpu_gaps, gpu_memsets, kernels, libraries, memsets,
        power, processes, stacks, traces,
    },
};
use crate::{
    analysis::{Analysis, Role, families::Families},
    reader::{ReadError, TraceLines},
    schema::{
        CallLine, FooterFigures, GpuLine, Header, LibraryLine, Line, PowerLine, ProcessLine,
        StackLine,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum ParquetExportError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("writing the tables: {0}")]
    Write(#[from] ParquetError),
}

/// The header's fields the schema's reader skips, read leniently (a field of another
/// type is absent): what the `traces` table and every row's `trace` and `host` need.
#[derive(Debug, Default)]
pub struct HeaderExtra {
    pub version: Option<i32>,
    pub cudatrace_version: Option<String>,
    pub mode: Option<String>,
    pub start_wall: Option<String>,
    pub start_wall_ns: Option<u64>,
    pub host: Option<String>,
}

/// The reader's [`Prepare`](crate::reader::Prepare): a header's other fields.
pub fn header_extra(bytes: &[u8], line: &Line) -> Option<Box<HeaderExtra>> {
    let Line::Header(_) = line else { return None };
    let value: Value = serde_json::from_slice(bytes).ok()?;
    let text = |key: &str| {
        value
            .get(key)
            .and_then(Value::as_str)
            .filter(|text| !text.is_empty())
            .map(str::to_owned)
    };
    Some(Box::new(HeaderExtra {
        version: value
            .get("version")
            .and_then(Value::as_i64)
            .and_then(|v| i32::try_from(v).ok()),
        cudatrace_version: text("cudatrace_version"),
        mode: text("mode"),
        start_wall: text("start_wall"),
        start_wall_ns: value.get("start_wall_ns").and_then(Value::as_u64),
        host: text("host"),
    }))
}

/// What every row starts with.
struct Who {
    trace: String,
    host: Option<String>,
    ranks: Ranks,
}

impl Who {
    /// A row of process `pid`.
    fn origin(&self, pid: u32) -> Origin<'_> {
        Origin {
            rank: self.ranks.of(pid),
            ..self.machine()
        }
    }

    /// A row of no one process (a GPU's power, the trace itself).
    fn machine(&self) -> Origin<'_> {
        Origin {
            trace: &self.trace,
            host: self.host.as_deref(),
            rank: None,
        }
    }
}

/// What the export read, for the `traces` table and the closing line.
#[derive(Default)]
pub struct ReadFigures {
    pub lines: u64,
    pub skipped_lines: u64,
    pub first_skipped: Vec<(u64, String)>,
    pub unknown_lines: u64,
    /// The cut line of a trace without footer, as a warning.
    pub cut_warning: Option<String>,
}

pub struct ParquetExporter {
    tables: Tables,
    who: Who,
    analysis: Analysis,
    families: Families,
    collectives: Collectives,
    /// The file as given, for `traces.file`.
    file: String,
    header: Option<(Box<Header>, Box<HeaderExtra>)>,
    footer: Option<FooterFigures>,
    /// `start_wall_ns - start_monotonic_ns`: a `ts_ns` plus this is wall time.
    wall_offset_ns: Option<i64>,
    /// `--power` GPUs by NVML index: name and uuid.
    gpu_names: HashMap<u32, (String, String)>,
    figures: ReadFigures,
}

impl ParquetExporter {
    pub fn new(tables: Tables, ranks: Ranks, file: &str) -> Self {
        ParquetExporter {
            tables,
            who: Who {
                // Until the header names it.
                trace: file.to_owned(),
                host: None,
                ranks,
            },
            analysis: Analysis::default(),
            families: Families::default(),
            collectives: Collectives::default(),
            file: file.to_owned(),
            header: None,
            footer: None,
            wall_offset_ns: None,
            gpu_names: HashMap::default(),
            figures: ReadFigures::default(),
        }
    }

    /// Reads every line into its tables, then closes them: the rows of each.
    pub fn run(
        mut self,
        mut lines: TraceLines<impl BufRead, Option<Box<HeaderExtra>>>,
    ) -> Result<([u64; TABLES], ReadFigures), ParquetExportError> {
        while let Some((line, extra)) = lines.next_prepared()? {
            match line {
                Line::Header(header) => self.header(header, extra.take()),
                Line::Call(call) => self.call(call)?,
                Line::Process(process) => self.process(process)?,
                Line::Gpu(gpu) => self.gpu(gpu)?,
                Line::Power(power) => self.power(power)?,
                Line::Library(library) => self.library(library)?,
                Line::Stack(stack) => self.stack(stack)?,
                Line::Footer(footer) => self.footer = Some(**footer),
                // An interpreter line says whether a process's calls have stacks; the
                // stacks themselves are the `stacks` table.
                Line::Lost(_) | Line::Driver(_) | Line::Interpreter(_) => {}
                Line::Unknown => self.figures.unknown_lines += 1,
            }
        }
        self.figures.lines = lines.lines;
        self.figures.skipped_lines = lines.skipped_lines;
        self.figures.first_skipped = std::mem::take(&mut lines.first_skipped);
        self.figures.cut_warning = lines.cut_warning();
        self.collectives.finish();
        self.write_collectives()?;
        self.trace_row()?;
        let rows = self.tables.close()?;
        Ok((rows, self.figures))
    }

    fn header(&mut self, header: &Header, extra: Option<Box<HeaderExtra>>) {
        let extra = extra.unwrap_or_default();
        self.who.host = extra.host.clone();
        // The trace's id: its machine and when it started, unique to the run.
        self.who.trace = match (&extra.host, &extra.start_wall) {
            (Some(host), Some(start)) => format!("{host}@{start}"),
            (None, Some(start)) => start.clone(),
            _ => self.file.clone(),
        };
        self.wall_offset_ns = match (extra.start_wall_ns, header.start_monotonic_ns) {
            (Some(wall), Some(monotonic)) => Some(int(wall) - int(monotonic)),
            _ => None,
        };
        self.families = Families::from_header(header);
        if header.gpu.is_some() {
            self.collectives.expect_gpu();
        }
        if let Some(power) = &header.power {
            for device in &power.devices {
                let names = (device.name.clone(), device.uuid.clone());
                self.gpu_names.insert(device.index, names);
            }
        }
        self.header = Some((Box::new(header.clone()), extra));
    }

    fn call(&mut self, call: &mut CallLine) -> Result<(), ParquetError> {
        let role = self.analysis.annotate(call);
        if call.rank.is_some() {
            // Where the pass ahead did not see it (keys in another order).
            self.who.ranks.learn(call);
        }
        let origin = self.who.origin(call.pid);
        let family = self.families.of(&call.name);
        self.tables.calls.push(origin, CallRow { call, family })?;
        match role {
            Role::Copy => self.tables.copies.push(origin, copy_row(call))?,
            Role::Memset => self.tables.memsets.push(origin, memset_row(call))?,
            _ => {}
        }
        let analysis = &self.analysis;
        self.collectives
            .call(role, call, || Collective::of(call, analysis));
        self.write_collectives()
    }

    fn write_collectives(&mut self) -> Result<(), ParquetError> {
        for row in self.collectives.ready.drain(..) {
            let origin = self.who.origin(row.pid);
            self.tables
                .collectives
                .push(origin, row.row(self.wall_offset_ns))?;
        }
        Ok(())
    }

    fn process(&mut self, line: &ProcessLine) -> Result<(), ParquetError> {
        self.analysis.process_event(line.pid, line.event.clone());
        self.tables.processes.push(
            self.who.origin(line.pid),
            processes::Row {
                event: line.event.as_str(),
                pid: line.pid as i32,
                tid: line.tid as i32,
                ts_ns: int(line.ts_ns),
                child_pid: line.child_pid.map(|pid| pid as i32),
                comm: line.comm.as_deref(),
                filename: line.filename.as_deref(),
            },
        )
    }

    fn gpu(&mut self, line: &GpuLine) -> Result<(), ParquetError> {
        let origin = self.who.origin(line.pid());
        match line {
            GpuLine::Kernel(k) => {
                self.collectives.kernel(k);
                self.tables.kernels.push(
                    origin,
                    kernels::Row {
                        pid: k.pid as i32,
                        device: k.device as i32,
                        context: i64::from(k.context),
                        stream: i64::from(k.stream),
                        ts_ns: int(k.ts_ns),
                        dur_ns: int(k.dur_ns),
                        kernel: &k.kernel,
                        kernel_mangled: k.kernel_mangled.as_deref(),
                        grid: Some(k.grid),
                        block: Some(k.block),
                        static_shared_mem: i64::from(k.static_shared_mem),
                        dynamic_shared_mem: i64::from(k.dynamic_shared_mem),
                        registers_per_thread: k.registers_per_thread as i32,
                        link: &k.link,
                    },
                )?;
                self.write_collectives()
            }
            GpuLine::Copy(c) => self.tables.gpu_copies.push(
                origin,
                gpu_copies::Row {
                    pid: c.pid as i32,
                    device: c.device as i32,
                    context: i64::from(c.context),
                    stream: i64::from(c.stream),
                    ts_ns: int(c.ts_ns),
                    dur_ns: int(c.dur_ns),
                    kind: &c.kind,
                    bytes: int(c.bytes),
                    src_kind: &c.src_kind,
                    dst_kind: &c.dst_kind,
                    is_async: c.is_async,
                    link: &c.link,
                },
            ),
            GpuLine::Memset(m) => self.tables.gpu_memsets.push(
                origin,
                gpu_memsets::Row {
                    pid: m.pid as i32,
                    device: m.device as i32,
                    context: i64::from(m.context),
                    stream: i64::from(m.stream),
                    ts_ns: int(m.ts_ns),
                    dur_ns: int(m.dur_ns),
                    bytes: int(m.bytes),
                    value: i64::from(m.value),
                    memory: &m.memory,
                    is_async: m.is_async,
                    link: &m.link,
                },
            ),
            // How recording went: the trace's own lines say it.
            GpuLine::Gap(gap) => self.tables.gpu_gaps.push(
                origin,
                gpu_gaps::Row {
                    pid: gap.pid as i32,
                    tid: gap.tid as i32,
                    from_ns: int(gap.from_ns),
                    to_ns: gap.to_ns.map(int),
                    calls: int(gap.calls),
                    handed_over: int(gap.handed_over),
                },
            ),
            GpuLine::Info(_) | GpuLine::Error(_) => Ok(()),
        }
    }

    fn power(&mut self, line: &PowerLine) -> Result<(), ParquetError> {
        let names = self.gpu_names.get(&line.device);
        let errors: Vec<Cow<'static, str>> = line
            .errors
            .iter()
            .map(|(field, error)| Cow::Owned(format!("{field}: {error}")))
            .collect();
        let small = |value: Option<u32>| value.map(|v| v as i32);
        self.tables.power.push(
            self.who.machine(),
            power::Row {
                device: line.device as i32,
                gpu_name: names.map(|(name, _)| name.as_str()),
                uuid: names.map(|(_, uuid)| uuid.as_str()),
                seq: int(line.seq),
                ts_ns: int(line.ts_ns),
                read_ns: int(line.read_ns),
                power_mw: line.power_mw.map(i64::from),
                power_instant_mw: line.power_instant_mw.map(i64::from),
                energy_mj: line.energy_mj.map(int),
                sm_clock_mhz: small(line.sm_clock_mhz),
                mem_clock_mhz: small(line.mem_clock_mhz),
                gpu_util_pct: small(line.gpu_util_pct),
                mem_util_pct: small(line.mem_util_pct),
                temperature_c: small(line.temperature_c),
                memory_used_bytes: line.memory_used_bytes.map(int),
                errors: (!errors.is_empty()).then_some(errors.as_slice()),
            },
        )
    }

    fn library(&mut self, line: &LibraryLine) -> Result<(), ParquetError> {
        self.families.add_library(line);
        self.tables.libraries.push(
            self.who.machine(),
            libraries::Row {
                id: i64::from(line.id),
                set: &line.set,
                path: &line.path,
                file_device: int(line.device),
                inode: int(line.inode),
                version: line.version.as_deref(),
                standin: line.standin,
                found: &line.found,
                pid: line.pid.map(|pid| pid as i32),
                ts_ns: line.ts_ns.map(int),
                probes: line.probes.len() as i64,
            },
        )
    }

    fn stack(&mut self, line: &StackLine) -> Result<(), ParquetError> {
        for (frame, at) in line.frames.iter().zip(0..) {
            self.tables.stacks.push(
                self.who.machine(),
                stacks::Row {
                    stack: int(line.id),
                    frame: at,
                    file: &frame.file,
                    qualname: &frame.qualname,
                    line: frame.line.map(|line| line as i32),
                    first_line: frame.first_line as i32,
                    cut: line.cut,
                },
            )?;
        }
        Ok(())
    }

    /// The `traces` row, from the header and footer.
    fn trace_row(&mut self) -> Result<(), ParquetError> {
        let (header, extra) = match &self.header {
            Some((header, extra)) => (Some(&**header), Some(&**extra)),
            None => (None, None),
        };
        let command: Option<Vec<Cow<'static, str>>> = header
            .filter(|h| !h.command.is_empty())
            .map(|h| h.command.iter().map(|w| Cow::Owned(w.clone())).collect());
        let pids = header.map(|h| h.pids.as_slice()).filter(|p| !p.is_empty());
        self.tables.traces.push(
            self.who.machine(),
            traces::Row {
                file: &self.file,
                format_version: extra.and_then(|e| e.version).unwrap_or(0),
                cudatrace_version: extra.and_then(|e| e.cudatrace_version.as_deref()),
                mode: extra.and_then(|e| e.mode.as_deref()),
                command: command.as_deref(),
                pids,
                start_wall: extra.and_then(|e| e.start_wall.as_deref()),
                start_wall_ns: extra.and_then(|e| e.start_wall_ns).map(int),
                start_monotonic_ns: header.and_then(|h| h.start_monotonic_ns).map(int),
                wall_offset_ns: self.wall_offset_ns,
                gpu: header.is_some_and(|h| h.gpu.is_some()),
                power: header.is_some_and(|h| h.power.is_some()),
                complete: self.footer.is_some(),
                exit_code: self.footer.as_ref().and_then(|f| f.exit_code),
                lost: self.footer.as_ref().and_then(|f| f.lost_total).map(int),
                lines: int(self.figures.lines),
                skipped_lines: int(self.figures.skipped_lines),
            },
        )
    }
}

fn copy_row(call: &CallLine) -> copies::Row<'_> {
    copies::Row {
        pid: call.pid as i32,
        tid: call.tid as i32,
        ts_ns: int(call.ts_ns),
        dur_ns: call.dur_ns.map(int),
        name: &call.name,
        ok: call.ok(),
        ret: call.ret.map(i64::from),
        ret_name: call.ret_name.as_deref(),
        // As the summary counts copies: the driver picks where no direction is given.
        kind: call.kind.as_deref().unwrap_or("Default"),
        bytes: match (call.bytes, call.pitch, call.height) {
            (Some(bytes), _, _) => Some(int(bytes)),
            (None, Some(pitch), Some(height)) => Some(int(pitch.saturating_mul(height))),
            _ => None,
        },
        src: call.src.map(pointer),
        dst: call.dst.map(pointer),
        stream: call.stream.map(pointer),
        device: call.device,
        count: call.count.map(int),
    }
}

fn memset_row(call: &CallLine) -> memsets::Row<'_> {
    memsets::Row {
        pid: call.pid as i32,
        tid: call.tid as i32,
        ts_ns: int(call.ts_ns),
        dur_ns: call.dur_ns.map(int),
        name: &call.name,
        ok: call.ok(),
        ret: call.ret.map(i64::from),
        ret_name: call.ret_name.as_deref(),
        dptr: call.dptr.map(pointer),
        bytes: call.bytes.map(int),
        value: call.value.map(int),
        stream: call.stream.map(pointer),
        device: call.device,
    }
}
