//! Root: `cudatrace run -p PID --gpu` on programs that started untraced and loop on the
//! stand-in libcuda (standin/README.md: kernel duration = gridX ns, GPU start = API end +
//! 1000 ns). The library goes in through the program's own `dlopen`, records for the
//! window, and leaves: exact counts in the window, and the program finishing by itself
//! with its own output and exit code, nothing of cudatrace's left recording.

mod common;

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Output, Stdio},
    sync::OnceLock,
};

use common::{gpu::cupti_standin, *};
use serde_json::{Value, json};

/// `tests/c/SOURCE` built as `name` next to the stand-in libcuda (linked with it when
/// `libcuda`), with `extra` flags.
fn c_program(name: &str, source: &str, libcuda: bool, extra: &[&str]) -> PathBuf {
    let dir = &standin().dir;
    cupti_standin();
    let program = dir.join(name);
    let source = format!("{}/tests/c/{source}", env!("CARGO_MANIFEST_DIR"));
    let link = format!("-L{}", dir.display());
    let mut args = C_FLAGS.to_vec();
    args.extend(["-o", program.to_str().unwrap(), &source]);
    if libcuda {
        args.extend([link.as_str(), "-l:libcuda.so.1", "-Wl,-rpath,$ORIGIN"]);
    }
    args.extend(extra);
    gcc(&args);
    program
}

/// `tests/c/attach_loop.c`, built next to the stand-in libcuda.
fn attach_loop() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| c_program("attach-loop", "attach_loop.c", true, &["-lpthread"]))
}

/// `tests/c/seccomp_exec.c`: runs a program under a seccomp filter.
fn seccomp_exec() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| c_program("seccomp-exec", "seccomp_exec.c", false, &[]))
}

/// A program started untraced, once it said "ready".
struct Target {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Target {
    fn start(command: &mut Command) -> Target {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_remove("CUDA_INJECTION64_PATH")
            .spawn()
            .expect("starting the target");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        Target { child, stdout }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the program to end by itself: its exit code and the rest of its output.
    fn finish(mut self) -> (i32, String, String) {
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        let status = self.child.wait().unwrap();
        let mut stderr = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        (status.code().unwrap_or(-1), rest, stderr)
    }
}

/// `cudatrace run -p PID --gpu --cupti STANDIN --libcuda STANDIN -o TRACE [extra]`.
fn attach(pid: u32, trace: &Path, extra: &[&str]) -> Output {
    attach_with(pid, trace, &standin().lib, &cupti_standin().lib, extra)
}

/// [`attach`] with these stand-ins.
fn attach_with(pid: u32, trace: &Path, libcuda: &Path, cupti: &Path, extra: &[&str]) -> Output {
    Command::new(CUDATRACE)
        .args(["run", "--gpu", "--missing-probes", "ignore", "--cupti"])
        .arg(cupti)
        .arg("--libcuda")
        .arg(libcuda)
        .arg("-p")
        .arg(pid.to_string())
        .arg("-o")
        .arg(trace)
        .args(extra)
        // Each phase's time on stderr (`cudatrace-phase NAME ...`): checked below.
        .env("CUDATRACE_PHASES", "1")
        .output()
        .expect("running cudatrace")
}

/// The phases `CUDATRACE_PHASES=1` said, in order (`tracer/src/phases.rs`).
fn phases(said: &str) -> Vec<&str> {
    said.lines()
        .filter_map(|line| line.strip_prefix("cudatrace-phase ")?.split(' ').next())
        .collect()
}

fn of_type<'a>(trace: &'a [Value], kind: &str) -> Vec<&'a Value> {
    trace.iter().filter(|l| l["type"] == kind).collect()
}

/// The mean launch times the program printed ("at I: MEAN ns").
fn means(output: &str) -> Vec<u64> {
    output
        .lines()
        .filter_map(|line| line.strip_prefix("at "))
        .filter_map(|rest| rest.split(": ").nth(1)?.strip_suffix(" ns")?.parse().ok())
        .collect()
}

/// Every launch of the window: its kernel, linked by correlation id, or a counted reason;
/// the program's own ending unchanged.
#[test]
fn a_c_program_is_attached_for_the_window_and_finishes_by_itself() {
    let Some(_root) = root() else { return };
    let mut command = Command::new(attach_loop());
    command.args(["4000", "1000"]);
    let target = Target::start(&mut command);
    let pid = target.pid();
    let trace_path = scratch("attach-c").join("trace.jsonl");
    let output = assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "2s"]));
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!("cudatrace: --gpu: attached to process {pid}")),
        "{said}"
    );
    let (code, rest, program_stderr) = target.finish();
    assert_eq!(code, 7, "{program_stderr}");
    assert!(
        rest.ends_with("done 4000 launches, 0 failed\nrecording 0\n"),
        "{rest}"
    );
    assert_eq!(program_stderr, "");

    assert_window(&trace_path, pid, "_Z9attach_mev");
    // "ready" came before the first of them: the first is before the attach.
    let means = means(&rest);
    assert_eq!(means.len(), 40, "{rest}");
    let before = means[0];
    let after = means[means.len() - 5..].iter().min().copied().unwrap();
    // A probe left behind costs its trap on every launch (11 to 20 µs a uprobe on this
    // VM, against a few hundred ns a launch): the bound leaves room for a loaded machine
    // (this suite's other attaches run beside it) and none for a trap.
    assert!(
        after <= 4 * before + 2_000,
        "launches took {before} ns before the attach, {after} ns after it: {means:?}"
    );
}

/// `tests/c/attach_fork.c`, built next to the stand-in libcuda.
fn attach_fork() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| c_program("attach-fork", "attach_fork.c", true, &[]))
}

