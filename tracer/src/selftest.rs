//! `cudatrace selftest`: proves uprobes, uretprobes, the ring buffer and aya-log work on
//! this machine, by probing a function of a given library while a command calls it.
//! Prints one JSON object with every entry, return and log line seen. `doctor` uses the
//! same [`SelftestProbe`] on a function of this binary.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::RingBuf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use aya_log::EbpfLogger;
use clap::Args;
use serde_json::json;
use tracer_common::{SelftestEvent, kind};

use crate::{
    exit::{ExitCode, Failure},
    probes::programs::program,
};

pub static SELFTEST_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("CUDATRACE_SELFTEST_OBJ"));

#[derive(Debug, Args)]
pub struct SelftestArgs {
    /// Library (or executable) holding the function to probe.
    #[arg(long, value_name = "PATH")]
    pub library: PathBuf,
    /// Function to probe; its first two integer arguments and return value are recorded.
    #[arg(long, value_name = "SYMBOL")]
    pub symbol: String,
    /// Command that calls the function.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Collects aya-log records.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<String>>>);

impl log::Log for Collector {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push(record.args().to_string());
    }
    fn flush(&self) {}
}

/// What the self-test programs saw.
pub struct Seen {
    pub entries: Vec<SelftestEvent>,
    pub returns: Vec<SelftestEvent>,
    pub logs: Vec<String>,
}

/// The function to probe: by name, or by its file offset (no symbol table needed).
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    Symbol(&'a str),
    Offset(u64),
}

impl std::fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Symbol(symbol) => f.write_str(symbol),
            Target::Offset(offset) => write!(f, "file offset {offset:#x}"),
        }
    }
}

/// The self-test uprobe and uretprobe attached to one function, with aya-log running.
pub struct SelftestProbe {
    bpf: Ebpf,
    logger: EbpfLogger<Collector>,
    collector: Collector,
}

impl SelftestProbe {
    /// Attaches to `target` in `library`.
    pub fn attach(library: &Path, target: Target<'_>, scope: UProbeScope) -> Result<Self> {
        let mut bpf = EbpfLoader::new()
            .load(SELFTEST_OBJECT)
            .context("loading the selftest object")?;
        let collector = Collector::default();
        let logger = EbpfLogger::init_with_logger(&mut bpf, collector.clone())
            .context("starting aya-log")?;
        for name in ["selftest_return", "selftest_enter"] {
            let program: &mut UProbe = program(&mut bpf, name)?;
            program.load().with_context(|| format!("loading {name}"))?;
            let location = match target {
                Target::Symbol(symbol) => UProbeAttachLocation::Symbol(symbol),
                Target::Offset(offset) => UProbeAttachLocation::AbsoluteOffset(offset),
            };
            let point = UProbeAttachPoint {
                location,
                cookie: None,
            };
            program.attach(point, library, scope).with_context(|| {
                format!("attaching {name} to {target} in {}", library.display())
            })?;
        }
        Ok(SelftestProbe {
            bpf,
            logger,
            collector,
        })
    }

    /// Drains the events and log lines recorded so far.
    pub fn collect(mut self) -> Result<Seen> {
        let map = self
            .bpf
            .take_map("SELFTEST_EVENTS")
            .ok_or_else(|| anyhow!("map missing"))?;
        let mut ring = RingBuf::try_from(map)?;
        let mut seen = Seen {
            entries: Vec::new(),
            returns: Vec::new(),
            logs: Vec::new(),
        };
        while let Some(item) = ring.next() {
            if item.len() < size_of::<SelftestEvent>() {
                continue;
            }
            // SAFETY: length checked; SelftestEvent is plain data.
            let event: SelftestEvent =
                unsafe { item.as_ptr().cast::<SelftestEvent>().read_unaligned() };
            match event.header.kind {
                kind::SELFTEST_ENTRY => seen.entries.push(event),
                kind::SELFTEST_RETURN => seen.returns.push(event),
                _ => {}
            }
        }
        self.logger.flush();
        seen.logs = self.collector.0.lock().unwrap().clone();
        Ok(seen)
    }
}

pub fn run(args: SelftestArgs) -> Result<i32, Failure> {
    crate::privileges::check().map_err(|e| Failure::new(ExitCode::NotPrivileged, e))?;
    let internal = |e: anyhow::Error| Failure::new(ExitCode::Internal, e);
    let probe = SelftestProbe::attach(
        &args.library,
        Target::Symbol(&args.symbol),
        UProbeScope::AllProcesses,
    )
    .map_err(internal)?;
    let status = Command::new(&args.command[0])
        .args(&args.command[1..])
        .status()
        .with_context(|| format!("running {}", args.command[0]))
        .map_err(|e| Failure::new(ExitCode::CommandNotFound, e))?;
    let seen = probe.collect().map_err(internal)?;
    let entries: Vec<_> = seen
        .entries
        .iter()
        .map(|e| json!({"pid": e.header.pid, "arg0": e.arg0, "arg1": e.arg1}))
        .collect();
    let returns: Vec<_> = seen
        .returns
        .iter()
        .map(|e| json!({"pid": e.header.pid, "ret": e.ret}))
        .collect();
    println!(
        "{}",
        json!({"entries": entries, "returns": returns, "logs": seen.logs, "exit_code": status.code()})
    );
    Ok(0)
}
