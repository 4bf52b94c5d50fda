//! `cudatrace run`: attach, start the command, stream events to the trace, and finish
//! cleanly on every exit path.

mod args;

pub use args::RunArgs;

use std::{
    fs::{self, OpenOptions},
    io::{IsTerminal, Write},
    os::{
        fd::{FromRawFd, OwnedFd},
        unix::fs::OpenOptionsExt,
    },
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf,
    maps::{MapData, RingBuf},
};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{SignalKind, signal},
};

use std::collections::HashMap;

use crate::{
    analysis::Analysis,
    catalog::FnSpec,
    events::{self, RawEvent, decode_call},
    exit::{ExitCode, Failure},
    kernel_hooks,
    privileges::{self, TargetUser},
    probes::{
        attach::{self, Attached},
        library::{self, Library},
        maps::{self, CounterReader, Counters},
        object::{self, LoadOptions},
        plan::{MissingProbes, Plans},
        probe_set::LIBCUDA,
        programs, tracefs,
    },
    schema::{
        AttachFailureInfo, FORMAT_VERSION, Header, KernelHooksInfo, LibcudaInfo, LostLine,
        ProbeInfo,
    },
    sinks::jsonl::TraceWriter,
    spawn,
    summary::text::render_short,
};

/// Runs `cudatrace run` and returns the process exit code.
pub fn run(args: RunArgs) -> Result<i32, Failure> {
    privileges::check().map_err(|e| Failure::new(ExitCode::NotPrivileged, e))?;
    if args.command.is_empty() && args.pids.is_empty() && !args.all {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!("nothing to trace: give a command after --, -p PID, or --all"),
        ));
    }
    for pid in &args.pids {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(Failure::new(
                ExitCode::NoSuchProcess,
                anyhow!("no process with pid {pid}"),
            ));
        }
    }
    let lib_path = library::find(&LIBCUDA, args.libcuda.as_deref())
        .map_err(|e| Failure::new(ExitCode::NoLibcuda, e))?;
    let lib =
        Library::open(&LIBCUDA, &lib_path).map_err(|e| Failure::new(ExitCode::NoLibcuda, e))?;
    let mut plans = Plans::default();
    let plan = plans.add(&LIBCUDA, &lib);
    if !plan.missing.is_empty() {
        report_missing(
            args.missing_probes,
            &format!("not exported by {}", plan.set.library),
            &plan.missing,
        )?;
    }
    if plan.probes.is_empty() {
        return Err(Failure::new(
            ExitCode::NoLibcuda,
            anyhow!(
                "{} exports none of the {} cudatrace probes",
                plan.library.path.display(),
                plan.set.functions
            ),
        ));
    }

    let user = if args.as_root {
        None
    } else {
        privileges::sudo_user()
    };
    let program = match args.command.first() {
        Some(program) => {
            let path_var = std::env::var_os("PATH");
            let resolved = spawn::resolve(program, path_var.as_deref()).map_err(|e| {
                let code = match e {
                    spawn::SpawnError::NotExecutable(_) => ExitCode::NotExecutable,
                    _ => ExitCode::CommandNotFound,
                };
                Failure::new(code, e)
            })?;
            Some(resolved)
        }
        None => None,
    };

    let (output, output_label) = open_output(args.output.as_deref(), user.as_ref())
        .map_err(|e| Failure::new(ExitCode::OutputNotWritable, e))?;
    let mut writer = TraceWriter::new(output);
    let started = Instant::now();
    let clocks = Clocks::now();

    // From here on every failure still completes the trace with a footer.
    let mut session = Session {
        args: &args,
        lib: &lib,
        plans: &plans,
        user: user.as_ref(),
        program,
        header_written: false,
        clocks,
        kernel_hooks: None,
        analysis: Analysis::default(),
    };
    let outcome = session.trace(&mut writer);
    let (exit, error) = match outcome {
        Ok(exit) => (exit, None),
        Err(failure) => {
            if !session.header_written {
                let header = session.header(&[], Vec::new());
                let _ = writer.header(&header);
            }
            (Outcome::failed(), Some(failure))
        }
    };
    writer.footer.end_wall = humantime::format_rfc3339_nanos(SystemTime::now()).to_string();
    writer.footer.duration_ns = started.elapsed().as_nanos() as u64;
    writer.footer.exit_code = exit.code;
    writer.footer.exit_signal = exit.signal;
    writer.footer.stopped_by = exit.stopped_by;
    writer.footer.error = error.as_ref().map(|f| format!("{:#}", f.error));
    let analysis = session.analysis.finish();
    writer.footer.memory = Some(analysis.memory_footer());
    let footer = writer.finish().map_err(|e| {
        Failure::new(
            ExitCode::OutputNotWritable,
            anyhow!("writing {output_label}: {e}"),
        )
    })?;
    if let Some(failure) = error {
        return Err(failure);
    }
    let lost = footer.lost.total;
    eprintln!(
        "cudatrace: {} calls, {} lost, {} process events -> {output_label}{}",
        footer.events.call,
        lost,
        footer.events.process,
        exit.describe()
    );
    if lost > 0 {
        eprintln!(
            "cudatrace: WARNING: {lost} events lost (calls: ring full {}, nesting {}, frame \
             table {}; process events {}); try --ring-kib {}",
            footer.lost.ring_full,
            footer.lost.too_deep,
            footer.lost.frames_full,
            footer.lost.process_ring_full,
            args.ring_kib.saturating_mul(4).min(1 << 20)
        );
    }
    if !args.quiet {
        eprint!("{}", render_short(&analysis));
    }
    match (args.export, output_label == "stdout") {
        (Some(_), true) => eprintln!("cudatrace: --export needs a trace file, not -o -"),
        (Some(format), false) => {
            let exported = crate::export::after_run(Path::new(&output_label), format);
            if let (Some(path), Some(user)) = (exported, user.as_ref()) {
                let _ = privileges::chown_to(&path, user);
            }
        }
        (None, _) => {}
    }
    Ok(exit.process_exit_code())
}

