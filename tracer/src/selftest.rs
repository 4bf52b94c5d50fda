//! `cudatrace selftest`: proves uprobes, uretprobes, the ring buffer and aya-log work on
//! this machine, by probing a function of a given library while a command calls it.
//! Prints one JSON object with every entry, return and log line seen.

use std::{
    path::PathBuf,
    process::Command,
    sync::{Arc, Mutex},
};

use anyhow::{Context, anyhow};
use aya::{
    EbpfLoader,
    maps::RingBuf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeScope},
    },
};
use aya_log::EbpfLogger;
use clap::Args;
use serde_json::json;
use tracer_common::{SelftestEvent, kind};

use crate::exit::{ExitCode, Failure};

static SELFTEST_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("CUDATRACE_SELFTEST_OBJ"));

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
        self.0.lock().unwrap().push(format!("{}", record.args()));
    }
    fn flush(&self) {}
}

pub fn run(args: SelftestArgs) -> Result<i32, Failure> {
    crate::privileges::check().map_err(|e| Failure::new(ExitCode::NotPrivileged, e))?;
    let internal = |e: anyhow::Error| Failure::new(ExitCode::Internal, e);
    let mut bpf = EbpfLoader::new()
        .load(SELFTEST_OBJECT)
        .context("loading the selftest object")
        .map_err(internal)?;
    let collector = Collector::default();
    let mut logger = EbpfLogger::init_with_logger(&mut bpf, collector.clone())
        .context("starting aya-log")
        .map_err(internal)?;
    for name in ["selftest_return", "selftest_enter"] {
        let program: &mut UProbe = bpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("program {name} missing"))
            .and_then(|p| p.try_into().map_err(anyhow::Error::from))
            .map_err(internal)?;
        program
            .load()
            .with_context(|| format!("loading {name}"))
            .map_err(internal)?;
        program
            .attach(
                UProbeAttachLocation::Symbol(&args.symbol),
                &args.library,
                UProbeScope::AllProcesses,
            )
            .with_context(|| {
                format!(
                    "attaching {name} to {} in {}",
                    args.symbol,
                    args.library.display()
                )
            })
            .map_err(internal)?;
    }
    let status = Command::new(&args.command[0])
        .args(&args.command[1..])
        .status()
        .with_context(|| format!("running {}", args.command[0]))
        .map_err(|e| Failure::new(ExitCode::CommandNotFound, e))?;
    let mut ring = RingBuf::try_from(
        bpf.take_map("SELFTEST_EVENTS")
            .ok_or_else(|| internal(anyhow!("map missing")))?,
    )
    .map_err(|e| internal(e.into()))?;
    let (mut entries, mut returns) = (Vec::new(), Vec::new());
    while let Some(item) = ring.next() {
        if item.len() < size_of::<SelftestEvent>() {
            continue;
        }
        // SAFETY: length checked; SelftestEvent is plain data.
        let event: SelftestEvent =
            unsafe { item.as_ptr().cast::<SelftestEvent>().read_unaligned() };
        match event.header.kind {
            kind::SELFTEST_ENTRY => entries
                .push(json!({"pid": event.header.pid, "arg0": event.arg0, "arg1": event.arg1})),
            kind::SELFTEST_RETURN => {
                returns.push(json!({"pid": event.header.pid, "ret": event.ret}))
            }
            _ => {}
        }
    }
    logger.flush();
    let logs = collector.0.lock().unwrap().clone();
    println!(
        "{}",
        json!({"entries": entries, "returns": returns, "logs": logs, "exit_code": status.code()})
    );
    Ok(0)
}
