//! Shared helpers of the root tests: the stand-in libcuda, running cudatrace, reading
//! traces. Root tests attach real probes; they run one at a time (a global lock).
#![allow(dead_code)]

pub mod gpu;
pub mod nccl;
pub mod power;
pub mod trace_processor;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{Mutex, MutexGuard, OnceLock},
};

use serde_json::Value;

pub const CUDATRACE: &str = env!("CARGO_BIN_EXE_cudatrace");

static ROOT_LOCK: Mutex<()> = Mutex::new(());

/// Serialises root tests. Fails the test when not root, unless CUDATRACE_SKIP_ROOT_TESTS
/// is set (then returns None and the test returns early, saying so).
pub fn root() -> Option<MutexGuard<'static, ()>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        if std::env::var_os("CUDATRACE_SKIP_ROOT_TESTS").is_some() {
            eprintln!("skipped: needs root (CUDATRACE_SKIP_ROOT_TESTS is set)");
            return None;
        }
        panic!("root tests load eBPF programs: run as root (or set CUDATRACE_SKIP_ROOT_TESTS=1)");
    }
    Some(ROOT_LOCK.lock().unwrap_or_else(|e| e.into_inner()))
}

pub struct Standin {
    pub dir: PathBuf,
    pub lib: PathBuf,
    pub driver: PathBuf,
    pub demo: PathBuf,
    /// `cudatrace-bench-loop N [RATE [THREADS]]`: cuCtxSynchronize as fast as it goes.
    pub bench_loop: PathBuf,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The warnings and optimisation every test program is built with.
pub const C_FLAGS: &[&str] = &["-O2", "-g", "-Wall", "-Wextra", "-Werror"];

/// Compiles with gcc. The output is kept in `CARGO_TARGET_TMPDIR/gcc-cache`, named by
/// everything that goes into it (the arguments, with the output's directory as a
/// placeholder, and every `.c`/`.h` file beside each source), and copied from there when
/// the same build is asked for again: `vm-test`'s guest, where gcc runs about 40 times
/// slower, then finds what the host's run of the same tests built (it sees the host's
/// files). Only a finished build is kept.
pub fn gcc(args: &[&str]) {
    let output = args
        .iter()
        .position(|arg| *arg == "-o")
        .and_then(|index| args.get(index + 1))
        .map(Path::new);
    let cached = output.map(|output| gcc_cache().join(gcc_key(args, output)));
    if let (Some(output), Some(cached)) = (output, &cached)
        && std::fs::copy(cached, output).is_ok()
    {
        return;
    }
    let status = Command::new("gcc")
        .args(args)
        .status()
        .expect("running gcc");
    assert!(status.success(), "gcc {args:?} failed");
    if let (Some(output), Some(cached)) = (output, cached) {
        // Written aside, then renamed: a reader never sees half a file.
        let partial = cached.with_extension(format!("partial-{}", std::process::id()));
        if std::fs::copy(output, &partial).is_ok() {
            let _ = std::fs::rename(&partial, &cached);
        }
    }
}

fn gcc_cache() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gcc-cache");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// FNV-1a over what makes the build: the arguments (the output's directory, which differs
/// per test process, written as `$OUT`) and the sources' directories' `.c` and `.h` files.
fn gcc_key(args: &[&str], output: &Path) -> String {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes.iter().chain([&0u8]) {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3);
        }
    };
    let out_dir = output.parent().map(|dir| dir.display().to_string());
    let mut source_dirs: Vec<PathBuf> = Vec::new();
    for arg in args {
        let arg = match &out_dir {
            Some(dir) if !dir.is_empty() => arg.replace(dir.as_str(), "$OUT"),
            _ => (*arg).to_owned(),
        };
        feed(arg.as_bytes());
        let path = Path::new(&arg);
        if path.extension().is_some_and(|ext| ext == "c")
            && let Some(dir) = path.parent()
            && !source_dirs.iter().any(|known| known == dir)
        {
            source_dirs.push(dir.to_owned());
        }
    }
    for dir in source_dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| entries.filter_map(|e| Some(e.ok()?.path())).collect())
            .unwrap_or_default();
        files.retain(|f| f.extension().is_some_and(|ext| ext == "c" || ext == "h"));
        files.sort();
        for file in files {
            feed(file.display().to_string().as_bytes());
            feed(&std::fs::read(&file).unwrap_or_default());
        }
    }
    format!("{hash:016x}")
}

