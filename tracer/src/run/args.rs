//! `cudatrace run`'s flags.

use std::{
    ffi::OsString,
    num::NonZeroU32,
    path::PathBuf,
    time::{Duration, UNIX_EPOCH},
};

use clap::Args;

use crate::{
    export::ExportFormat,
    kernel_hooks::HookChoice,
    probes::{
        maps::SIZED_MAPS,
        plan::{FunctionSelection, MissingProbes},
        stack_selection::StackSelection,
    },
};

#[derive(Debug, Args)]
#[command(after_help = "\
The command starts suspended: probes are attached before its first instruction, so cuInit
is seen. Its children (fork, exec, Python multiprocessing, torchrun workers) are traced
too; other processes are not, unless --all is given.

Libraries are found where the traced processes load them: a file named like libcuda
(libcuda.so, libcuda.so.*) that a traced process opens, from any path (a wheel, a
container's forward-compatibility libcuda), is attached before the process goes on (it
is stopped with SIGSTOP for the moment that takes, then continued with SIGCONT). Each
distinct file is attached once; call lines say which (`lib`). With uprobe_multi (Linux
6.6+), probes go into the traced processes only: other processes pay nothing. --all, or
an older kernel, probes every process that maps the library.

Under sudo the command runs as the invoking user (SUDO_UID/SUDO_GID, with their groups)
and the trace file belongs to them; --as-root keeps root.

When the command exits (with -p: when the last of the processes exits), cudatrace
detaches, drains the ring buffer, writes the footer and exits with the command's exit
code. SIGINT (Ctrl-C), SIGTERM, SIGHUP and SIGQUIT stop tracing at once and end with a
footer within a second, exiting 130, 143, 129 and 131; SIGTERM and SIGHUP are passed on to
the command (the terminal sends Ctrl-C and Ctrl-\\ to it already). Records the ring still
holds half a second after such a signal are counted as lost (not_drained), not written.

--functions all probes every exported cu* function: the catalog's with their arguments
decoded, the others with name, times, return code and their six register arguments
(`args`). NVIDIA's 580 driver exports 682 cu* functions, and PyTorch calls the cheap
queries among them (cuCtxGetDevice, cuDevicePrimaryCtxGetState, ...) about ten times as
often as everything else: each probed call costs about 2 us (a uprobe and a uretprobe).