fn report_missing(policy: MissingProbes, why: &str, names: &[&str]) -> Result<(), Failure> {
    match policy {
        MissingProbes::Ignore => Ok(()),
        MissingProbes::Warn => {
            eprintln!(
                "cudatrace: {} functions {why}: {}",
                names.len(),
                names.join(", ")
            );
            Ok(())
        }
        MissingProbes::Error => Err(Failure::new(
            ExitCode::ProbesMissing,
            anyhow!(
                "{} functions {why}: {} (--missing-probes warn to go on without them)",
                names.len(),
                names.join(", ")
            ),
        )),
    }
}

/// How the traced work ended.
#[derive(Clone, Copy, Debug, Default)]
struct Outcome {
    code: Option<i32>,
    signal: Option<i32>,
    stopped_by: Option<&'static str>,
}

impl Outcome {
    fn failed() -> Self {
        Outcome::default()
    }

    fn process_exit_code(&self) -> i32 {
        match (self.stopped_by, self.code, self.signal) {
            (Some("SIGINT"), _, _) => 128 + libc::SIGINT,
            (Some("SIGTERM"), _, _) => 128 + libc::SIGTERM,
            (_, Some(code), _) => code,
            (_, None, Some(signal)) => 128 + signal,
            _ => 0,
        }
    }

    fn describe(&self) -> String {
        match (self.stopped_by, self.code, self.signal) {
            (Some(by), _, _) => format!(" (stopped by {by})"),
            (_, Some(code), _) => format!(" (command exited with {code})"),
            (_, None, Some(signal)) => format!(" (command killed by signal {signal})"),
            _ => String::new(),
        }
    }
}

/// The monotonic clock of `ts_ns` and the wall clock, read together.
#[derive(Clone, Copy, Debug)]
struct Clocks {
    wall: SystemTime,
    monotonic_ns: u64,
}