/// The stand-in libcuda and its programs, built once per test binary.
pub fn standin() -> &'static Standin {
    static STANDIN: OnceLock<Standin> = OnceLock::new();
    STANDIN.get_or_init(|| {
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("standin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = repo().join("standin");
        let out = |name: &str| dir.join(name).display().to_string();
        standin_library(
            "libcuda.so.1",
            &dir.join("libcuda.so.1"),
            &src.join("libcuda_standin.c"),
            &[],
        );
        for (program, source) in [
            ("cudatrace-driver", "cudatrace_driver.c"),
            ("cudatrace-demo", "demo_inference.c"),
            ("cudatrace-bench-loop", "bench_loop.c"),
        ] {
            let (output, source) = (out(program), src.join(source).display().to_string());
            let link = format!("-L{}", dir.display());
            let mut args = C_FLAGS.to_vec();
            args.extend(["-o", &output, &source, &link, "-l:libcuda.so.1"]);
            args.extend(["-Wl,-rpath,$ORIGIN", "-lpthread"]);
            gcc(&args);
        }
        Standin {
            lib: dir.join("libcuda.so.1"),
            driver: dir.join("cudatrace-driver"),
            demo: dir.join("cudatrace-demo"),
            bench_loop: dir.join("cudatrace-bench-loop"),
            dir,
        }
    })
}