--gpu also records what the GPU ran: gpu_kernel, gpu_copy and gpu_memset lines with GPU
start and duration, each linked to the call that issued it (docs/gpu.md); launches are
then probed at entry only (CUPTI's record gives their result and duration), and every
launch, copy and memset is accounted for: GPU work, or a counted reason. Without --gpu
nothing is put into the command: no library, no environment variable. A
CUDA_INJECTION64_PATH already set (another tool's library) is started after cudatrace's.

With -p PID, --gpu attaches to a running process: one of its threads, stopped for about
a hundred microseconds at a safe point, loads the library through the program's own
dlopen; at the window's end (--duration, Ctrl-C, SIGTERM) the library flushes, switches
CUPTI off and stops its thread, and the program runs on. `cudatrace doctor -p PID` says
beforehand whether this can work.

Exit codes of --gpu: 80 no libcupti found (before the command starts), 81
CUDA_INJECTION64_PATH is cudatrace's own (a run --gpu inside another), 82 GPU recording failed in a process
(CUPTI refused; only when the command itself exited 0), 83 cannot attach to the -p process
(untouched); --all with --gpu is a usage error (2).")]
pub struct RunArgs {
    /// Attach to a running process (and the children it starts from now on). Repeatable.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Trace every process that calls libcuda, not only the command's tree.
    #[arg(long)]
    pub all: bool,

    /// Where to write the trace; `-` for standard output (the command's stdout then goes
    /// to stderr). Default: traces/trace_YYYYMMDD_HHMMSS.jsonl. Patterns name one file per
    /// node and rank: %h the host name, %r the launcher's rank (RANK, SLURM_PROCID,
    /// OMPI_COMM_WORLD_RANK or PMI_RANK, the first set; none set is an error, exit 2), %p
    /// cudatrace's own pid, %t its start time (UTC, 20261126T120501Z), %% a %. Under sudo it is written
    /// as the invoking user, never through a symbolic link, over a non-regular file, over
    /// an input of the run or over a file another cudatrace writes (exit 73).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// A libcuda to probe from the start, instead of the one the default search finds
    /// (the ldconfig cache, LD_LIBRARY_PATH, then /usr/local/nvidia/lib64,
    /// /usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/lib/wsl/lib). Libraries the traced
    /// processes load are attached too, wherever they come from.
    #[arg(long, value_name = "PATH")]
    pub libcuda: Option<PathBuf>,

    /// Also probe this library file from the start (repeatable): any library cudatrace
    /// knows (libcuda), recognised by its name, soname or exports, whatever it is called.
    #[arg(long = "lib", value_name = "PATH")]
    pub libs: Vec<PathBuf>,

    /// What to do when a catalog function is not exported by libcuda or fails to attach,
    /// or a --functions pattern matches nothing.
    #[arg(long, value_enum, default_value = "warn", value_name = "POLICY")]
    pub missing_probes: MissingProbes,

    /// Which libcuda functions to probe: `catalog` (the functions cudatrace decodes), `all`
    /// (the catalog and every other exported cu* function), or glob patterns
    /// (`cuCtxGet*`, `cuDevice?etAttribute`), comma-separated and mixed with `catalog`.
    /// Functions outside the catalog are recorded generically: name, pid, tid, ts_ns,
    /// dur_ns, ret and the six register arguments as `args`.
    #[arg(
        long,
        default_value = "catalog",
        value_name = "SELECTION",
        value_parser = FunctionSelection::parse
    )]
    pub functions: FunctionSelection,

    /// Probe the launches at entry only, without a return probe: cuLaunchKernel,
    /// cuLaunchKernelEx, cuLaunchCooperativeKernel, cuGraphLaunch and their _ptsz forms.
    /// Their call lines then have no `ret` and no `dur_ns`: a failed launch is recorded
    /// (and counted) as a launch, and the summary and export give no launch durations.
    /// Arguments, grid, block, shared memory, stream and kernel names are kept, and other
    /// functions keep their return probes. It saves the return trap and its program on
    /// every launch: use it for launch-heavy programs, where cudatrace's added latency per
    /// launch matters more than how long each launch call took (BENCHMARKS.md). --gpu
    /// probes launches this way, and gives each launch line its result and duration from
    /// CUPTI's record of the call.
    #[arg(long)]
    pub launch_entry_only: bool,

    /// Run the command as root even under sudo.
    #[arg(long)]
    pub as_root: bool,

    /// No progress on stderr (errors and the final line still print).
    #[arg(short, long)]
    pub quiet: bool,

    /// Ring buffer size in KiB (a power of two, at least 8). Larger rides out bursts.
    #[arg(long, default_value_t = 16384, value_name = "KIB", value_parser = parse_ring_kib)]
    pub ring_kib: u32,

    /// Also record what the NVIDIA kernel module does for the traced processes: ioctls
    /// (escape code, RM control command or class), mmaps of /dev/nvidia*, Xid errors.
    #[arg(long)]
    pub kernel: bool,

    /// How --kernel hooks the driver: `auto` (kprobes where the kernel has them and the
    /// module is loaded, else the syscall tracepoints), `tracepoint`, `kprobe`, or a
    /// comma-separated list of kernel functions to kprobe (old names such as nvidia_ioctl
    /// are accepted as aliases of their replacements).
    #[arg(long, default_value = "auto", value_name = "HOW")]
    pub kernel_hooks: HookChoice,

    /// Path prefix of NVIDIA device files (tests point it at stand-in files).
    #[arg(long, hide = true, value_name = "PREFIX")]
    pub kernel_device_prefix: Option<String>,

    /// Also sample every GPU's power, energy counter, clocks, utilisation, temperature and
    /// memory through NVML every MS milliseconds (default 20, 1 to 60000), as `power`
    /// lines; `summary` then gives energy per GPU, stage and kernel. Write `--power=MS`.
    #[arg(
        long,
        value_name = "MS",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "20",
        value_parser = crate::power::parse_period
    )]
    pub power: Option<u32>,

    /// The NVML library for --power. Default: the loader's search for libnvidia-ml.so.1
    /// (LD_LIBRARY_PATH, the ldconfig cache), then /usr/local/nvidia/lib64,
    /// /usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/lib, /usr/lib/wsl/lib; never a file
    /// in a `stubs` directory.
    #[arg(long, value_name = "PATH", requires = "power")]
    pub nvml: Option<PathBuf>,

    /// Also record what the GPU ran: every kernel, copy and memset, with its GPU start and
    /// duration, linked to the call that issued it. This injects a library into the
    /// command (CUDA_INJECTION64_PATH, NVIDIA's documented hook: libcuda loads it at
    /// cuInit), which runs NVIDIA's CUPTI activity API there; nothing is injected without
    /// --gpu. Cost: CUPTI's own, in the program (per launch, plus a flush every 200 ms),
    /// and one more trace line per kernel, copy and memset. With -p PID (not --all) it
    /// attaches to the running process instead, for the window. Needs a libcupti (see
    /// --cupti; with -p, the process's own when it has one loaded).
    #[arg(long)]
    pub gpu: bool,

    /// The libcupti for --gpu. Default: the one of the Python the command runs (the
    /// NVIDIA wheels in its site-packages: nvidia/cu13/lib, nvidia/cuda_cupti/lib), then the
    /// CUDA toolkit (/usr/local/cuda*/extras/CUPTI/lib64, /usr/local/cuda*/targets/*/lib),
    /// then the loader's search (ldconfig cache, LD_LIBRARY_PATH).
    #[arg(long, value_name = "PATH", requires = "gpu")]
    pub cupti: Option<PathBuf>,

    /// Entries of one of the eBPF hash maps (TRACED, FRAMES, NV_FDS, PENDING_OPEN, SYSCALLS,
    /// KFUNCS, OPENING, PENDING_CHILD), replacing its size; repeatable. Tests shrink them to
    /// prove that a full map is counted in `lost`, never silent.
    #[arg(long, hide = true, value_name = "MAP=N", value_parser = parse_map_entries)]
    pub map_entries: Vec<(String, u32)>,

    /// Also record, for each call of the chosen families, the Python stack of the thread
    /// that made it (file, qualified name and line of each frame), read by the probes from
    /// CPython 3.10 to 3.14 itself: nothing is injected. WHICH: `launch`, `alloc`, `copy`,
    /// `memset`, `sync`, `module`, `collective` (comma-separated), or `all` (every probed
    /// call); `--stacks` alone takes all but `all`. Write `--stacks=WHICH`.
    #[arg(
        long,
        value_name = "WHICH",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "default",
        value_parser = StackSelection::parse
    )]
    pub stacks: Option<StackSelection>,

    /// The frame budget of --stacks (1 to 256): a deeper stack keeps its innermost N
    /// frames and is marked `cut`.
    #[arg(
        long,
        value_name = "N",
        default_value_t = tracer_common::stacks::DEFAULT_STACK_DEPTH,
        value_parser = parse_stack_depth,
        requires = "stacks"
    )]
    pub stack_depth: u32,

    /// Sample --stacks: a stacked call walks its thread's Python stack with a chance of 1 in
    /// N, drawn at random at each call (1 to 1000000, default 1: every call). The others
    /// have no `stack`, counted in the footer as `sampled_out`; `summary` and `flame` scale
    /// the sampled calls' figures by N.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = parse_stack_every,
        requires = "stacks"
    )]
    pub stack_every: u32,

    /// Limit --stacks in time instead: at most HZ stacked calls a second per thread (1 to
    /// 1000000), for programs whose call rate is not known beforehand (a server). Each
    /// thread has HZ to spend at once, refilled at HZ a second: a burst gets its first HZ
    /// calls' stacks, a steady stream one each 1/HZ second. The others have no `stack`,
    /// counted in the footer as `rate_limited`; the rows of `summary` and `flame` are the
    /// stacked calls' own figures, not estimates (which calls were left out depends on
    /// timing, not chance). Not with --stack-every.
    #[arg(
        long,
        value_name = "HZ",
        value_parser = parse_stack_rate,
        requires = "stacks",
        conflicts_with = "stack_every"
    )]
    pub stack_rate: Option<NonZeroU32>,

    /// Also export the trace when tracing ends, beside it: TRACE.json (`chrome`),
    /// TRACE.pftrace (`perfetto`) or the folder TRACE.parquet (`parquet`); see `cudatrace
    /// export`. Not with `-o -`.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub export: Option<ExportFormat>,

    /// Record from this wall-clock time on (RFC 3339, 2026-11-26T12:00:00Z or with an
    /// offset, or Unix seconds): give every node the same time and each records the same
    /// window (to NTP's agreement of their clocks). The probes are attached, and the
    /// command started, at once: the calls before the window are analysed (kernel names,
    /// NCCL communicators and ranks) but not written. The header says the window.
    #[arg(long, value_name = "TIME", value_parser = parse_start_at)]
    pub start_at: Option<u64>,

    /// Record for this long (30s, 500ms, 2m; from --start-at, else from now, or with -p PID
    /// or --all from when the probes are attached), then stop: detach and write the footer.
    /// A command runs on; cudatrace waits for it (passing SIGTERM and SIGHUP on) and exits
    /// with its exit code.
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// The command to run, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

