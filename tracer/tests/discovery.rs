//! Root tests of library discovery and per-process probes: libraries `dlopen()`ed from
//! paths no search knows and called at once (with `--functions`' selection, their refused
//! functions split off), several copies of libcuda each attributed,
//! a library in a mount namespace of its own, `-p` finding it in the maps, fork children
//! calling at once, shells and Python's subprocess as parents of stopped children, pid
//! namespaces, bystanders without breakpoints, calls abandoned by `longjmp`, no process
//! left stopped (or killed while stopped), `--lib`, and the no-library warning.
//! The program under test is `tests/c/loader.c` (not linked against libcuda).

mod common;

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read},
    os::unix::fs::FileExt,
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use common::*;
use object::{Object, ObjectSegment, ObjectSymbol};
use serde_json::{Value, json};

/// `tests/c/loader.c`, built once.
fn loader() -> &'static Path {
    static LOADER: OnceLock<PathBuf> = OnceLock::new();
    LOADER.get_or_init(|| {
        let program = scratch("loader-bin").join("loader");
        gcc(&[
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            program.to_str().unwrap(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/loader.c"),
        ]);
        program
    })
}

/// A copy of the stand-in libcuda at `dir/relative`: a file of its own (another inode),
/// where no search looks.
fn copy_standin(dir: &Path, relative: &str) -> PathBuf {
    let path = dir.join(relative);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::copy(&standin().lib, &path).unwrap();
    path
}

fn cudatrace(trace: &Path, extra: &[&str], command: &[&str]) -> Output {
    Command::new(CUDATRACE)
        .args(["run", "-q", "-o"])
        .arg(trace)
        .args(extra)
        .arg("--")
        .args(command)
        .output()
        .expect("running cudatrace")
}

/// Calls per (name, pid, lib).
fn call_counts(trace: &[Value]) -> BTreeMap<(String, u64, u64), u64> {
    let mut counts = BTreeMap::new();
    for call in calls(trace) {
        let key = (
            call["name"].as_str().unwrap().to_owned(),
            call["pid"].as_u64().unwrap(),
            call["lib"]
                .as_u64()
                .expect("every call line names its library"),
        );
        *counts.entry(key).or_default() += 1;
    }
    counts
}

fn libraries(trace: &[Value]) -> Vec<&Value> {
    trace.iter().filter(|l| l["type"] == "library").collect()
}

/// The id of the library line with this path.
fn library_id(trace: &[Value], path: &Path) -> u64 {
    libraries(trace)
        .iter()
        .find(|l| l["path"] == path.to_str().unwrap())
        .unwrap_or_else(|| panic!("no library line for {}", path.display()))["id"]
        .as_u64()
        .unwrap()
}

fn footer(trace: &[Value]) -> &Value {
    trace.last().unwrap()
}

fn command_pid(trace: &[Value]) -> u64 {
    trace[0]["pids"][0].as_u64().unwrap()
}

