//! `cudatrace run`'s flags.

use std::{ffi::OsString, path::PathBuf};

use clap::Args;

use crate::{export::ExportFormat, kernel_hooks::HookChoice, probes::plan::MissingProbes};

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

When the command exits, cudatrace detaches, drains the ring buffer, writes the footer
and exits with the command's exit code. Ctrl-C (SIGINT) and SIGTERM do the same and
exit 130/143; SIGTERM is passed on to the command.")]
pub struct RunArgs {
    /// Attach to a running process (and the children it starts from now on). Repeatable.
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,

    /// Trace every process that calls libcuda, not only the command's tree.
    #[arg(long)]
    pub all: bool,

    /// Where to write the trace; `-` for standard output (the command's stdout then goes
    /// to stderr). Default: traces/trace_YYYYMMDD_HHMMSS.jsonl.
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

    /// What to do when a catalog function is not exported by libcuda or fails to attach.
    #[arg(long, value_enum, default_value = "warn", value_name = "POLICY")]
    pub missing_probes: MissingProbes,

    /// Run the command as root even under sudo.
    #[arg(long)]
    pub as_root: bool,

    /// No progress on stderr (errors and the final line still print).
    #[arg(short, long)]
    pub quiet: bool,

    /// Ring buffer size in KiB (a power of two, at least 4). Larger rides out bursts.
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

    /// Also export the trace when tracing ends, beside it: TRACE.json (`chrome`) or
    /// TRACE.pftrace (`perfetto`); see `cudatrace export`. Not with `-o -`.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub export: Option<ExportFormat>,

    /// The command to run, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

fn parse_ring_kib(text: &str) -> Result<u32, String> {
    let kib: u32 = text.parse().map_err(|e| format!("{e}"))?;
    if kib < 4 || !kib.is_power_of_two() || kib > 1 << 20 {
        return Err("must be a power of two between 4 and 1048576".into());
    }
    Ok(kib)
}