/// A child the attached process starts after the attach: its calls are traced (-p follows
/// children), before and after its exec; the library does not follow it (a fork child's
/// copy leaves CUPTI alone, the exec'd program has none), so it has no GPU lines, its 50
/// launches are counted `not_recorded`, and stderr says so; the parent's window is exact.
#[test]
fn a_child_started_after_the_attach_is_traced_and_its_gpu_side_counted_not_recorded() {
    let Some(_root) = root() else { return };
    let mut command = Command::new(attach_fork());
    command.args(["4000", "1000"]);
    let target = Target::start(&mut command);
    let pid = target.pid();
    let trace_path = scratch("attach-fork").join("trace.jsonl");
    let output = assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "3s"]));
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    let (code, rest, program_stderr) = target.finish();
    assert_eq!(code, 7, "{program_stderr}");
    assert!(
        rest.starts_with("child exited 5\ndone 4000 launches, 0 failed\nforked at "),
        "{rest:?}"
    );

    let trace = read_trace(&trace_path);
    let events = of_type(&trace, "process");
    let forks: Vec<&&Value> = events.iter().filter(|e| e["event"] == "fork").collect();
    assert_eq!(forks.len(), 1, "{events:?}");
    assert_eq!(forks[0]["pid"], json!(pid));
    let child = u(&forks[0]["child_pid"]) as u32;
    let of_child: Vec<(&Value, &Value)> = events
        .iter()
        .filter(|e| e["pid"] == child)
        .map(|e| (&e["event"], &e["filename"]))
        .collect();
    assert_eq!(
        of_child,
        [
            (&json!("exec"), &json!("/proc/self/exe")),
            (&json!("exit"), &Value::Null)
        ]
    );
    // Its calls: 30 launches in the forked image, then the exec'd program's set-up and its
    // 20 launches.
    let calls: Vec<(&str, Option<u64>)> = of_type(&trace, "call")
        .into_iter()
        .filter(|c| c["pid"] == child)
        .map(|c| (c["name"].as_str().unwrap(), c["grid"][0].as_u64()))
        .collect();
    let set_up = [
        "cuInit",
        "cuDevicePrimaryCtxRetain",
        "cuCtxSetCurrent",
        "cuModuleLoadData",
        "cuModuleGetFunction",
    ];
    let expected: Vec<(&str, Option<u64>)> = std::iter::repeat_n(("cuLaunchKernel", Some(7)), 30)
        .chain(set_up.iter().map(|name| (*name, None)))
        .chain(std::iter::repeat_n(("cuLaunchKernel", Some(9)), 20))
        .collect();
    assert_eq!(calls, expected);
    assert!(
        of_type(&trace, "gpu_kernel")
            .iter()
            .all(|k| k["pid"] == pid),
        "no GPU line of the child"
    );
    assert!(
        said.contains(&format!(
            "cudatrace: --gpu: process {child}, started after the attach, made 55 CUDA driver \
             calls in the window: the injection library does not follow new processes (a fork \
             child's copy leaves CUPTI alone, an exec'd program has none), so its launches, \
             copies and memsets are counted not_recorded\n"
        )),
        "{said}"
    );
    // The parent's window as in the other tests, beside the child's 50 launches.
    assert_window_beside(&trace_path, pid, "_Z9attach_mev", 50);
}

/// The anonymous files process `pid` holds open (their links in `/proc/PID/fd`), sorted.
fn memfds(pid: u32) -> Vec<String> {
    let mut links: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                .map(|link| link.display().to_string())
                .filter(|link| link.starts_with("/memfd:"))
                .collect()
        })
        .unwrap_or_default();
    links.sort();
    links
}

/// The descriptors of process `pid` open on anonymous files, with their links, by number.
fn memfd_descriptors(pid: u32) -> Vec<(u32, String)> {
    let mut found: Vec<(u32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let link = std::fs::read_link(entry.path()).ok()?.display().to_string();
            let number = entry.file_name().to_str()?.parse().ok()?;
            link.starts_with("/memfd:").then_some((number, link))
        })
        .collect();
    found.sort();
    found
}

/// Where the library's descriptor goes in process `pid`: 1000, or three quarters of its
/// soft limit of open files where that is lower (`target::library_fd_floor`).
fn library_fd_floor(pid: u32) -> u32 {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft: u32 = limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap();
    1000.min(soft * 3 / 4)
}

/// After an attach and its window, the dynamic loader's name for the library (what
/// `dladdr` answers, `/proc/self/fd/N`) still opens to the library: N is the one anonymous
/// file cudatrace leaves open, at the floor (1000, or 3/4 of the soft limit of open
/// files), close-on-exec; the control file's descriptor is closed; the program's own
/// `open` afterwards gets its low number (3), not the library's. Before, the trampoline
/// closed N as well, and the loader's name then named whatever the program opened next
/// (here /dev/null).
#[test]
fn the_loaders_name_for_the_library_still_names_it_after_the_window() {
    let Some(_root) = root() else { return };
    let mut command = Command::new(attach_loop());
    command
        .args(["3000", "1000"])
        .env("ATTACH_LOOP_LOADER", "1");
    let target = Target::start(&mut command);
    let pid = target.pid();
    let floor = library_fd_floor(pid);
    let trace_path = scratch("attach-loader-name").join("trace.jsonl");
    let output = assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "1s"]));
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    let library = read_trace(&trace_path)[0]["gpu"]["library"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        library.starts_with("/memfd:libcudatrace_inject-"),
        "{library}"
    );
    assert_eq!(
        memfd_descriptors(pid),
        vec![(floor, format!("{library} (deleted)"))]
    );
    let flags = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{floor}")).unwrap();
    let flags = flags
        .lines()
        .find_map(|line| line.strip_prefix("flags:"))
        .map(|octal| u32::from_str_radix(octal.trim(), 8).unwrap())
        .unwrap();
    assert_eq!(flags & libc::O_CLOEXEC as u32, libc::O_CLOEXEC as u32);
    let (code, rest, program_stderr) = target.finish();
    assert_eq!((code, program_stderr.as_str()), (7, ""), "{rest}");
    assert!(
        rest.ends_with(&format!(
            "done 3000 launches, 0 failed\nrecording 0\nown file 3\n\
             library known as /proc/self/fd/{floor}: the library\n"
        )),
        "{rest}"
    );
}

/// `sh -c SCRIPT PROGRAM ARGS...` in a mount namespace of its own (`unshare --mount
/// --propagation private`): SCRIPT mounts what the test wants, then `exec "$0" "$@"`.
fn in_own_mount_namespace(script: &str, program: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!("{script} && exec \"$0\" \"$@\""))
        .arg(program)
        .args(args);
    command
}

/// `attach_loop` and the stand-ins it loads where a tmpfs over /tmp and /run does not hide
/// them: where they are, or, for a checkout under either (CI's fresh clone), copies in a
/// folder of /var/tmp removed at the end.
struct OutsideTmp {
    program: PathBuf,
    libcuda: PathBuf,
    cupti: PathBuf,
    copied: Option<PathBuf>,
}

impl OutsideTmp {
    fn new() -> OutsideTmp {
        let dir = &standin().dir;
        let (program, libcuda, cupti) = (attach_loop(), &standin().lib, &cupti_standin().lib);
        if !(dir.starts_with("/tmp") || dir.starts_with("/run")) {
            return OutsideTmp {
                program: program.to_owned(),
                libcuda: libcuda.clone(),
                cupti: cupti.clone(),
                copied: None,
            };
        }
        let copies = Path::new("/var/tmp").join(format!(
            "cudatrace-mntns-{}-{}",
            std::process::id(),
            std::thread::current()
                .name()
                .unwrap_or("test")
                .replace("::", "-")
        ));
        // A new folder of root's own: /var/tmp is everyone's, and a name planted there
        // (a link) fails the creation rather than being written through.
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&copies)
            .unwrap_or_else(|e| panic!("creating {}: {e}", copies.display()));
        let copy = |from: &Path| {
            let to = copies.join(from.file_name().unwrap());
            std::fs::copy(from, &to).unwrap();
            to
        };
        // The program finds libcuda beside itself (`$ORIGIN`).
        OutsideTmp {
            program: copy(program),
            libcuda: copy(libcuda),
            cupti: copy(cupti),
            copied: Some(copies),
        }
    }
}