impl Clocks {
    fn now() -> Self {
        let wall = SystemTime::now();
        Clocks {
            wall,
            monotonic_ns: monotonic_ns(),
        }
    }
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn open_output(
    requested: Option<&Path>,
    user: Option<&TargetUser>,
) -> Result<(Box<dyn Write>, String)> {
    if requested == Some(Path::new("-")) {
        return Ok((Box::new(std::io::stdout()), "stdout".into()));
    }
    let path = match requested {
        Some(path) => path.to_owned(),
        None => {
            let dir = PathBuf::from("traces");
            if !dir.is_dir() {
                fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
                if let Some(user) = user {
                    privileges::chown_to(&dir, user)
                        .with_context(|| format!("giving {} to {}", dir.display(), user.name))?;
                }
            }
            dir.join(default_trace_name())
        }
    };
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&path)
        .with_context(|| format!("cannot write the trace to {}", path.display()))?;
    if let Some(user) = user {
        privileges::chown_to(&path, user)
            .with_context(|| format!("giving {} to {}", path.display(), user.name))?;
    }
    Ok((Box::new(file), path.display().to_string()))
}

/// `trace_YYYYMMDD_HHMMSS.jsonl` in local time.
fn default_trace_name() -> String {
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r fills `tm` from `now`.
    unsafe { libc::localtime_r(&now, &mut tm) };
    format!(
        "trace_{:04}{:02}{:02}_{:02}{:02}{:02}.jsonl",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

struct Session<'a> {
    args: &'a RunArgs,
    lib: &'a Library,
    plans: &'a Plans,
    user: Option<&'a TargetUser>,
    program: Option<PathBuf>,
    header_written: bool,
    clocks: Clocks,
    /// `--kernel`: what was chosen and hooked.
    kernel_hooks: Option<KernelHooksInfo>,
    /// Kernel names, live bytes and the summary, from every event as it is written.
    analysis: Analysis,
}

fn uname() -> (String, String) {
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname fills the struct with NUL-terminated fields.
    unsafe { libc::uname(&mut uts) };
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (
        field(&uts.nodename),
        format!("{} {}", field(&uts.sysname), field(&uts.release)),
    )
}

impl Session<'_> {
    fn device_prefix(&self) -> &str {
        self.args
            .kernel_device_prefix
            .as_deref()
            .unwrap_or(kernel_hooks::DEVICE_PREFIX)
    }

    /// `--kernel`: picks kprobes or tracepoints, says which and why, attaches them.
    fn attach_kernel_hooks(&mut self, bpf: &mut Ebpf, pids: &[u32]) -> Result<()> {
        let support = kernel_hooks::KernelSupport::probe(&tracefs::tracefs()?);
        let plan = kernel_hooks::plan(&self.args.kernel_hooks, &support)?;
        let functions = kernel_hooks::attach(bpf, &plan)?;
        for pid in pids {
            kernel_hooks::seed_open_fds(bpf, *pid, self.device_prefix())?;
        }
        if !self.args.quiet {
            let what = match plan.mechanism {
                "kprobe" => format!("kprobes on {}", functions.join(", ")),
                _ => format!(
                    "the ioctl/mmap syscall tracepoints on {}*",
                    self.device_prefix()
                ),
            };
            let xid = if plan.xid {
                " and nvidia:nvidia_dev_xid"
            } else {
                ""
            };
            eprintln!("cudatrace: --kernel: {what}{xid} ({})", plan.reason);
        }
        self.kernel_hooks = Some(KernelHooksInfo {
            mechanism: plan.mechanism.to_owned(),
            reason: plan.reason,
            functions,
            xid: plan.xid,
            device_prefix: self.device_prefix().to_owned(),
        });
        Ok(())
    }

    fn header(&self, pids: &[u32], failures: Vec<AttachFailureInfo>) -> Header {
        let (host, kernel) = uname();
        let mode = if self.args.all {
            "all"
        } else if self.args.command.is_empty() {
            "pid"
        } else {
            "command"
        };
        let failed: std::collections::HashSet<&str> =
            failures.iter().map(|f| f.symbol.as_str()).collect();
        Header {
            format: "cudatrace".into(),
            version: FORMAT_VERSION,
            cudatrace_version: env!("CARGO_PKG_VERSION").into(),
            mode: mode.into(),
            command: self
                .args
                .command
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            pids: pids.to_vec(),
            start_wall: humantime::format_rfc3339_nanos(self.clocks.wall).to_string(),
            start_wall_ns: self
                .clocks
                .wall
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as u64,
            clock: "CLOCK_MONOTONIC".into(),
            start_monotonic_ns: Some(self.clocks.monotonic_ns),
            host,
            kernel,
            libcuda: LibcudaInfo {
                path: self.lib.file.path.display().to_string(),
                version: self.lib.file.version.clone(),
                standin: self.lib.file.standin,
            },
            ring_bytes: self.args.ring_kib * 1024,
            probes: self
                .plans
                .probes()
                .filter(|p| !failed.contains(p.symbol.as_str()))
                .map(|p| ProbeInfo {
                    id: p.id,
                    symbol: p.symbol.clone(),
                    function: p.spec.name().into(),
                    family: p.spec.family.as_str().into(),
                })
                .collect(),
            missing_functions: self
                .plans
                .iter()
                .flat_map(|plan| &plan.missing)
                .map(|f| f.to_string())
                .collect(),
            aliases: self
                .plans
                .iter()
                .flat_map(|plan| plan.aliases.iter().cloned())
                .collect(),
            attach_failures: failures,
            kernel_hooks: self.kernel_hooks.clone(),
            ..Header::default()
        }
    }

    fn trace(&mut self, writer: &mut TraceWriter) -> Result<Outcome, Failure> {
        let internal = |e: anyhow::Error| Failure::new(ExitCode::Internal, e);
        let mut bpf = object::load(&LoadOptions {
            trace_all: self.args.all,
            ring_bytes: self.args.ring_kib * 1024,
            device_prefix: self.device_prefix().to_owned(),
        })
        .map_err(internal)?;
        let mut attached = Attached::default();
        let attach_result = attach::attach(&mut bpf, self.plans, &mut attached);
        let failures = match attach_result {
            Ok(failures) => failures,
            Err(e) => {
                attach::detach_all(&mut bpf, &mut attached);
                return Err(internal(e));
            }
        };
        if !failures.is_empty() {
            let names: Vec<&str> = failures.iter().map(|f| f.symbol.as_str()).collect();
            report_missing(self.args.missing_probes, "failed to attach", &names)?;
            if failures.len() == self.plans.probe_count() {
                return Err(internal(anyhow!(
                    "no probe could be attached to {}: {}",
                    self.lib.file.path.display(),
                    failures[0].error
                )));
            }
        }
        programs::attach_process_tracking(&mut bpf).map_err(internal)?;
        let mut pids = self.args.pids.clone();
        for pid in &pids {
            maps::trace_pid(&mut bpf, *pid).map_err(internal)?;
        }
        if self.args.kernel {
            self.attach_kernel_hooks(&mut bpf, &pids)
                .map_err(internal)?;
        }

        // Fork before any thread exists; the child waits at the gate.
        let gated = match &self.program {
            Some(path) => {
                let env = privileges::command_env(self.user);
                let redirect = self.args.output.as_deref() == Some(Path::new("-"));
                Some(
                    spawn::spawn_gated(path, &self.args.command, &env, self.user, redirect)
                        .map_err(internal_spawn)?,
                )
            }
            None => None,
        };
        if let Some(gated) = &gated {
            pids.insert(0, gated.pid);
            if let Err(e) = maps::trace_pid(&mut bpf, gated.pid) {
                return Err(internal(e));
            }
        }
        // Signals and the exit watch are set up before the header: from the moment the
        // trace file says tracing started, SIGINT/SIGTERM must end in a footer, and a
        // `-p` target that exits right away must not be missed.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| internal(e.into()))?;
        let watched = gated
            .as_ref()
            .map(|g| g.pid)
            .or_else(|| self.args.pids.first().copied());
        let watch_setup = {
            let _context = runtime.enter();
            Watches::new(watched)
        };
        let watches = watch_setup.map_err(internal)?;
        let failure_info = failures
            .into_iter()
            .map(|f| AttachFailureInfo {
                symbol: f.symbol,
                error: f.error,
            })
            .collect();
        writer
            .header(&self.header(&pids, failure_info))
            .map_err(|e| {
                Failure::new(
                    ExitCode::OutputNotWritable,
                    anyhow!("writing the trace header: {e}"),
                )
            })?;
        self.header_written = true;

        let child = match gated {
            Some(gated) => Some(gated.release().map_err(internal_spawn)?),
            None => None,
        };
        if !self.args.quiet {
            eprintln!(
                "cudatrace: {} probes ({}) on {}; tracing {}",
                self.plans.probe_count(),
                attached.mechanism(),
                self.lib.file.describe(),
                describe_targets(self.args, &pids)
            );
        }
        // Names of kprobed kernel functions by address; only those, and only with kprobes
        // (all of /proc/kallsyms costs about 24 MB of heap).
        let kernel_functions = match &self.kernel_hooks {
            Some(hooks) if hooks.mechanism == "kprobe" => kernel_hooks::kallsyms()
                .map_err(internal)?
                .into_iter()
                .filter(|(name, _)| {
                    hooks.functions.contains(name)
                        || kernel_hooks::INTERRUPT_FUNCTIONS.contains(&name.as_str())
                })
                .map(|(name, address)| (address, name))
                .collect(),
            _ => HashMap::new(),
        };
        let loop_result = runtime.block_on(event_loop(
            &mut bpf,
            &mut attached,
            writer,
            EventSink {
                plans: self.plans,
                undecodable: 0,
                kernel_functions,
                analysis: &mut self.analysis,
            },
            watches,
            child,
            self.args.quiet,
        ));
        loop_result.map_err(internal)
    }
}