/// The header of a trace being written: its first line, once whole.
fn header_of(path: &Path) -> Value {
    wait_for_trace(path, HEADER);
    loop {
        let text = std::fs::read_to_string(path).unwrap();
        if let Some((line, _)) = text.split_once('\n') {
            return serde_json::from_str(line).unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn key(name: &str, pid: u64, lib: u64) -> (String, u64, u64) {
    (name.to_owned(), pid, lib)
}

#[test]
fn a_library_dlopened_from_an_unknown_path_is_traced_from_its_first_call() {
    let Some(_guard) = root() else { return };
    let dir = scratch("dlopen");
    let lib = copy_standin(&dir, "site-packages/nvidia/cu13/lib/libcuda.so.1");
    let trace_path = dir.join("trace.jsonl");
    let output = cudatrace(
        &trace_path,
        &[],
        &[
            loader().to_str().unwrap(),
            lib.to_str().unwrap(),
            "calls",
            "100",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let pid = command_pid(&trace);
    let id = library_id(&trace, &lib);
    let line = libraries(&trace)
        .into_iter()
        .find(|l| l["id"] == id)
        .unwrap();
    assert_eq!(
        (&line["found"], &line["pid"], &line["set"], &line["standin"]),
        (
            &Value::from("opened"),
            &Value::from(pid),
            &Value::from("libcuda"),
            &Value::from(true)
        )
    );
    assert_eq!(
        call_counts(&trace),
        BTreeMap::from([
            (key("cuInit", pid, id), 1),
            (key("cuCtxSynchronize", pid, id), 100)
        ]),
        "cuInit, called right after dlopen, is there"
    );
    let stops = &footer(&trace)["stops"];
    assert!(stops["count"].as_u64().unwrap() >= 1, "{stops}");
    assert_eq!(stops["failed"], 0);
}

#[test]
fn a_library_found_later_gets_the_same_function_selection() {
    let Some(_guard) = root() else { return };
    let dir = scratch("dlopen-functions");
    let lib = copy_standin(&dir, "wheel/libcuda.so.1");
    let trace_path = dir.join("trace.jsonl");
    let output = cudatrace(
        &trace_path,
        &["--functions", "cuInit"],
        &[
            loader().to_str().unwrap(),
            lib.to_str().unwrap(),
            "calls",
            "3",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let pid = command_pid(&trace);
    let id = library_id(&trace, &lib);
    let line = libraries(&trace)
        .into_iter()
        .find(|l| l["id"] == id)
        .unwrap();
    let probes: Vec<&str> = line["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["symbol"].as_str().unwrap())
        .collect();
    assert_eq!(
        (&line["found"], probes),
        (&Value::from("opened"), vec!["cuInit"])
    );
    // cuCtxSynchronize (3 calls) is not selected, in this library as at start.
    assert_eq!(
        call_counts(&trace),
        BTreeMap::from([(key("cuInit", pid, id), 1)])
    );
}

#[test]
fn a_library_found_later_has_its_refused_functions_split_off() {
    let Some(_guard) = root() else { return };
    let dir = scratch("dlopen-refused");
    // cuLocked starts with a LOCK-prefixed instruction, which uprobes refuse. The library
    // is linked for the process when it opens it, before it maps it, so only cudatrace's
    // own check finds the refusal.
    let lib = dir.join("deep/libcuda.so.1");
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    gcc(&[
        "-shared",
        "-fPIC",
        "-O2",
        "-o",
        lib.to_str().unwrap(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/unprobeable.c"),
    ]);
    let trace_path = dir.join("trace.jsonl");
    let output = cudatrace(
        &trace_path,
        &["--functions", "all", "--missing-probes", "ignore"],
        &[
            loader().to_str().unwrap(),
            lib.to_str().unwrap(),
            "reopen",
            "2",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let pid = command_pid(&trace);
    let id = library_id(&trace, &lib);
    let line = libraries(&trace)
        .into_iter()
        .find(|l| l["id"] == id)
        .unwrap();
    let probes: Vec<&str> = line["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["symbol"].as_str().unwrap())
        .collect();
    assert_eq!(probes, ["cuInit"]);
    let failures = line["attach_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{line}");
    assert_eq!(failures[0]["symbol"], "cuLocked");
    // x86-64 refuses a LOCK prefix with ENOTSUPP, arm64 an exclusive load with EINVAL.
    let refused = if cfg!(target_arch = "aarch64") {
        "os error 22"
    } else {
        "os error 524"
    };
    assert!(
        failures[0]["error"].as_str().unwrap().contains(refused),
        "{refused}: {line}"
    );
    // The other function is traced, in each of the two opens.
    assert_eq!(
        call_counts(&trace),
        BTreeMap::from([(key("cuInit", pid, id), 2)])
    );
}

#[test]
fn copies_of_libcuda_are_each_attached_once_and_named_on_their_calls() {
    let Some(_guard) = root() else { return };
    let dir = scratch("copies");
    let first = copy_standin(&dir, "one/libcuda.so.1");
    let second = copy_standin(&dir, "compat/libcuda.so.580.159.04");
    let trace_path = dir.join("trace.jsonl");
    let script = format!(
        "{loader} {first} calls 3 && {loader} {second} calls 5 && {driver} child",
        loader = loader().display(),
        first = first.display(),
        second = second.display(),
        driver = standin().driver.display(),
    );
    let output = cudatrace(
        &trace_path,
        &["--libcuda", standin().lib.to_str().unwrap()],
        &["sh", "-c", &script],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let explicit = library_id(&trace, &std::fs::canonicalize(&standin().lib).unwrap());
    let one = library_id(&trace, &first);
    let compat = library_id(&trace, &second);
    assert_eq!(
        [explicit, one, compat].len(),
        libraries(&trace).len(),
        "one library line per file"
    );
    assert_eq!(
        (explicit, one, compat),
        (0, 1, 2),
        "ids in the order attached"
    );
    let compat_line = libraries(&trace)[2];
    assert_eq!(compat_line["version"], "580.159.04");
    assert_eq!(compat_line["found"], "opened");
    // Each program's calls went into its own copy.
    let mut by_library: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for ((name, _, lib), count) in call_counts(&trace) {
        *by_library.entry((name, lib)).or_default() += count;
    }
    assert_eq!(
        by_library,
        BTreeMap::from([
            (("cuInit".to_owned(), one), 1),
            (("cuCtxSynchronize".to_owned(), one), 3),
            (("cuInit".to_owned(), compat), 1),
            (("cuCtxSynchronize".to_owned(), compat), 5),
            (("cuMemAlloc_v2".to_owned(), explicit), 1),
            (("cuInit".to_owned(), explicit), 1),
        ])
    );
}

#[test]
fn a_fork_child_calling_at_once_is_traced() {
    fork_child_calling_at_once(None);
}

/// arm64's way on this machine: the child is caught on its first `rseq:rseq_update`
/// (arm64's fork children return to user space without the syscall exit tracepoint).
#[test]
fn a_fork_child_caught_at_its_first_rseq_update_is_traced() {
    fork_child_calling_at_once(Some("rseq"));
}

/// The child's own calls: `loader fork` calls cuInit and cuMemAlloc_v2(54321), forks, and
/// the child calls cuMemAlloc_v2(12345) at once; with `hook`, cudatrace catches the child
/// that way (`CUDATRACE_CHILD_HOOK`).
fn fork_child_calling_at_once(hook: Option<&str>) {
    let Some(_guard) = root() else { return };
    let dir = scratch("fork-at-once");
    let lib = copy_standin(&dir, "lib/libcuda.so.1");
    let trace_path = dir.join("trace.jsonl");
    let output = run_loader_fork(&mut Command::new(CUDATRACE), &trace_path, &lib)
        .envs(hook.map(|h| (CHILD_HOOK, h)))
        .output()
        .expect("running cudatrace");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let parent = command_pid(&trace);
    let fork = trace
        .iter()
        .find(|l| l["event"] == "fork")
        .expect("fork line");
    let child = fork["child_pid"].as_u64().unwrap();
    let id = library_id(&trace, &lib);
    assert_eq!(
        call_counts(&trace),
        BTreeMap::from([
            (key("cuInit", parent, id), 1),
            (key("cuMemAlloc_v2", parent, id), 1),
            (key("cuMemAlloc_v2", child, id), 1),
        ])
    );
    let bytes = |pid: u64| {
        calls(&trace)
            .iter()
            .find(|c| c["pid"] == pid && c["name"] == "cuMemAlloc_v2")
            .unwrap()["bytes"]
            .as_u64()
    };
    assert_eq!((bytes(parent), bytes(child)), (Some(54321), Some(12345)));
    if per_process(&trace) {
        // The library's open, then the fork.
        assert_eq!(footer(&trace)["stops"]["count"], 2);
    }
}

/// `cmd` given `run -q -o TRACE -- loader LIB fork` (cudatrace's arguments).
fn run_loader_fork<'a>(cmd: &'a mut Command, trace: &Path, lib: &Path) -> &'a mut Command {
    cmd.args(["run", "-q", "-o"])
        .arg(trace)
        .arg("--")
        .arg(loader())
        .arg(lib)
        .arg("fork")
}

/// Which hook catches a fork child (`tracer/src/probes/programs.rs`, `ChildHook`).
const CHILD_HOOK: &str = "CUDATRACE_CHILD_HOOK";

fn per_process(trace: &[Value]) -> bool {
    trace[0]["attach"]["scope"] == "process"
}

#[test]
fn in_a_pid_namespace_pids_are_cudatraces_own_and_the_command_is_traced() {
    in_a_pid_namespace(None);
}

/// As above, the child named at its first `rseq:rseq_update` (arm64's way).
#[test]
fn in_a_pid_namespace_a_child_caught_at_its_first_rseq_update_is_traced() {
    in_a_pid_namespace(Some("rseq"));
}

/// A child that must be named in cudatrace's pid namespace and is never caught in its own
/// context (a kernel without the hook): its call is missing, and counted.
#[test]
fn a_child_never_caught_in_its_own_context_is_counted_child_unseen() {
    in_a_pid_namespace(Some("none"));
}

/// arm64's way where the parent registered no restartable sequence (glibc's tunable off,
/// as glibc before 2.35): the child has none to update, is never caught, and is counted.
#[test]
fn a_child_without_a_restartable_sequence_is_counted_child_unseen() {
    in_a_pid_namespace(Some("rseq-off"));
}

/// A child still running when tracing ends, never caught in its own context, is counted
/// at the end (the kernel counts only those that end while traced). It must be named in
/// cudatrace's pid namespace, and never execs (an exec catches it); `--duration` ends the
/// trace while it sleeps, long enough after its fork that it is more than the 1 s a child
/// is given to be caught (perl starts in seconds on the emulated arm64 guest: with 2 s the
/// child was forked less than 1 s before the end there, and not counted).
#[test]
fn a_child_running_at_the_end_and_never_caught_is_counted_child_unseen() {
    let Some(_guard) = root() else { return };
    let dir = scratch("pidns-alive");
    // Caught by the architecture's own hook (arm64's `ret_from_fork` passes no syscall
    // exit: there the first `rseq_update` catches it).
    let caught = if cfg!(target_arch = "aarch64") {
        "rseq"
    } else {
        "syscall_exit"
    };
    for (hook, unseen) in [("none", 1), (caught, 0)] {
        let trace_path = dir.join(format!("{hook}.jsonl"));
        let output = Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", CUDATRACE, "run", "-q"])
            .args(["--duration", "4s", "-o"])
            .arg(&trace_path)
            // Perl (Debian's essential perl-base): a fork without an exec, no wrapper.
            .args(["--", "perl", "-e"])
            .arg("if (fork() == 0) { sleep 7; exit 0 } sleep 7")
            .env(CHILD_HOOK, hook)
            .output()
            .expect("running unshare");
        assert_eq!(output.status.code(), Some(0), "{hook}: {}", stderr(&output));
        let trace = read_trace(&trace_path);
        // The field is written when not 0 (docs/trace-format.md).
        let written = (unseen > 0).then_some(unseen);
        assert_eq!(
            footer(&trace)["lost"]["child_unseen"],
            json!(written),
            "{hook}"
        );
        assert_eq!(footer(&trace)["lost"]["total"], unseen, "{hook}");
        let lost: Vec<_> = trace
            .iter()
            .filter(|l| l["type"] == "lost")
            .map(|l| (l["reason"].clone(), l["count"].clone()))
            .collect();
        let expected = if unseen == 0 {
            vec![]
        } else {
            vec![(json!("child_unseen"), json!(unseen))]
        };
        assert_eq!(lost, expected, "{hook}");
        // Caught: named here, its fork reported.
        assert_eq!(
            trace.iter().filter(|l| l["event"] == "fork").count(),
            1 - unseen as usize,
            "{hook}"
        );
    }
}

/// `CUDATRACE_CHILD_HOOK` is a test switch, but a bad value is a usage error (exit 2) said
/// before anything is traced.
#[test]
fn a_bad_child_hook_is_a_usage_error() {
    let Some(_guard) = root() else { return };
    let dir = scratch("bad-hook");
    let trace_path = dir.join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "-o"])
        .arg(&trace_path)
        .args(["--", "true"])
        .env(CHILD_HOOK, "clone")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("CUDATRACE_CHILD_HOOK=clone: expected syscall_exit, rseq or none"),
        "{}",
        stderr(&output)
    );
    assert!(!trace_path.exists());
}

/// `loader fork` under `unshare --pid`, cudatrace the namespace's pid 1; `hook` as in
/// [`fork_child_calling_at_once`]; `none`: the child is not caught; `rseq-off`: `rseq`
/// with the processes' restartable sequences off.
fn in_a_pid_namespace(hook: Option<&str>) {
    let Some(_guard) = root() else { return };
    let dir = scratch("pidns");
    let lib = copy_standin(&dir, "lib/libcuda.so.1");
    let trace_path = dir.join("trace.jsonl");
    let mut unshare = Command::new("unshare");
    unshare.args(["--pid", "--fork", "--mount-proc", CUDATRACE]);
    let output = run_loader_fork(&mut unshare, &trace_path, &lib)
        .envs(hook.map(|h| (CHILD_HOOK, h.trim_end_matches("-off"))))
        .envs((hook == Some("rseq-off")).then_some(("GLIBC_TUNABLES", "glibc.pthread.rseq=0")))
        .output()
        .expect("running unshare");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    let parent = command_pid(&trace);
    let id = library_id(&trace, &lib);
    if matches!(hook, Some("none" | "rseq-off")) {
        assert_complete_with_losses(&trace);
        // Never named here: no fork line, no call, its exit not traced.
        assert!(!trace.iter().any(|l| l["event"] == "fork"));
        assert_eq!(
            call_counts(&trace),
            BTreeMap::from([
                (key("cuInit", parent, id), 1),
                (key("cuMemAlloc_v2", parent, id), 1),
            ])
        );
        assert_eq!(
            footer(&trace)["lost"],
            json!({
                "attach_ring_full": 0, "calls": 0, "child_unseen": 1, "driver_ring_full": 0,
                "fds_full": 0, "frames_full": 0, "kfuncs_full": 0, "not_drained": 0,
                "opens_full": 0, "process_ring_full": 0, "ring_full": 0, "syscalls_full": 0,
                "too_deep": 0, "total": 1, "traced_full": 0
            })
        );
        let lost: Vec<_> = trace.iter().filter(|l| l["type"] == "lost").collect();
        assert_eq!(lost.len(), 1);
        assert_eq!(
            (&lost[0]["reason"], &lost[0]["count"]),
            (&json!("child_unseen"), &json!(1))
        );
        return;
    }
    assert_complete(&trace);
    let fork = trace
        .iter()
        .find(|l| l["event"] == "fork")
        .expect("fork line");
    assert_eq!(fork["pid"].as_u64(), Some(parent));
    let child = fork["child_pid"].as_u64().unwrap();
    // cudatrace is the namespace's pid 1: its command and children come right after.
    assert!(parent < 100 && child < 100, "{parent} {child}");
    assert_eq!(
        call_counts(&trace),
        BTreeMap::from([
            (key("cuInit", parent, id), 1),
            (key("cuMemAlloc_v2", parent, id), 1),
            (key("cuMemAlloc_v2", child, id), 1),
        ])
    );
    let exits: Vec<u64> = trace
        .iter()
        .filter(|l| l["event"] == "exit")
        .map(|l| l["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(exits, [child, parent]);
}

/// Whether `symbol` starts with a uprobe's breakpoint in process `pid`'s mapping of `lib`
/// (as the process named it in its maps).
fn breakpoint_in(pid: u32, lib: &Path, symbol: &str) -> bool {
    is_breakpoint(first_word_in(pid, lib, symbol))
}

/// The uprobe breakpoint: x86-64's `int3` (one byte, the word's first), arm64's `brk #0x5`
/// (the kernel's `UPROBE_SWBP_INSN`, one whole instruction).
fn is_breakpoint(word: u32) -> bool {
    if cfg!(target_arch = "aarch64") {
        word == 0xd420_00a0
    } else {
        word & 0xff == 0xcc
    }
}

/// The first four bytes of `symbol` in process `pid`'s mapping of `lib`, little-endian.
fn first_word_in(pid: u32, lib: &Path, symbol: &str) -> u32 {
    let data = std::fs::read(lib).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    let address = elf
        .dynamic_symbols()
        .find(|s| s.name() == Ok(symbol))
        .unwrap()
        .address();
    let file_offset = elf
        .segments()
        .find(|s| address >= s.address() && address < s.address() + s.size())
        .map(|s| address - s.address() + s.file_range().0)
        .unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mapped = maps
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 6 || fields[5] != lib.to_str().unwrap() {
                return None;
            }
            let (start, end) = fields[0].split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            let offset = u64::from_str_radix(fields[2], 16).ok()?;
            (file_offset >= offset && file_offset < offset + (end - start))
                .then(|| start + file_offset - offset)
        })
        .unwrap_or_else(|| panic!("{symbol} not mapped in {pid}"));
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut word = [0u8; 4];
    mem.read_exact_at(&mut word, mapped).unwrap();
    u32::from_le_bytes(word)
}

/// A `loader stop-here` process, waiting before its dlopen ("ready" read).
fn start_stop_here(lib: &Path) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(loader())
        .arg(lib)
        .arg("stop-here")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    (child, out)
}

fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) of a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

fn read_line(out: &mut impl BufRead) -> String {
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    line
}

#[test]
fn bystanders_get_no_breakpoints_and_their_calls_are_not_seen() {
    let Some(_guard) = root() else { return };
    let dir = scratch("bystander");
    let lib = copy_standin(&dir, "lib/libcuda.so.1");
    // The bystander maps the same file before tracing starts and calls it after.
    let (mut bystander, mut bystander_out) = start_stop_here(&lib);
    signal(bystander.id(), libc::SIGUSR1);
    assert_eq!(read_line(&mut bystander_out), "opened\n");

    for (extra, scope) in [(&[][..], "process"), (&["--all"][..], "host")] {
        let trace_path = dir.join(format!("{scope}.jsonl"));
        let mut tracer = Command::new(CUDATRACE)
            .args(["run", "-q", "-o"])
            .arg(&trace_path)
            .args(extra)
            .args(["--", loader().to_str().unwrap(), lib.to_str().unwrap()])
            .args(["pause", "2"])
            .spawn()
            .unwrap();
        wait_for_trace(&trace_path, r#""name":"cuInit""#);
        let header = header_of(&trace_path);
        if header["attach"]["scope"] != scope {
            // A kernel without uprobe_multi probes every process: nothing to compare.
            eprintln!("skipped: attach scope is {}", header["attach"]["scope"]);
            assert!(tracer.wait().unwrap().success());
            break;
        }
        let traced = header["pids"][0].as_u64().unwrap() as u32;
        assert!(breakpoint_in(traced, &lib, "cuMemAlloc_v2"));
        let bystander_word = first_word_in(bystander.id(), &lib, "cuMemAlloc_v2");
        assert_eq!(
            is_breakpoint(bystander_word),
            scope == "host",
            "{scope}: the bystander's cuMemAlloc_v2 starts with {bystander_word:#010x}"
        );
        assert!(tracer.wait().unwrap().success());
        let trace = read_trace(&trace_path);
        assert_complete(&trace);
        let id = library_id(&trace, &lib);
        // With --all, other processes of this machine may show up too.
        let mine: BTreeMap<_, _> = call_counts(&trace)
            .into_iter()
            .filter(|((_, pid, _), _)| scope == "process" || *pid == u64::from(traced))
            .collect();
        assert_eq!(
            mine,
            BTreeMap::from([
                (key("cuInit", u64::from(traced), id), 1),
                (key("cuMemAlloc_v2", u64::from(traced), id), 1),
            ])
        );
        if scope == "process" {
            assert_eq!(
                footer(&trace)["entries_seen"],
                2,
                "no bystander call reached the probes"
            );
        }
    }
    // The bystander goes on, untraced, and its breakpoints are gone.
    assert!(!breakpoint_in(bystander.id(), &lib, "cuMemAlloc_v2"));
    signal(bystander.id(), libc::SIGUSR1);
    assert!(bystander.wait().unwrap().success());
}

#[test]
fn a_call_abandoned_by_longjmp_does_not_use_up_a_nesting_level() {
    let Some(_guard) = root() else { return };
    let dir = scratch("longjmp");
    let lib = copy_standin(&dir, "lib/libcuda.so.1");
    let trace_path = dir.join("trace.jsonl");
    // Ten calls that never return, more than the four nesting levels kept per thread.
    let output = cudatrace(
        &trace_path,
        &[],
        &[
            loader().to_str().unwrap(),
            lib.to_str().unwrap(),
            "longjmp",
            "10",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("10 calls never returned"),
        "{}",
        stderr(&output)
    );
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let sizes: Vec<u64> = calls(&trace)
        .iter()
        .map(|c| c["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [1000, 1001, 1002, 1003, 1004, 1005]);
    let footer = footer(&trace);
    assert_eq!(footer["abandoned_calls"], 10);
    assert_eq!(footer["lost"]["too_deep"], 0);
    assert_eq!(footer["entries_seen"], 16);
}

/// The state letter of `pid` (`T` stopped), or `None` once it is gone.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn no_process_is_left_stopped_when_cudatrace_is_interrupted() {
    let Some(_guard) = root() else { return };
    let dir = scratch("left-stopped");
    let lib = copy_standin(&dir, "lib/libcuda.so.1");
    for (signal_name, signal_number, code) in [
        ("SIGINT", libc::SIGINT, 130),
        ("SIGTERM", libc::SIGTERM, 143),
    ] {
        let trace_path = dir.join(format!("{signal_name}.jsonl"));
        let mut tracer = Command::new(CUDATRACE)
            .args(["run", "-q", "-o"])
            .arg(&trace_path)
            .args(["--", loader().to_str().unwrap(), lib.to_str().unwrap()])
            .arg("stop-here")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(tracer.stdout.take().unwrap());
        assert_eq!(read_line(&mut out), "ready\n");
        let command = header_of(&trace_path)["pids"][0].as_u64().unwrap() as u32;
        // cudatrace cannot answer while it is stopped itself: the command, stopped in its
        // open of the library, waits for it.
        signal(tracer.id(), libc::SIGSTOP);
        signal(command, libc::SIGUSR1);
        wait_until("the command is stopped", || state(command) == Some('T'));
        signal(tracer.id(), signal_number);
        signal(tracer.id(), libc::SIGCONT);
        assert_eq!(tracer.wait().unwrap().code(), Some(code), "{signal_name}");
        wait_until("the command runs again", || state(command) != Some('T'));
        if signal_number == libc::SIGINT {
            // It goes on by itself, untraced from now on.
            assert_eq!(read_line(&mut out), "opened\n");
            signal(command, libc::SIGUSR1);
        }
        wait_until("the command ends", || {
            matches!(state(command), None | Some('Z'))
        });
        let trace = read_trace(&trace_path);
        assert_complete(&trace);
        assert_eq!(footer(&trace)["stopped_by"], signal_name);
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
    }
}

/// `cudatrace keeper` processes running now.
fn keepers() -> Vec<u32> {
    // This build's keepers only: other checkouts' tests may run beside these.
    let ours = std::fs::canonicalize(CUDATRACE).unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.ends_with(b"\0keeper\0"))
                && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == ours)
        })
        .collect()
}

#[test]
fn a_process_stopped_while_cudatrace_is_killed_is_continued_by_its_keeper() {
    let Some(_guard) = root() else { return };
    let dir = scratch("left-stopped-kill");
    let lib = copy_standin(&dir, "lib/libcuda.so.1");
    let before = keepers();
    let trace_path = dir.join("killed.jsonl");
    let mut tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "-o"])
        .arg(&trace_path)
        .args(["--", loader().to_str().unwrap(), lib.to_str().unwrap()])
        .arg("stop-here")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(tracer.stdout.take().unwrap());
    assert_eq!(read_line(&mut out), "ready\n");
    let command = header_of(&trace_path)["pids"][0].as_u64().unwrap() as u32;
    let keeper: Vec<u32> = keepers()
        .into_iter()
        .filter(|k| !before.contains(k))
        .collect();
    assert_eq!(keeper.len(), 1, "one keeper for the run");
    // Stopped in its open of the library, while cudatrace cannot answer, then cudatrace
    // is killed outright: nothing of its own can continue the command.
    signal(tracer.id(), libc::SIGSTOP);
    signal(command, libc::SIGUSR1);
    wait_until("the command is stopped", || state(command) == Some('T'));
    signal(tracer.id(), libc::SIGKILL);
    assert_eq!(tracer.wait().unwrap().signal(), Some(libc::SIGKILL));
    wait_until("the command runs again", || state(command) != Some('T'));
    // It goes on by itself, untraced, and ends.
    assert_eq!(read_line(&mut out), "opened\n");
    signal(command, libc::SIGUSR1);
    wait_until("the command ends", || {
        matches!(state(command), None | Some('Z'))
    });
    wait_until("the keeper is gone", || state(keeper[0]).is_none());
    let mut said = String::new();
    tracer
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert!(
        said.contains(&format!(
            "keeper: continued pid {command}, which cudatrace had stopped"
        )),
        "{said}"
    );

    // A run that ends well leaves no keeper and the keeper says nothing.
    let output = cudatrace(
        &dir.join("well.jsonl"),
        &[],
        &[
            loader().to_str().unwrap(),
            lib.to_str().unwrap(),
            "calls",
            "2",
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!stderr(&output).contains("keeper"), "{}", stderr(&output));
    let left: Vec<u32> = keepers()
        .into_iter()
        .filter(|k| !before.contains(k))
        .collect();
    assert_eq!(left, Vec::<u32>::new());
}

#[test]
fn dash_dash_lib_adds_a_library_under_any_name_and_bad_ones_are_refused() {
    let Some(_guard) = root() else { return };
    let dir = scratch("dash-lib");
    let renamed = copy_standin(&dir, "vendor/libgpu-runtime.so");
    let trace_path = dir.join("lib.jsonl");
    let command = [
        loader().to_str().unwrap(),
        renamed.to_str().unwrap(),
        "calls",
        "3",
    ];
    let output = cudatrace(&trace_path, &["--lib", renamed.to_str().unwrap()], &command);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    let id = library_id(&trace, &renamed);
    let line = libraries(&trace)
        .into_iter()
        .find(|l| l["id"] == id)
        .unwrap();
    assert_eq!(
        (&line["set"], &line["found"]),
        (&"libcuda".into(), &"explicit".into())
    );
    let pid = command_pid(&trace);
    assert_eq!(
        call_counts(&trace),
        BTreeMap::from([
            (key("cuInit", pid, id), 1),
            (key("cuCtxSynchronize", pid, id), 3)
        ])
    );

    // Without --lib, a library under another name is not recognised: nothing is traced,
    // and cudatrace says so.
    let trace_path = dir.join("without.jsonl");
    let output = cudatrace(&trace_path, &[], &command);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(calls(&read_trace(&trace_path)).len(), 0);
    assert!(
        stderr(&output).contains("WARNING: no traced process loaded libcuda"),
        "{}",
        stderr(&output)
    );

    let not_elf = dir.join("notes.txt");
    std::fs::write(&not_elf, "not a library").unwrap();
    let output = cudatrace(
        &dir.join("x.jsonl"),
        &["--lib", not_elf.to_str().unwrap()],
        &["true"],
    );
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(&format!("{} is not an ELF", not_elf.display())),
        "{}",
        stderr(&output)
    );
    // A real library, but none cudatrace probes: the loader program itself is ELF.
    let output = cudatrace(
        &dir.join("x.jsonl"),
        &["--lib", loader().to_str().unwrap()],
        &["true"],
    );
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("not a library cudatrace probes"),
        "{}",
        stderr(&output)
    );
    assert!(!dir.join("x.jsonl").exists());
}

#[test]
fn a_command_that_loads_no_library_ends_with_a_warning() {
    let Some(_guard) = root() else { return };
    let trace_path = scratch("no-library").join("trace.jsonl");
    let output = cudatrace(&trace_path, &[], &["true"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(
            "cudatrace: WARNING: no traced process loaded libcuda or libnccl or libcupti: nothing to trace"
        ),
        "{}",
        stderr(&output)
    );
    assert_complete(&read_trace(&trace_path));
}

#[test]
fn a_library_opened_many_times_is_attached_once() {
    let Some(_guard) = root() else { return };
    let dir = scratch("reopen");
    let lib = copy_standin(&dir, "lib/libcuda.so.1");
    let trace_path = dir.join("trace.jsonl");
    let output = cudatrace(
        &trace_path,
        &[],
        &[
            loader().to_str().unwrap(),
            lib.to_str().unwrap(),
            "reopen",
            "50",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    assert_eq!(libraries(&trace).len(), 1);
    let pid = command_pid(&trace);
    let id = library_id(&trace, &lib);
    assert_eq!(
        call_counts(&trace),
        BTreeMap::from([(key("cuInit", pid, id), 50)])
    );
    let stops = &footer(&trace)["stops"];
    // Every dlopen opens the file again (dlclose unmapped it) and waits for the check.
    assert_eq!(stops["count"], 50, "{stops}");
    eprintln!(
        "50 opens: {} ms stopped in all, {} ms at most",
        stops["total_ns"].as_u64().unwrap() / 1_000_000,
        stops["max_ns"].as_u64().unwrap() / 1_000_000
    );
}

#[test]
fn dash_p_finds_the_library_in_the_process_maps() {
    let Some(_guard) = root() else { return };
    let dir = scratch("dash-p-maps");
    let lib = copy_standin(&dir, "opt/lib/libcuda.so.1");
    let (mut target, mut target_out) = start_stop_here(&lib);
    signal(target.id(), libc::SIGUSR1);
    assert_eq!(read_line(&mut target_out), "opened\n");
    let trace_path = dir.join("trace.jsonl");
    let mut tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "-o"])
        .arg(&trace_path)
        .args(["-p", &target.id().to_string()])
        .spawn()
        .unwrap();
    header_of(&trace_path);
    signal(target.id(), libc::SIGUSR1);
    assert!(target.wait().unwrap().success());
    assert!(tracer.wait().unwrap().success());
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let id = library_id(&trace, &lib);
    let line = libraries(&trace)
        .into_iter()
        .find(|l| l["id"] == id)
        .unwrap();
    let pid = u64::from(target.id());
    assert_eq!(
        (&line["found"], &line["pid"]),
        (&Value::from("mapped"), &Value::from(pid))
    );
    // cuInit ran before cudatrace started: only the later call is there.
    assert_eq!(
        call_counts(&trace),
        BTreeMap::from([(key("cuMemAlloc_v2", pid, id), 1)])
    );
}

/// A `-p` window is for the process's calls: it is placed once the probes are attached
/// (attaching takes its time; a window placed before lost a slow machine's calls, or all of
/// a short window's).
#[test]
fn a_dash_p_window_starts_once_the_probes_are_attached() {
    let Some(_guard) = root() else { return };
    let dir = scratch("dash-p-window");
    let lib = copy_standin(&dir, "opt/lib/libcuda.so.1");
    let (mut target, mut target_out) = start_stop_here(&lib);
    signal(target.id(), libc::SIGUSR1);
    assert_eq!(read_line(&mut target_out), "opened\n");
    let trace_path = dir.join("trace.jsonl");
    let tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "--duration", "20s", "-o"])
        .arg(&trace_path)
        .args(["-p", &target.id().to_string()])
        .env("CUDATRACE_PHASES", "1")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    header_of(&trace_path);
    signal(target.id(), libc::SIGUSR1);
    assert!(target.wait().unwrap().success());
    let output = tracer.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let attached: u64 = stderr
        .lines()
        .find_map(|line| line.strip_prefix("cudatrace-phase probes_attached "))
        .and_then(|rest| rest.split_once("mono_ns="))
        .map(|(_, ns)| ns.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no probes_attached phase: {stderr}"));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let window = &trace[0]["window"];
    let start = window["start_monotonic_ns"].as_u64().unwrap();
    assert!(
        start >= attached,
        "the window starts {} ns before the probes were attached",
        attached - start
    );
    assert_eq!(
        window["end_monotonic_ns"].as_u64().unwrap() - start,
        20_000_000_000
    );
    let pid = u64::from(target.id());
    let id = library_id(&trace, &lib);
    assert_eq!(
        call_counts(&trace),
        BTreeMap::from([(key("cuMemAlloc_v2", pid, id), 1)])
    );
}

#[test]
fn a_library_only_the_process_can_see_is_read_through_its_fd() {
    let Some(_guard) = root() else { return };
    let dir = scratch("mount-ns");
    let lib = copy_standin(&dir, "source/libcuda.so.1");
    // A mount namespace of the command's own, as a container has: the library is copied
    // onto a tmpfs mounted there, at a path that holds nothing in cudatrace's.
    let hidden = dir.join("container");
    std::fs::create_dir_all(&hidden).unwrap();
    let inside = hidden.join("libcuda.so.1");
    let script = format!(
        "mount -t tmpfs none {hidden} && cp {lib} {inside} && {loader} {inside} calls 4",
        hidden = hidden.display(),
        lib = lib.display(),
        inside = inside.display(),
        loader = loader().display(),
    );
    let trace_path = dir.join("trace.jsonl");
    let output = cudatrace(
        &trace_path,
        &[],
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!inside.exists(), "the tmpfs is the command's alone");
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let id = library_id(&trace, &inside);
    let counts: BTreeMap<String, u64> = call_counts(&trace)
        .into_iter()
        .filter(|((_, _, lib), _)| *lib == id)
        .map(|((name, _, _), count)| (name, count))
        .collect();
    assert_eq!(
        counts,
        BTreeMap::from([("cuInit".to_owned(), 1), ("cuCtxSynchronize".to_owned(), 4)])
    );
}

#[test]
fn shells_and_python_subprocesses_run_their_stopped_children_to_the_end() {
    let Some(_guard) = root() else { return };
    let dir = scratch("parents");
    let lib = copy_standin(&dir, "lib/libcuda.so.1");
    let (loader, lib) = (loader().to_str().unwrap(), lib.to_str().unwrap());
    // Each child is stopped when it opens the library (and the fork child again): the
    // parents wait for them as usual and see them exit 0.
    let python = format!(
        "import os, subprocess\n\
         print('run', subprocess.run(['{loader}', '{lib}', 'calls', '2']).returncode)\n\
         print('popen', subprocess.Popen(['{loader}', '{lib}', 'fork']).wait())\n\
         pid = os.fork()\n\
         if pid == 0:\n    os.execv('{loader}', ['{loader}', '{lib}', 'calls', '1'])\n\
         print('fork', os.waitpid(pid, 0)[1])\n"
    );
    let trace_path = dir.join("python.jsonl");
    let output = cudatrace(&trace_path, &[], &["python3", "-c", &python]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // Python's own lines are buffered, its children's are not: compare them sorted.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["1", "2", "fork 0", "popen 0", "run 0"]);
    // cuInit + 2, cuInit + 2 allocations, cuInit + 1.
    assert_eq!(calls(&read_trace(&trace_path)).len(), 8);

    let trace_path = dir.join("bash.jsonl");
    let script = format!("{loader} {lib} calls 3; echo rc=$?; {loader} {lib} fork; echo rc=$?");
    let output = cudatrace(&trace_path, &[], &["bash", "-c", &script]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "3\nrc=0\nrc=0\n");
    assert_eq!(calls(&read_trace(&trace_path)).len(), 7);
}

#[test]
fn a_process_killed_while_stopped_ends_the_run_normally() {
    let Some(_guard) = root() else { return };
    let dir = scratch("killed-stopped");
    let lib = copy_standin(&dir, "lib/libcuda.so.1");
    let trace_path = dir.join("trace.jsonl");
    let mut tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "-o"])
        .arg(&trace_path)
        .args(["--", loader().to_str().unwrap(), lib.to_str().unwrap()])
        .arg("stop-here")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(tracer.stdout.take().unwrap());
    assert_eq!(read_line(&mut out), "ready\n");
    let command = header_of(&trace_path)["pids"][0].as_u64().unwrap() as u32;
    signal(tracer.id(), libc::SIGSTOP);
    signal(command, libc::SIGUSR1);
    wait_until("the command is stopped", || state(command) == Some('T'));
    signal(command, libc::SIGKILL);
    signal(tracer.id(), libc::SIGCONT);
    assert_eq!(
        tracer.wait().unwrap().code(),
        Some(128 + libc::SIGKILL),
        "the command's fate is cudatrace's exit code"
    );
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    assert_eq!(footer(&trace)["exit_signal"], libc::SIGKILL);
    assert_eq!(calls(&trace).len(), 0);
}