impl Drop for OutsideTmp {
    fn drop(&mut self) {
        if let Some(copies) = &self.copied {
            let _ = std::fs::remove_dir_all(copies);
        }
    }
}

/// A namespace link of a process (`/proc/PID/ns/KIND`).
fn namespace(pid: &str, kind: &str) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap()
}

/// A process in a mount namespace of its own where nothing cudatrace writes can be seen (a
/// fresh tmpfs over /tmp and /run: a container's view of them): the library goes in as an
/// anonymous file, the control file too, and the window is as exact as in cudatrace's own
/// namespace; the program ends by itself with its own code.
#[test]
fn a_process_in_another_mount_namespace_is_attached_through_anonymous_files() {
    let Some(_root) = root() else { return };
    let files = OutsideTmp::new();
    let mut command = in_own_mount_namespace(
        "mount -t tmpfs none /tmp && mount -t tmpfs none /run",
        &files.program,
        &["4000", "1000"],
    );
    let target = Target::start(&mut command);
    let pid = target.pid();
    assert_ne!(namespace(&pid.to_string(), "mnt"), namespace("self", "mnt"));
    let trace_path = scratch("attach-mount-ns").join("trace.jsonl");
    let output = assert_no_probe_outlives(|| {
        attach_with(
            pid,
            &trace_path,
            &files.libcuda,
            &files.cupti,
            &["--duration", "2s"],
        )
    });
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!("cudatrace: --gpu: attached to process {pid}:")),
        "{said}"
    );
    // Nothing of cudatrace's in its /tmp and /run (where the run's own folder is, here).
    for folder in ["tmp", "run"] {
        let entries = std::fs::read_dir(format!("/proc/{pid}/root/{folder}"))
            .unwrap()
            .count();
        assert_eq!(entries, 0, "/{folder}");
    }
    let name = |line: &str| {
        line.split_whitespace()
            .skip(5)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let library: std::collections::BTreeSet<String> = maps
        .lines()
        .filter(|line| line.contains("libcudatrace_inject"))
        .map(name)
        .collect();
    assert_eq!(library.len(), 1, "{library:?}");
    let library = library.into_iter().next().unwrap();
    assert!(
        library.starts_with("/memfd:libcudatrace_inject-") && library.ends_with(".so (deleted)"),
        "{library}"
    );
    let trace = read_trace(&trace_path);
    assert_eq!(
        trace[0]["gpu"]["library"],
        json!(library.trim_end_matches(" (deleted)"))
    );
    let lines: Vec<&Value> = of_type(&trace, "library")
        .into_iter()
        .filter(|l| l["path"] == json!(library))
        .collect();
    assert_eq!(lines.len(), 1, "its probes' library line");
    // The trampoline closed the control file's descriptor; the library's stays, high, for
    // the loader's name of it (`/proc/self/fd/N`).
    assert_eq!(
        memfd_descriptors(pid),
        vec![(library_fd_floor(pid), library.clone())]
    );
    let (code, rest, program_stderr) = target.finish();
    assert_eq!(code, 7, "{program_stderr}");
    assert!(
        rest.ends_with("done 4000 launches, 0 failed\nrecording 0\n"),
        "{rest}"
    );
    assert_eq!(program_stderr, "");
    assert_window(&trace_path, pid, "_Z9attach_mev");
}

/// A process in a PID namespace of its own (`unshare --pid --fork --mount-proc`, as a
/// container's): the library would find neither cudatrace nor its window's end by pid, so
/// it is refused, saying what would work; `doctor -p` says so beforehand; the program ends
/// as it would have.
#[test]
fn a_process_in_another_pid_namespace_is_refused_and_doctor_says_why() {
    let Some(_root) = root() else { return };
    let mut command = Command::new("unshare");
    command
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(attach_loop())
        .args(["3000", "1000"]);
    let target = Target::start(&mut command);
    let unshare = target.pid();
    let children =
        std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap();
    let pid: u32 = children.trim().parse().unwrap();
    assert_ne!(namespace(&pid.to_string(), "pid"), namespace("self", "pid"));
    let why = format!(
        "process {pid} runs in another PID namespace (a container): the injection library \
         finds cudatrace, and its window's end, by pids the process cannot see; run it with \
         the host's PID namespace (docker --pid=host) or start it under `cudatrace run --gpu`"
    );
    let (code, line) = doctor(pid);
    assert_eq!(code, Some(1), "{line}");
    assert_eq!(line, format!("FAIL attach_gpu           {why}"));
    let trace_path = scratch("attach-pid-ns").join("trace.jsonl");
    let output = attach(pid, &trace_path, &["--duration", "1s"]);
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(83), "{said}");
    assert_eq!(
        said,
        format!("cudatrace: error: --gpu: cannot attach to process {pid}: {why}\n")
    );
    assert!(!trace_path.exists(), "no trace when nothing started");
    let (code, rest, program_stderr) = target.finish();
    assert_eq!(
        (
            code,
            rest.ends_with("done 3000 launches, 0 failed\nrecording -1\n")
        ),
        (7, true),
        "{rest}{program_stderr}"
    );
}