fn internal_spawn(e: spawn::SpawnError) -> Failure {
    let code = match &e {
        spawn::SpawnError::Exec { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
            ExitCode::CommandNotFound
        }
        spawn::SpawnError::Exec { .. } => ExitCode::NotExecutable,
        _ => ExitCode::Internal,
    };
    Failure::new(code, e)
}

fn describe_targets(args: &RunArgs, pids: &[u32]) -> String {
    if args.all {
        return "every process using libcuda".into();
    }
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!("pid {} and its children", list.join(", "))
}

/// A pidfd: readable once the process exits (works for non-children too).
fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Turns ring records into trace lines.
struct EventSink<'a> {
    plans: &'a Plans,
    undecodable: u64,
    /// Kernel function names by address, for kprobe events.
    kernel_functions: HashMap<u64, String>,
    analysis: &'a mut Analysis,
}

impl EventSink<'_> {
    fn handle(&mut self, bytes: &[u8], writer: &mut TraceWriter) -> std::io::Result<()> {
        match events::decode(bytes) {
            Ok(RawEvent::Call { call, data }) => {
                let Some(probe) = self.plans.probe(call.probe_id) else {
                    self.undecodable += 1;
                    return Ok(());
                };
                let spec: &FnSpec = probe.spec;
                let mut record = decode_call(&call, data.as_deref(), &probe.symbol, spec);
                // Kernel names and live bytes go into the line itself.
                self.analysis.observe(&mut record);
                writer.write(&record)
            }
            Ok(RawEvent::Driver(event)) => {
                let record = events::decode_driver(&event, &self.kernel_functions);
                self.analysis.driver(&record);
                writer.write(&record)
            }
            Ok(RawEvent::Proc(event)) => {
                let line = events::decode_process(&event);
                self.analysis.process_event(line.pid, &line.event);
                writer.write(&line)
            }
            Err(_) => {
                self.undecodable += 1;
                Ok(())
            }
        }
    }
}

