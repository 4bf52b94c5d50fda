//! Shared helpers of the root tests: the stand-in libcuda, running cudatrace, reading
//! traces. Root tests attach real probes; they run one at a time (a global lock).
#![allow(dead_code)]

pub mod gpu;
pub mod nccl;
pub mod power;

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

pub fn gcc(args: &[&str]) {
    let status = Command::new("gcc")
        .args(args)
        .status()
        .expect("running gcc");
    assert!(status.success(), "gcc {args:?} failed");
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
        gcc(&[
            "-shared",
            "-fPIC",
            "-O2",
            "-fno-ipa-icf",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            &out("libcuda.so.1"),
            &src.join("libcuda_standin.c").display().to_string(),
        ]);
        for (program, source) in [
            ("cudatrace-driver", "cudatrace_driver.c"),
            ("cudatrace-demo", "demo_inference.c"),
            ("cudatrace-bench-loop", "bench_loop.c"),
        ] {
            gcc(&[
                "-O2",
                "-g",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-o",
                &out(program),
                &src.join(source).display().to_string(),
                &format!("-L{}", dir.display()),
                "-l:libcuda.so.1",
                "-Wl,-rpath,$ORIGIN",
                "-lpthread",
            ]);
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
pub fn assert_complete(trace: &[Value]) {
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

/// Runs `f` and asserts that no cudatrace program it loaded is still loaded afterwards
/// (programs of other, concurrent tracers are left out by comparing ids).
pub fn assert_no_probe_outlives<T>(f: impl FnOnce() -> T) -> T {
    let before = cudatrace_program_ids();
    let result = f();
    let left: Vec<u32> = cudatrace_program_ids()
        .into_iter()
        .filter(|id| !before.contains(id))
        .collect();
    assert!(left.is_empty(), "programs {left:?} outlived cudatrace");
    result
}