/// A process in a mount namespace of its own where the libcupti cudatrace would have the
/// library load is not at its path (under a /tmp of cudatrace's own, hidden there by a
/// tmpfs): refused before anything is done to it, saying what is needed; the program ends
/// as it would have.
#[test]
fn a_process_whose_root_lacks_the_libcupti_is_refused() {
    let Some(_root) = root() else { return };
    let hidden = std::env::temp_dir().join(format!("cudatrace-cupti-{}", std::process::id()));
    std::fs::create_dir_all(&hidden).unwrap();
    let cupti = hidden.join("libcupti.so.13");
    std::fs::copy(&cupti_standin().lib, &cupti).unwrap();
    let files = OutsideTmp::new();
    let mut command = in_own_mount_namespace(
        "mount -t tmpfs none /tmp",
        &files.program,
        &["3000", "1000"],
    );
    let target = Target::start(&mut command);
    let pid = target.pid();
    let trace_path = scratch("attach-no-cupti").join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "--gpu", "--missing-probes", "ignore", "--cupti"])
        .arg(&cupti)
        .arg("--libcuda")
        .arg(&files.libcuda)
        .args(["-p", &pid.to_string(), "-o"])
        .arg(&trace_path)
        .args(["--duration", "1s"])
        .output()
        .unwrap();
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(83), "{said}");
    assert_eq!(
        said,
        format!(
            "cudatrace: error: --gpu: cannot attach to process {pid}: libcupti {} is not at \
             that path in its root (it runs in another mount namespace, a container), where \
             the injection library would load it; pass --cupti with a libcupti at the same \
             path in both roots, or let the program load its own first\n",
            cupti.display()
        )
    );
    assert!(!trace_path.exists(), "no trace when nothing started");
    let (code, rest, program_stderr) = target.finish();
    assert_eq!(
        (
            code,
            rest.ends_with("done 3000 launches, 0 failed\nrecording -1\n")
        ),
        (7, true),
        "{rest}{program_stderr}"
    );
    std::fs::remove_dir_all(&hidden).unwrap();
}

/// A process whose root has no /proc (a tmpfs over it): it could not load the library
/// from its anonymous file, so it is refused before anything is done to it, and `doctor
/// -p` says so beforehand; the program ends as it would have.
#[test]
fn a_process_without_proc_in_its_root_is_refused_and_doctor_says_why() {
    let Some(_root) = root() else { return };
    let mut command = in_own_mount_namespace(
        "mount -t tmpfs none /proc",
        attach_loop(),
        &["3000", "1000"],
    );
    // Without /proc the loader cannot find `$ORIGIN` (/proc/self/exe): the folder by name.
    command.env("LD_LIBRARY_PATH", attach_loop().parent().unwrap());
    let target = Target::start(&mut command);
    let pid = target.pid();
    let why = format!(
        "process {pid} has no /proc in its root (a container without one): the injection \
         library goes in as an anonymous file, which the process loads through \
         /proc/self/fd; mount /proc in its root, or start it under `cudatrace run --gpu`"
    );
    let (code, line) = doctor(pid);
    assert_eq!(code, Some(1), "{line}");
    assert_eq!(line, format!("FAIL attach_gpu           {why}"));
    let trace_path = scratch("attach-no-proc").join("trace.jsonl");
    let output = attach(pid, &trace_path, &["--duration", "1s"]);
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(83), "{said}");
    assert_eq!(
        said,
        format!("cudatrace: error: --gpu: cannot attach to process {pid}: {why}\n")
    );
    assert!(!trace_path.exists(), "no trace when nothing started");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("TracerPid:\t0\n"), "never seized");
    let (code, rest, program_stderr) = target.finish();
    assert_eq!(
        (
            code,
            rest.ends_with("done 3000 launches, 0 failed\nrecording -1\n")
        ),
        (7, true),
        "{rest}{program_stderr}"
    );
}

/// Every launch of the window: its kernel, linked by correlation id, or a counted reason.
fn assert_window(trace_path: &Path, pid: u32, mangled: &str) {
    assert_window_beside(trace_path, pid, mangled, 0);
}

/// [`assert_window`] for process `pid`'s launches, beside `others` launches of other
/// processes (children started after the attach), every one of them counted
/// `not_recorded`.
fn assert_window_beside(trace_path: &Path, pid: u32, mangled: &str, others: u64) {
    let trace = read_trace(trace_path);
    assert_complete_with_losses(&trace);
    let footer = trace.last().unwrap();
    let launches: Vec<&Value> = of_type(&trace, "call")
        .into_iter()
        .filter(|c| c["name"] == "cuLaunchKernel" && c["pid"] == pid)
        .collect();
    let kernels = of_type(&trace, "gpu_kernel");
    assert!(launches.len() > 100, "{} launches", launches.len());
    let gpu = &footer["gpu"];
    let issuing = &gpu["issuing"];
    // Each kernel is its launch's (the call it names is a launch line of the trace, with
    // the grid it asked for; its duration is grid X ns), correlation ids one after another
    // from the first kernel's. The stand-in numbers every call it hooks: a launch hooked
    // before the library enabled kernel records has an id and no kernel (below).
    let launch_at: std::collections::HashMap<u64, &Value> =
        launches.iter().map(|c| (u(&c["ts_ns"]), *c)).collect();
    let first_id = u(&kernels[0]["correlation_id"]);
    for (index, kernel) in kernels.iter().enumerate() {
        let call = launch_at[&u(&kernel["call_ts_ns"])];
        assert_eq!(kernel["grid"], call["grid"], "{kernel}");
        assert_eq!(u(&kernel["dur_ns"]), u(&kernel["grid"][0]), "{kernel}");
        assert_eq!(u(&kernel["correlation_id"]), first_id + index as u64);
        assert_eq!(
            (&kernel["pid"], &kernel["kernel_mangled"]),
            (&json!(pid), &json!(mangled))
        );
    }
    // The launches of the window, in order: those made before CUPTI recorded (between the
    // probes and the library's start), then one per kernel line, then those whose kernel
    // ran after the window's end (analysed, not written). Counted: with work, or
    // `not_recorded` (with the launches after the window), none missing.
    let before = launches
        .iter()
        .position(|call| call["ts_ns"] == kernels[0]["call_ts_ns"])
        .unwrap();
    // The ids before the first kernel's went to launches of the window without one.
    assert!(
        first_id <= before as u64 + 1,
        "the first kernel's correlation id {first_id}, {before} launches before it"
    );
    assert!(
        launches[before..]
            .iter()
            .zip(&kernels)
            .all(|(call, kernel)| call["ts_ns"] == kernel["call_ts_ns"]),
        "one kernel line for each launch from the first recorded one"
    );
    let beyond = launches.len() - before - kernels.len();
    let after_window = u(&issuing["calls"]) - launches.len() as u64 - others;
    assert!(
        beyond <= 5,
        "{beyond} launches with their kernel after the window"
    );
    // The launches after the window were made while the library still recorded (until it
    // heard the window ended) or after: with work, or not recorded.
    let (with_work, not_recorded) = (u(&issuing["with_work"]), u(&issuing["not_recorded"]));
    assert!(not_recorded >= others, "{issuing}");
    assert_eq!(
        (
            with_work + not_recorded,
            u(&issuing["missing"]) + u(&issuing["not_flushed"]) + u(&issuing["no_api_record"])
        ),
        (u(&issuing["calls"]), 0),
        "{issuing}"
    );
    let recorded_after = with_work - (kernels.len() + beyond) as u64;
    assert_eq!(
        recorded_after + (not_recorded - others - before as u64),
        after_window,
        "{issuing}"
    );
    assert_eq!(u(&gpu["linked"]), u(&issuing["with_work"]));
    assert_eq!(
        footer["lost"]["gpu_not_recorded"], issuing["not_recorded"],
        "counted as lost, by reason"
    );
    assert_eq!(of_type(&trace, "gpu_info").len(), 1);
    assert!(of_type(&trace, "gpu_error").is_empty());
    // The speed after the window is the speed before it (within the noise of a shared
    // machine: the program's own means of 100 launches).
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{value} is not a u64"))
}