/// Builds a stand-in library (NOT NVIDIA's) from `source` into `out`, with `soname` and
/// gcc's `extra` flags. `-fno-ipa-icf`: functions with identical bodies keep addresses of
/// their own, as the real library's do, instead of being folded into aliases of each other.
pub fn standin_library(soname: &str, out: &Path, source: &Path, extra: &[&str]) {
    let soname = format!("-Wl,-soname,{soname}");
    let mut args = vec![
        "-shared",
        "-fPIC",
        "-O2",
        "-fno-ipa-icf",
        "-g",
        "-Wall",
        "-Wextra",
        "-Werror",
        &soname,
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend(extra);
    args.push(source.to_str().unwrap());
    gcc(&args);
}

/// `tests/c/fake_nvidia.c` built: a process's ioctls and mmap on plain files that play the
/// NVIDIA device nodes (see the file for the exact calls).
pub fn fake_nvidia() -> PathBuf {
    let dir = scratch("fake-nvidia-bin");
    let program = dir.join("fake-nvidia");
    gcc(&[
        "-O2",
        "-Wall",
        "-Werror",
        "-o",
        program.to_str().unwrap(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/fake_nvidia.c"),
    ]);
    program
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `cudatrace run -q --libcuda STANDIN -o TRACE [extra...] -- driver ARGS`.
pub fn trace_driver(trace: &Path, extra: &[&str], driver_args: &[&str]) -> Output {
    let standin = standin();
    let mut command = Command::new(CUDATRACE);
    command
        .args(["run", "-q", "--libcuda"])
        .arg(&standin.lib)
        .arg("-o")
        .arg(trace)
        .args(extra)
        .arg("--")
        .arg(&standin.driver)
        .args(driver_args);
    command.output().expect("running cudatrace")
}

/// Waits (60 s at most) until the trace file contains `needle`. The header line means the
/// probes are attached; call lines show up within the 250 ms flush period.
pub fn wait_for_trace(path: &Path, needle: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read_to_string(path).map_or(true, |text| !text.contains(needle)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never showed {needle}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Text of the header line, for [`wait_for_trace`].
/// What every reader says of a folder given as its trace (exit 74).
pub fn folder_refused(path: impl std::fmt::Display) -> String {
    format!(
        "cudatrace: error: {path} is a folder, not a trace: a trace is a regular file, or a \
         pipe named on the command line\n"
    )
}

pub const HEADER: &str = r#""type":"header""#;

/// The trace's lines as JSON values; fails on any malformed line.
pub fn read_trace(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}:{}: {e}: {line}", path.display(), i + 1))
        })
        .collect()
}

/// The `"type":"call"` lines.
pub fn calls(trace: &[Value]) -> Vec<&Value> {
    trace.iter().filter(|l| l["type"] == "call").collect()
}

pub fn names(calls: &[&Value]) -> Vec<String> {
    calls
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Asserts the header is first, the footer last, and the footer's counts match the lines.
/// The trace is whole (header first, footer last, the footer's counts those of its lines)
/// and nothing was lost: the footer's `lost.total` is 0. A test that loses on purpose
/// uses [`assert_complete_with_losses`].
pub fn assert_complete(trace: &[Value]) {
    assert_complete_with_losses(trace);
    let footer = trace.last().unwrap();
    assert_eq!(footer["lost"]["total"], 0, "lost: {}", footer["lost"]);
}

/// [`assert_complete`] where losses are expected (and checked by the test).
pub fn assert_complete_with_losses(trace: &[Value]) {
    assert_eq!(
        trace.first().unwrap()["type"],
        "header",
        "first line is the header"
    );
    let footer = trace.last().unwrap();
    assert_eq!(footer["type"], "footer", "last line is the footer");
    let count = |t: &str| trace.iter().filter(|l| l["type"] == t).count() as u64;
    assert_eq!(footer["events"]["call"], count("call"));
    assert_eq!(footer["events"]["process"], count("process"));
    assert_eq!(footer["events"]["lost"], count("lost"));
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Ids of loaded BPF programs with cudatrace's program names.
pub fn cudatrace_program_ids() -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(|p| p.ok())
        .filter(|p| {
            matches!(
                p.name_as_str(),
                Some("call_enter" | "call_return" | "task_newtask" | "gpu_records")
            )
        })
        .map(|p| p.id())
        .collect()
}

/// Programs held open by a live process (a file descriptor of the program or of a link
/// to it): on a machine shared with other test runs, another cudatrace's.
fn held_programs() -> Vec<u32> {
    let mut ids = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return ids;
    };
    for process in procs.flatten() {
        let Ok(fds) = std::fs::read_dir(process.path().join("fdinfo")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(info) = std::fs::read_to_string(fd.path()) else {
                continue;
            };
            ids.extend(info.lines().filter_map(|line| {
                line.strip_prefix("prog_id:")
                    .and_then(|id| id.trim().parse::<u32>().ok())
            }));
        }
    }
    ids
}

/// cudatrace programs loaded now that were not in `before` and that no live process
/// holds: what a finished cudatrace left behind. Programs of other, concurrent tracers
/// are left out (loaded before, or held by their tracer); so are those the kernel frees
/// within 2 s (a link's release waits for an RCU grace period, so a tracer that exited a
/// moment ago may still show its programs).
pub fn programs_left_since(before: &[u32]) -> Vec<u32> {
    let mut left = Vec::new();
    for _ in 0..20 {
        let new: Vec<u32> = cudatrace_program_ids()
            .into_iter()
            .filter(|id| !before.contains(id))
            .collect();
        if new.is_empty() {
            return new;
        }
        let held = held_programs();
        left = new.into_iter().filter(|id| !held.contains(id)).collect();
        if left.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    left
}

/// Runs `f` and asserts that no cudatrace program it loaded is still loaded afterwards.
pub fn assert_no_probe_outlives<T>(f: impl FnOnce() -> T) -> T {
    let before = cudatrace_program_ids();
    let result = f();
    let left = programs_left_since(&before);
    assert!(left.is_empty(), "programs {left:?} outlived cudatrace");
    result
}

/// Whether this kernel's release is `major.minor` or newer.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    (numbers.next().unwrap(), numbers.next().unwrap()) >= (major, minor)
}