/// Writes a `lost` line for each counter that grew since `last`.
fn report_loss(
    writer: &mut TraceWriter,
    last: &mut Counters,
    now: Counters,
) -> std::io::Result<()> {
    let ts_ns = monotonic_ns();
    for (reason, before, after) in [
        ("ring_full", last.ring_full, now.ring_full),
        ("too_deep", last.too_deep, now.too_deep),
        ("frames_full", last.frames_full, now.frames_full),
        (
            "process_ring_full",
            last.process_ring_full,
            now.process_ring_full,
        ),
        (
            "driver_ring_full",
            last.driver_ring_full,
            now.driver_ring_full,
        ),
    ] {
        if after > before {
            writer.write(&LostLine {
                ts_ns,
                reason: reason.into(),
                count: after - before,
                total: now.lost(),
                ..LostLine::default()
            })?;
        }
    }
    writer.footer.lost.ring_full = now.ring_full;
    writer.footer.lost.too_deep = now.too_deep;
    writer.footer.lost.frames_full = now.frames_full;
    writer.footer.lost.process_ring_full = now.process_ring_full;
    writer.footer.lost.driver_ring_full = now.driver_ring_full;
    writer.footer.lost.calls = now.calls_lost();
    writer.footer.lost.total = now.lost();
    writer.footer.entries_seen = now.entries;
    writer.footer.unmatched_returns = now.unmatched_returns;
    *last = now;
    Ok(())
}