/// The same through ctypes: a Python program's main thread sleeps in `clock_nanosleep`
/// between launches, where the trampoline runs; its own output and exit code after.
#[test]
fn a_python_program_is_attached_the_same_way() {
    let Some(_root) = root() else { return };
    let mut command = Command::new("python3");
    command
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/attach_loop.py"
        ))
        .arg(&standin().lib)
        .arg("3000");
    cupti_standin();
    let target = Target::start(&mut command);
    let pid = target.pid();
    let trace_path = scratch("attach-python").join("trace.jsonl");
    let output = assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "2s"]));
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(said.contains("(in clock_nanosleep)"), "{said}");
    let (code, rest, program_stderr) = target.finish();
    assert_eq!(
        (code, rest.as_str(), program_stderr.as_str()),
        (5, "done 3000 launches, 0 failed\n", "")
    );
    assert_window(&trace_path, pid, "_Z9attach_pyv");
}

/// SIGKILL of cudatrace while a thread is stopped, once it points at the trampoline, and
/// during the window: the program runs on to its own end each time (the kernel lets a
/// dead tracer's threads go; a trampoline no one says go to closes its anonymous files
/// and goes on without the library; the library stops recording once it finds cudatrace
/// gone).
#[test]
fn killing_cudatrace_at_any_phase_leaves_the_program_to_end_normally() {
    let Some(_root) = root() else { return };
    // (phase, what the program says at its end of the stand-in libcupti)
    for (phase, recording) in [
        ("stopped", "recording -1"),
        ("pointed", "recording -1"),
        ("handover", "recording -1"),
        ("window", "recording 0"),
    ] {
        // Long enough to outlive a killed cudatrace's exit (closing its probes takes a
        // while on a loaded machine) by the library's flush period, and to be still running
        // when a cudatrace slowed by a loaded machine (CI's 2 cores: over 4 s once) reaches
        // the phase.
        let mut command = Command::new(attach_loop());
        command.args(["10000", "1000"]);
        let target = Target::start(&mut command);
        let pid = target.pid();
        let trace_path = scratch(&format!("attach-kill-{phase}")).join("trace.jsonl");
        let mut cudatrace = Command::new(CUDATRACE);
        cudatrace
            .args([
                "run",
                "--gpu",
                "-q",
                "--missing-probes",
                "ignore",
                "--cupti",
            ])
            .arg(&cupti_standin().lib)
            .arg("--libcuda")
            .arg(&standin().lib)
            .args(["-p", &pid.to_string(), "-o"])
            .arg(&trace_path)
            .stderr(Stdio::null());
        if phase != "window" {
            cudatrace.env("CUDATRACE_TEST_ATTACH_PAUSE", format!("{phase}:5000"));
        }
        let mut cudatrace = cudatrace.spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let reached = || {
            if phase == "window" {
                return std::fs::read_to_string(&trace_path)
                    .is_ok_and(|text| text.contains(r#""type":"gpu_kernel""#));
            }
            if phase == "handover" {
                return !memfds(pid).is_empty();
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            !status.contains("TracerPid:\t0\n")
        };
        while !reached() {
            assert!(std::time::Instant::now() < deadline, "{phase} never came");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if phase == "pointed" {
            // The registers are set at once after the stop; the pause follows.
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        cudatrace.kill().unwrap();
        cudatrace.wait().unwrap();
        if phase == "handover" {
            // The trampoline, told nothing, closes its files after its wait and goes on.
            let files = memfds(pid);
            assert_eq!(files.len(), 2, "{files:?}");
            assert_eq!(files[0], "/memfd:cudatrace_control (deleted)");
            assert!(
                files[1].starts_with("/memfd:libcudatrace_inject-")
                    && files[1].ends_with(".so (deleted)"),
                "{files:?}"
            );
            while !memfds(pid).is_empty() {
                assert!(std::time::Instant::now() < deadline, "its files stay open");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        let (code, rest, program_stderr) = target.finish();
        assert_eq!(code, 7, "{phase}: {program_stderr}");
        assert!(
            rest.ends_with(&format!("done 10000 launches, 0 failed\n{recording}\n")),
            "{phase}: {rest}"
        );
        assert_eq!(program_stderr, "", "{phase}");
    }
}

/// `cudatrace doctor -p PID --libcuda STANDIN`: its exit code and the attach_gpu line.
fn doctor(pid: u32) -> (Option<i32>, String) {
    let output = Command::new(CUDATRACE)
        .args(["doctor", "--libcuda"])
        .arg(&standin().lib)
        .args(["-p", &pid.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let line = text
        .lines()
        .find(|line| line.contains("attach_gpu"))
        .unwrap_or_default()
        .to_owned();
    (output.status.code(), line)
}

/// A process under a seccomp filter, and one another tracer holds: refused before
/// anything is done to it (exit 83, one line saying why, no trace), and `doctor -p` says
/// the same beforehand; each program then ends as it would have.
#[test]
fn refused_processes_are_left_untouched_and_doctor_says_why_beforehand() {
    let Some(_root) = root() else { return };
    let trace_path = scratch("attach-refused").join("trace.jsonl");
    let refused = |pid: u32, why: &str| {
        let output = attach(pid, &trace_path, &["--duration", "1s"]);
        let said = stderr(&output);
        assert_eq!(output.status.code(), Some(83), "{said}");
        assert_eq!(
            said,
            format!("cudatrace: error: --gpu: cannot attach to process {pid}: {why}\n")
        );
        assert!(!trace_path.exists(), "no trace when nothing started");
    };

    let mut filtered = Command::new(seccomp_exec());
    filtered.arg(attach_loop()).args(["3000", "1000"]);
    let target = Target::start(&mut filtered);
    let pid = target.pid();
    let why = format!(
        "process {pid} runs under a seccomp filter: the calls the injection makes (its own \
         dlopen, mmap of the library, a thread) may be refused or kill it; start it under \
         `cudatrace run --gpu -- CMD` instead"
    );
    let (code, line) = doctor(pid);
    assert_eq!(code, Some(1), "{line}");
    assert_eq!(line, format!("FAIL attach_gpu           {why}"));
    refused(pid, &why);
    let (code, rest, _) = target.finish();
    assert_eq!(
        (code, rest.ends_with("recording -1\n")),
        (7, true),
        "{rest}"
    );

    let mut command = Command::new(attach_loop());
    command.args(["3000", "1000"]);
    let target = Target::start(&mut command);
    let pid = target.pid();
    let (code, line) = doctor(pid);
    assert_eq!(code, Some(0), "{line}");
    assert!(
        line.starts_with(&format!(
            "ok   attach_gpu           process {pid} can be attached: libcuda "
        )),
        "{line}"
    );
    // Another tracer (this test, on a thread of its own: it lets go when the thread ends).
    let (seized, release) = std::sync::mpsc::channel::<()>();
    let (done, wait) = std::sync::mpsc::channel::<u32>();
    let holder = std::thread::spawn(move || {
        // SAFETY: seizes the target without stopping it.
        let rc = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid as i32, 0, 0) };
        assert_eq!(rc, 0);
        // SAFETY: gettid has no preconditions.
        done.send(unsafe { libc::gettid() } as u32).unwrap();
        let _ = release.recv();
    });
    // The kernel names the tracing thread.
    let me = wait.recv().unwrap();
    let comm = std::fs::read_to_string(format!("/proc/{me}/comm")).unwrap();
    refused(
        pid,
        &format!(
            "process {pid} is already traced by process {me} ({}): Linux allows one ptrace \
             tracer at a time; detach that debugger or tracer first",
            comm.trim()
        ),
    );
    drop(seized);
    holder.join().unwrap();
    let (code, rest, _) = target.finish();
    assert_eq!(
        (code, rest.ends_with("recording -1\n")),
        (7, true),
        "{rest}"
    );
}

/// A target whose other threads allocate and load libraries without pause at attach time
/// (the classic deadlock of a `dlopen` injected at the wrong point): the attach ends in
/// bounded time, attached or refused, and the program ends by itself.
#[test]
fn a_target_busy_in_malloc_and_dlopen_is_attached_in_bounded_time() {
    let Some(_root) = root() else { return };
    let mut command = Command::new(attach_loop());
    // Long enough for the 1 s window to end before the program does on a loaded machine
    // (1.5 s once ended inside the window, the library still recording: not this test's
    // subject).
    command.args(["4000", "1000", "busy"]);
    let target = Target::start(&mut command);
    let pid = target.pid();
    let trace_path = scratch("attach-busy").join("trace.jsonl");
    let start = std::time::Instant::now();
    let output = assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "1s"]));
    let said = stderr(&output);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(30),
        "{:?}: {said}",
        start.elapsed()
    );
    let code = output.status.code();
    assert!(code == Some(0) || code == Some(83), "{said}");
    let (exit, rest, program_stderr) = target.finish();
    assert_eq!((exit, program_stderr.as_str()), (7, ""), "{rest}");
    assert!(rest.contains("done 4000 launches, 0 failed\n"), "{rest}");
    if code == Some(0) {
        let trace = read_trace(&trace_path);
        assert_complete_with_losses(&trace);
        // The library may have waited for the loader's lock (the other thread's dlopen
        // loop) past the window: then cudatrace said so, and it never recorded.
        if of_type(&trace, "gpu_info").len() == 1 {
            assert!(rest.ends_with("recording 0\n"), "{rest}");
        } else {
            assert!(said.contains("did not say its window ended"), "{said}");
        }
    }
}

/// A program that is its own CUPTI client (as under torch.profiler) when cudatrace
/// attaches: the library takes nothing, says so, and the launches are counted
/// `cupti_held` in a gap; the program's profiler gets every kernel record, as without
/// cudatrace.
#[test]
fn a_process_whose_cupti_another_client_holds_is_reported_and_its_profiler_unharmed() {
    let Some(_root) = root() else { return };
    let profile = format!("profile:{}", cupti_standin().lib.display());
    let mut command = Command::new(attach_loop());
    command.args(["3000", "1000", &profile]);
    let target = Target::start(&mut command);
    let pid = target.pid();
    let trace_path = scratch("attach-held").join("trace.jsonl");
    let output = assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "2s"]));
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "cudatrace: --gpu: process {pid}: another CUPTI client (torch.profiler, Nsight, \
             ...) holds CUPTI: its GPU work is not recorded while it does (gpu_gap, \
             cupti_held); its own records are untouched\n"
        )),
        "{said}"
    );
    let (code, rest, program_stderr) = target.finish();
    assert_eq!((code, program_stderr.as_str()), (7, ""), "{rest}");
    assert!(
        rest.ends_with("done 3000 launches, 0 failed\nrecording 0\nprofiler kernels 3000\n"),
        "{rest}"
    );
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    let footer = trace.last().unwrap();
    let issuing = &footer["gpu"]["issuing"];
    assert!(of_type(&trace, "gpu_kernel").is_empty());
    // The profiler's clock is left alone: no timestamp callback of the library's replaces
    // the one CUPTI stamps its records with (the library's calls to libcupti are traced).
    let registered: Vec<_> = of_type(&trace, "call")
        .into_iter()
        .filter(|c| c["name"] == "cuptiActivityRegisterTimestampCallback")
        .collect();
    assert!(registered.is_empty(), "{registered:?}");
    let gaps = of_type(&trace, "gpu_gap");
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let held = u(&issuing["cupti_held"]);
    assert!(held > 300, "{issuing}");
    assert_eq!(
        (
            u(&issuing["with_work"]),
            held + u(&issuing["not_recorded"]),
            u(&issuing["missing"]),
            u(&gaps[0]["calls"])
        ),
        (0, u(&issuing["calls"]), 0, held),
        "{issuing}"
    );
}