impl RunArgs {
    /// What to probe in each library found, and how: `--functions` and
    /// `--launch-entry-only` (which `--gpu` implies: CUPTI's record of each launch gives its
    /// result and duration).
    pub fn selection(&self) -> FunctionSelection {
        FunctionSelection {
            launch_entry_only: self.launch_entry_only || self.gpu,
            stacks: self.stacks,
            ..self.functions.clone()
        }
    }
}

fn parse_stack_depth(text: &str) -> Result<u32, String> {
    let depth: u32 = text.parse().map_err(|e| format!("{e}"))?;
    let most = tracer_common::stacks::MAX_STACK_FRAMES as u32;
    if depth == 0 || depth > most {
        return Err(format!("must be 1 to {most}"));
    }
    Ok(depth)
}

fn parse_stack_every(text: &str) -> Result<u32, String> {
    let every: u32 = text.parse().map_err(|e| format!("{e}"))?;
    let most = tracer_common::stacks::MAX_STACK_EVERY;
    if every == 0 || every > most {
        return Err(format!("must be 1 to {most}"));
    }
    Ok(every)
}

/// Non-zero by its type: the probes read 0 as no limit.
fn parse_stack_rate(text: &str) -> Result<NonZeroU32, String> {
    let rate: u32 = text.parse().map_err(|e| format!("{e}"))?;
    let most = tracer_common::stacks::MAX_STACK_RATE;
    match NonZeroU32::new(rate) {
        Some(rate) if rate.get() <= most => Ok(rate),
        _ => Err(format!("must be 1 to {most}")),
    }
}