fn drain(
    ring: &mut RingBuf<MapData>,
    sink: &mut EventSink<'_>,
    writer: &mut TraceWriter,
    budget: usize,
) -> std::io::Result<usize> {
    let mut n = 0;
    while n < budget {
        let Some(item) = ring.next() else { break };
        sink.handle(&item, writer)?;
        n += 1;
    }
    Ok(n)
}

/// SIGINT/SIGTERM streams and the watched process's exit, registered up front.
struct Watches {
    sigint: tokio::signal::unix::Signal,
    sigterm: tokio::signal::unix::Signal,
    /// Readable once the watched process exits.
    exit_fd: Option<AsyncFd<OwnedFd>>,
    /// The watched process had already exited when the watch was set up.
    already_exited: bool,
}

impl Watches {
    /// Must run inside the runtime's context.
    fn new(watched: Option<u32>) -> Result<Self> {
        let sigint = signal(SignalKind::interrupt())?;
        let sigterm = signal(SignalKind::terminate())?;
        let (exit_fd, already_exited) = match watched.map(pidfd_open) {
            Some(Ok(fd)) => (Some(watch(fd, "the pidfd")?), false),
            Some(Err(error)) if error.raw_os_error() == Some(libc::ESRCH) => (None, true),
            Some(Err(error)) => return Err(anyhow::Error::from(error).context("pidfd_open")),
            None => (None, false),
        };
        Ok(Watches {
            sigint,
            sigterm,
            exit_fd,
            already_exited,
        })
    }
}