/// A process that makes no CUDA call in the window: said on stderr, nothing to link,
/// and the library still leaves cleanly.
#[test]
fn a_window_without_a_cuda_call_is_said() {
    let Some(_root) = root() else { return };
    let mut command = Command::new(attach_loop());
    command.args(["2", "4000000"]);
    let target = Target::start(&mut command);
    let pid = target.pid();
    let trace_path = scratch("attach-idle").join("trace.jsonl");
    let output = assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "1s"]));
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "cudatrace: --gpu: process {pid} made no CUDA driver call in the window: it gave \
             the GPU no work to record\n"
        )),
        "{said}"
    );
    let (code, rest, _) = target.finish();
    assert_eq!(code, 7);
    assert!(
        rest.ends_with("done 2 launches, 0 failed\nrecording 0\n"),
        "{rest}"
    );
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    assert_eq!(trace.last().unwrap()["gpu"]["issuing"]["calls"], 0);
}

/// Two attaches to one process: the second finds the library the first loaded (the
/// program's `dlopen` returns it, no second copy), takes CUPTI again and records again;
/// after both the program ends as it would have, nothing of cudatrace's recording.
#[test]
fn a_second_attach_reuses_the_library_already_loaded() {
    let Some(_root) = root() else { return };
    let mut command = Command::new(attach_loop());
    // Long enough to outlive two runs of cudatrace on a loaded machine.
    command.args(["15000", "1000"]);
    let target = Target::start(&mut command);
    let pid = target.pid();
    let mut correlation_ids = Vec::new();
    for round in ["first", "second"] {
        let trace_path = scratch(&format!("attach-again-{round}")).join("trace.jsonl");
        let output = assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "1s"]));
        let said = stderr(&output);
        assert_eq!(output.status.code(), Some(0), "{said}");
        assert_eq!(
            said.contains(&format!(
                "attached to process {pid}, its library from an earlier attach:"
            )),
            round == "second",
            "{said}"
        );
        let trace = read_trace(&trace_path);
        assert_complete_with_losses(&trace);
        let kernels = of_type(&trace, "gpu_kernel");
        let issuing = &trace.last().unwrap()["gpu"]["issuing"];
        assert!(!kernels.is_empty(), "{round}: {issuing}");
        assert_eq!(
            (&issuing["missing"], &issuing["not_flushed"]),
            (&json!(0), &json!(0)),
            "{round}: {issuing}"
        );
        assert_eq!(of_type(&trace, "gpu_info").len(), 1, "{round}");
        // Each window's kernels are named: the second cudatrace is sent the names again
        // (it knows none the first was sent).
        for kernel in &kernels {
            assert_eq!(
                kernel["kernel_mangled"],
                json!("_Z9attach_mev"),
                "{round}: {kernel}"
            );
        }
        correlation_ids.push(u(&kernels[0]["correlation_id"]));
    }
    // One library, one CUPTI: the second window's ids go on from the first's.
    assert!(
        correlation_ids[1] > correlation_ids[0],
        "{correlation_ids:?}"
    );
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains("libcuda.so.1"), "the program still runs");
    let copies: std::collections::BTreeSet<&str> = maps
        .lines()
        .filter(|line| line.contains("libcudatrace_inject"))
        .filter_map(|line| line.split_whitespace().nth(5))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    // One descriptor of cudatrace's: the first attach's library file (the second one's
    // anonymous file went unused and was closed).
    let library = copies.into_iter().next().unwrap();
    assert_eq!(
        memfd_descriptors(pid),
        vec![(library_fd_floor(pid), library.to_owned() + " (deleted)")]
    );
    let (code, rest, program_stderr) = target.finish();
    assert_eq!((code, program_stderr.as_str()), (7, ""), "{rest}");
    assert!(
        rest.ends_with("done 15000 launches, 0 failed\nrecording 0\n"),
        "{rest}"
    );
}