fn parse_ring_kib(text: &str) -> Result<u32, String> {
    let kib: u32 = text.parse().map_err(|e| format!("{e}"))?;
    // 8 KiB holds the largest record, a call with a 4 KiB name.
    if kib < 8 || !kib.is_power_of_two() || kib > 1 << 20 {
        return Err("must be a power of two between 8 and 1048576".into());
    }
    Ok(kib)
}

fn parse_map_entries(text: &str) -> Result<(String, u32), String> {
    let (map, entries) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not MAP=N"))?;
    if !SIZED_MAPS.contains(&map) {
        return Err(format!("{map:?} is not one of {}", SIZED_MAPS.join(", ")));
    }
    let entries: u32 = entries.parse().map_err(|e| format!("{entries:?}: {e}"))?;
    if entries == 0 {
        return Err("a map needs at least 1 entry".into());
    }
    Ok((map.to_owned(), entries))
}

/// `--start-at`: RFC 3339 (`2026-11-26T12:00:00Z`, `2026-11-26T13:00:00.5+01:00`) or Unix
/// seconds (`1795265558`, `1795265558.25`). Nanoseconds since the epoch.
fn parse_start_at(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Some(seconds) = text.strip_prefix('@').or(Some(text))
        && !seconds.is_empty()
        && seconds.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    {
        let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, ""));
        let whole: u64 = whole
            .parse()
            .map_err(|e| format!("{text:?}: {e} (Unix seconds or RFC 3339)"))?;
        let digits: String = fraction
            .chars()
            .chain("000000000".chars())
            .take(9)
            .collect();
        let nanos: u64 = digits
            .parse()
            .map_err(|_| format!("{text:?}: not Unix seconds"))?;
        return whole
            .checked_mul(1_000_000_000)
            .and_then(|ns| ns.checked_add(nanos))
            .ok_or_else(|| format!("{text:?}: too far in the future"));
    }
    // humantime reads UTC (`Z`) alone: an offset is applied here.
    let (local, offset_s) = split_offset(text)?;
    let time = humantime::parse_rfc3339(&format!("{local}Z")).map_err(|e| {
        format!("{text:?}: {e} (give RFC 3339, 2026-11-26T12:00:00Z, or Unix seconds)")
    })?;
    let ns = time
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{text:?}: before 1970"))?
        .as_nanos() as i128
        - i128::from(offset_s) * 1_000_000_000;
    u64::try_from(ns).map_err(|_| format!("{text:?}: before 1970"))
}