async fn event_loop(
    bpf: &mut Ebpf,
    attached: &mut Attached,
    writer: &mut TraceWriter,
    mut sink: EventSink<'_>,
    watches: Watches,
    child: Option<u32>,
    quiet: bool,
) -> Result<Outcome> {
    let mut ring = watch(maps::take_ring(bpf)?, "the ring buffer")?;
    let counters = CounterReader::take(bpf)?;
    let Watches {
        mut sigint,
        mut sigterm,
        exit_fd,
        already_exited,
    } = watches;
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    let mut last = Counters::default();
    let mut progress = Progress::new(quiet);
    let mut outcome = Outcome::default();

    // A `-p` target that was gone before the watch started: nothing more will come.
    let mut running = !already_exited;
    while running {
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard?;
                let n = drain(guard.get_inner_mut(), &mut sink, writer, 65536)?;
                if n < 65536 {
                    // Drained: wait for the next wakeup (the fd is edge-triggered).
                    guard.clear_ready();
                }
            }
            _ = async { exit_fd.as_ref().unwrap().readable().await }, if exit_fd.is_some() => {
                if let Some(pid) = child {
                    let (code, signal) = reap(pid);
                    outcome.code = code;
                    outcome.signal = signal;
                }
                running = false;
            }
            _ = sigint.recv() => {
                outcome.stopped_by = Some("SIGINT");
                running = false;
            }
            _ = sigterm.recv() => {
                outcome.stopped_by = Some("SIGTERM");
                if let Some(pid) = child {
                    // SAFETY: kill(2) on our own child.
                    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                }
                running = false;
            }
            _ = ticker.tick() => {
                // Records below the wakeup threshold raise no readiness: collect them here.
                drain(ring.get_mut(), &mut sink, writer, usize::MAX)?;
                report_loss(writer, &mut last, counters.read()?)?;
                progress.update(writer.footer.events.call, last.lost());
                // A live trace can be followed (`tail -f`) a quarter second behind.
                writer.flush()?;
            }
        }
    }

    // Detach first so nothing new arrives, then drain what the ring still holds.
    attach::detach_all(bpf, attached);
    let ring = ring.get_mut();
    while drain(ring, &mut sink, writer, usize::MAX)? > 0 {}
    report_loss(writer, &mut last, counters.read()?)?;
    writer.footer.undecodable = sink.undecodable;
    progress.finish();
    writer.flush()?;
    Ok(outcome)
}

/// Registers `inner` with the reactor for readability.
fn watch<T: std::os::fd::AsRawFd>(inner: T, what: &str) -> Result<AsyncFd<T>> {
    // SAFETY: the AsyncFd owns `inner`, so the fd stays open while it is registered.
    unsafe { AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE) }
        .map_err(|_| anyhow!("cannot poll {what}"))
}

/// Reaps the child: (exit code, killing signal).
fn reap(pid: u32) -> (Option<i32>, Option<i32>) {
    let mut status = 0;
    // SAFETY: waitpid on our own child.
    let rc = unsafe { libc::waitpid(pid as i32, &mut status, 0) };
    if rc != pid as i32 {
        return (None, None);
    }
    if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (None, None)
    }
}

/// Live progress on stderr: rewritten in place on a terminal, a line every 10 s otherwise.
struct Progress {
    enabled: bool,
    tty: bool,
    started: Instant,
    last_print: Instant,
    last_calls: u64,
    printed: bool,
}

impl Progress {
    fn new(quiet: bool) -> Self {
        let now = Instant::now();
        Progress {
            enabled: !quiet,
            tty: std::io::stderr().is_terminal(),
            started: now,
            last_print: now,
            last_calls: 0,
            printed: false,
        }
    }

    fn update(&mut self, calls: u64, lost: u64) {
        let every = if self.tty {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(10)
        };
        if !self.enabled || self.last_print.elapsed() < every {
            return;
        }
        let rate = (calls - self.last_calls) as f64 / self.last_print.elapsed().as_secs_f64();
        let line = format!(
            "cudatrace: {:.0}s, {calls} calls, {rate:.0}/s, {lost} lost",
            self.started.elapsed().as_secs_f64()
        );
        if self.tty {
            eprint!("\r\x1b[K{line}");
        } else {
            eprintln!("{line}");
        }
        self.printed = true;
        self.last_print = Instant::now();
        self.last_calls = calls;
    }

    fn finish(&mut self) {
        if self.enabled && self.tty && self.printed {
            eprint!("\r\x1b[K");
        }
    }
}