/// The window's edges under a fast loop (a launch every few tens of microseconds, short
/// windows, several of them): launches made while the library turns CUPTI on or off, or
/// whose kernel had not run when it stopped, are `not_recorded`; none falls through the
/// account (`missing` was 1 to 3 in an attach before the DETACHED record was stamped
/// before CUPTI was turned off).
#[test]
fn launches_at_the_windows_edges_are_counted_not_recorded() {
    let Some(_root) = root() else { return };
    let mut command = Command::new(attach_loop());
    command.args(["100000000", "1"]);
    let Target {
        mut child,
        mut stdout,
    } = Target::start(&mut command);
    let pid = child.id();
    // Its "at I" lines, read so that it never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    for round in 0..4 {
        let trace_path = scratch(&format!("attach-edges-{round}")).join("trace.jsonl");
        let output =
            assert_no_probe_outlives(|| attach(pid, &trace_path, &["--duration", "300ms"]));
        let said = stderr(&output);
        assert_eq!(output.status.code(), Some(0), "{said}");
        let trace = read_trace(&trace_path);
        assert_complete_with_losses(&trace);
        let footer = trace.last().unwrap();
        let issuing = &footer["gpu"]["issuing"];
        let launches = of_type(&trace, "call")
            .into_iter()
            .filter(|c| c["name"] == "cuLaunchKernel")
            .count() as u64;
        let kernels = of_type(&trace, "gpu_kernel").len() as u64;
        assert!(kernels > 100, "round {round}: {kernels} kernels: {issuing}");
        assert_eq!(
            (
                u(&issuing["with_work"]) + u(&issuing["not_recorded"]),
                u(&issuing["missing"]),
                u(&issuing["not_flushed"]),
                u(&issuing["no_api_record"]),
            ),
            (u(&issuing["calls"]), 0, 0, 0),
            "round {round}: {issuing}"
        );
        assert!(u(&issuing["calls"]) >= launches, "round {round}: {issuing}");
        assert_eq!(u(&footer["gpu"]["linked"]), u(&issuing["with_work"]));
        assert_eq!(footer["lost"]["gpu_not_recorded"], issuing["not_recorded"]);
    }
    // The program would loop for hours: it still runs, nothing of ours records in it.
    assert_eq!(child.try_wait().unwrap(), None);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A CUPTI set up late as CUPTI 13.0 was in a running PyTorch process: per-function