/// `...T13:00:00+01:00` → (`...T13:00:00`, 3600); `...Z` → (`...`, 0).
fn split_offset(text: &str) -> Result<(&str, i64), String> {
    if let Some(local) = text.strip_suffix(['Z', 'z']) {
        return Ok((local, 0));
    }
    let Some(at) = text.len().checked_sub(6) else {
        return Err(format!("{text:?}: not a time"));
    };
    let (local, offset) = text.split_at(at);
    let sign = match offset.as_bytes()[0] {
        b'+' => 1,
        b'-' => -1,
        _ => {
            return Err(format!(
                "{text:?}: no time zone (end it with Z or an offset such as +01:00)"
            ));
        }
    };
    let (hours, minutes) = offset[1..]
        .split_once(':')
        .ok_or_else(|| format!("{text:?}: offset {offset} is not ±HH:MM"))?;
    let hours: i64 = hours.parse().map_err(|_| format!("{text:?}: bad offset"))?;
    let minutes: i64 = minutes
        .parse()
        .map_err(|_| format!("{text:?}: bad offset"))?;
    Ok((local, sign * (hours * 3600 + minutes * 60)))
}

/// The longest `--duration`: a window longer than a year is a typo, and past about 584
/// years the nanosecond clock cannot hold its end.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// `--duration`: `30s`, `500ms`, `2m`, `1h 30m` (humantime), a year at most.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e}"))?;
    if duration.is_zero() {
        return Err("the window must last longer than 0".into());
    }
    if duration > MAX_DURATION {
        return Err(format!(
            "{text:?} is longer than 366 days: give a shorter window, or leave --duration out \
             to record until the command ends"
        ));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_are_rfc_3339_with_any_offset_or_unix_seconds() {
        let utc = parse_start_at("2026-11-21T12:52:38Z").unwrap();
        assert_eq!(utc, 1_795_265_558_000_000_000);
        assert_eq!(parse_start_at("2026-11-21T13:52:38+01:00"), Ok(utc));
        assert_eq!(parse_start_at("2026-11-21T10:22:38-02:30"), Ok(utc));
        assert_eq!(
            parse_start_at("2026-11-21T12:52:38.25Z"),
            Ok(utc + 250_000_000)
        );
        assert_eq!(parse_start_at("1795265558"), Ok(utc));
        assert_eq!(parse_start_at("@1795265558.000000001"), Ok(utc + 1));
        assert!(
            parse_start_at("2026-11-21T12:52:38")
                .unwrap_err()
                .contains("no time zone")
        );
        assert!(parse_start_at("tomorrow").is_err());
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("0s").is_err());
        assert_eq!(
            parse_duration("999999999999h"),
            Err(
                "\"999999999999h\" is longer than 366 days: give a shorter window, or leave \
                 --duration out to record until the command ends"
                    .into()
            )
        );
        assert_eq!(parse_duration("366days"), Ok(MAX_DURATION));
    }
}