/// switches do nothing until the DRIVER kind was enabled (the stand-in's
/// `CUPTI_STANDIN_SWITCHES_NEED_DRIVER_KIND`, run J/O), and even then a DRIVER record comes
/// for one launch in seven (`CUPTI_STANDIN_DRIVER_RECORD_EVERY=7`, run T: kernels launched
/// through libcudart carried the runtime call's correlation id). The default late start takes
/// its API records from CUPTI's driver callbacks and links every kernel; with
/// `CUDATRACE_INJECT_LATE_CALLS=off` (passed in the attach's settings), the DRIVER kind way
/// links exactly the kernels whose call got a record (correlation ids 1, 8, 15, ...), and
/// the functions alone link none.
#[test]
fn a_late_start_links_every_kernel_through_the_driver_callbacks() {
    let Some(_root) = root() else { return };
    let mut command = Command::new(attach_loop());
    command
        .args(["100000000", "200"])
        .env("CUPTI_STANDIN_SWITCHES_NEED_DRIVER_KIND", "1")
        .env("CUPTI_STANDIN_DRIVER_RECORD_EVERY", "7");
    let Target {
        mut child,
        mut stdout,
    } = Target::start(&mut command);
    let pid = child.id();
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    for way in ["callbacks", "kind", "functions"] {
        let trace_path = scratch(&format!("attach-driver-{way}")).join("trace.jsonl");
        let mut cudatrace = Command::new(CUDATRACE);
        cudatrace
            .args(["run", "--gpu", "--missing-probes", "ignore", "--cupti"])
            .arg(&cupti_standin().lib)
            .arg("--libcuda")
            .arg(&standin().lib)
            .args(["-p", &pid.to_string(), "--duration", "500ms", "-o"])
            .arg(&trace_path);
        if way != "callbacks" {
            cudatrace.env("CUDATRACE_INJECT_LATE_CALLS", "off");
        }
        if way == "functions" {
            cudatrace.env("CUDATRACE_INJECT_DRIVER_API", "functions");
        }
        let output = assert_no_probe_outlives(|| cudatrace.output().unwrap());
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let trace = read_trace(&trace_path);
        assert_complete_with_losses(&trace);
        let gpu = &trace.last().unwrap()["gpu"];
        let kernels = of_type(&trace, "gpu_kernel");
        assert!(
            kernels.len() > 100,
            "{way}: {} kernels: {gpu}",
            kernels.len()
        );
        // Each kernel line: linked exactly when its call got an API record.
        let mut with_record = 0;
        for kernel in &kernels {
            let correlation = u(&kernel["correlation_id"]);
            let recorded = match way {
                "callbacks" => true,
                "kind" => (correlation - 1).is_multiple_of(7),
                _ => false,
            };
            with_record += u64::from(recorded);
            let linked = kernel.get("call_ts_ns").is_some();
            assert_eq!(linked, recorded, "{way}: {kernel}");
            if !recorded {
                assert_eq!(kernel["unlinked"], "no_api_record", "{way}: {kernel}");
            }
        }
        let n = kernels.len() as u64;
        match way {
            "callbacks" => assert_eq!(
                (
                    u(&gpu["linked"]) == u(&gpu["issuing"]["with_work"]),
                    u(&gpu["linked"]) >= n,
                    u(&gpu["unlinked"]["no_api_record"]),
                    u(&gpu["issuing"]["missing"]),
                ),
                (true, true, 0, 0),
                "{way}: {gpu}"
            ),
            // One kernel in seven, give or take the window's two edges.
            "kind" => assert!(
                with_record > 0 && with_record.abs_diff(n / 7) <= 2,
                "{way}: {with_record} of {n} kernels linked: {gpu}"
            ),
            _ => assert_eq!(u(&gpu["api_records"]), 0, "{way}: {gpu}"),
        }
    }
    assert_eq!(child.try_wait().unwrap(), None);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `-p PID --gpu --stacks` on the Python program: the launches of the window carry the
/// Python line that made them, and their kernels link to those launches (GPU time per
/// Python line for the window).
#[test]
fn a_python_program_is_attached_with_its_stacks() {
    let Some(_root) = root() else { return };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/attach_loop.py");
    let mut command = Command::new("python3");
    command.arg(script).arg(&standin().lib).arg("5000");
    cupti_standin();
    let target = Target::start(&mut command);
    let pid = target.pid();
    let trace_path = scratch("attach-stacks").join("trace.jsonl");
    let output =
        assert_no_probe_outlives(|| attach(pid, &trace_path, &["--stacks", "--duration", "5s"]));
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    // Where attach and detach take their time (workloads/attach_gpu.sh reads these).
    assert_eq!(
        phases(&said),
        [
            "prepared",
            "object_loaded",
            "uprobe_multi_copies_loaded",
            "loaded",
            "libraries_attached",
            "tracking_attached",
            "probes_attached",
            "spawned",
            "tracing_stopped",
            "late_starts_ended",
            "probes_detached",
            "settled",
            "links_closed",
            "finished"
        ],
        "{said}"
    );
    let (code, rest, _) = target.finish();
    assert_eq!((code, rest.as_str()), (5, "done 5000 launches, 0 failed\n"));
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    let stacks: std::collections::HashMap<u64, &Value> = of_type(&trace, "stack")
        .into_iter()
        .map(|s| (u(&s["id"]), s))
        .collect();
    let launch_at: std::collections::HashMap<u64, &Value> = of_type(&trace, "call")
        .into_iter()
        .filter(|c| c["name"] == "cuLaunchKernel")
        .map(|c| (u(&c["ts_ns"]), c))
        .collect();
    let kernels = of_type(&trace, "gpu_kernel");
    assert!(!kernels.is_empty(), "{said}");
    for kernel in &kernels {
        let call = launch_at[&u(&kernel["call_ts_ns"])];
        let stack = stacks[&u(&call["stack"])];
        assert_eq!(
            (
                &stack["frames"][0]["file"],
                &stack["frames"][0]["qualname"],
                &stack["frames"][0]["line"]
            ),
            (&json!(script), &json!("main"), &json!(36)),
            "{kernel}"
        );
    }
}

/// `-p A -p B --gpu`: both processes get the library, record their own window, and end as
/// they would have.
#[test]
fn two_processes_are_attached_at_once() {
    let Some(_root) = root() else { return };
    let targets: Vec<Target> = (0..2)
        .map(|_| {
            let mut command = Command::new(attach_loop());
            command.args(["4000", "1000"]);
            Target::start(&mut command)
        })
        .collect();
    let pids: Vec<u32> = targets.iter().map(Target::pid).collect();
    let trace_path = scratch("attach-two").join("trace.jsonl");
    let output = assert_no_probe_outlives(|| {
        Command::new(CUDATRACE)
            .args(["run", "--gpu", "--missing-probes", "ignore", "--cupti"])
            .arg(&cupti_standin().lib)
            .arg("--libcuda")
            .arg(&standin().lib)
            .args(["-p", &pids[0].to_string(), "-p", &pids[1].to_string()])
            .arg("-o")
            .arg(&trace_path)
            .args(["--duration", "2s"])
            .output()
            .unwrap()
    });
    let said = stderr(&output);
    assert_eq!(output.status.code(), Some(0), "{said}");
    for pid in &pids {
        assert!(
            said.contains(&format!("cudatrace: --gpu: attached to process {pid}:")),
            "{said}"
        );
    }
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    let footer = trace.last().unwrap();
    assert_eq!(footer["gpu"]["processes"], 2);
    for pid in &pids {
        let kernels = of_type(&trace, "gpu_kernel")
            .into_iter()
            .filter(|k| k["pid"] == json!(pid))
            .count();
        assert!(kernels > 50, "process {pid}: {kernels} kernels");
    }
    let issuing = &footer["gpu"]["issuing"];
    assert_eq!(
        (
            u(&issuing["with_work"]) + u(&issuing["not_recorded"]),
            u(&issuing["missing"])
        ),
        (u(&issuing["calls"]), 0),
        "{issuing}"
    );
    for target in targets {
        let (code, rest, _) = target.finish();
        assert_eq!(code, 7);
        assert!(
            rest.ends_with("done 4000 launches, 0 failed\nrecording 0\n"),
            "{rest}"
        );
    }
}
