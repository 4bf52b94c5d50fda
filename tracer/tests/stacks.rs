//! Root: `cudatrace run --stacks` on real interpreters (Debian's static, stripped
//! /usr/bin/python3.11, pyenv's 3.11.7 with its libpython, Debian trixie's 3.13 in the
//! chroot `cargo xtask test` makes, and pyenv's other versions where the machine has them).
//! `python/stacks_target.py` calls the stand-in libcuda through ctypes from known lines and
//! records at each call the frames CPython itself gives: every call's stack must equal them,
//! frame for frame (file, qualified name, line), lines inside loops and after a `try`,
//! generators, coroutines, threads and a recursion deeper than the frame budget (cut, and
//! said). And what cannot get a stack says why, with nothing else lost.

mod common;

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use common::*;
use serde_json::Value;

/// The test programs' directory.
fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python")
}

/// Debian trixie's root with python3 (3.13), made by `cargo xtask test` with debootstrap
/// (`xtask/src/pythons.rs`), or where CUDATRACE_TEST_TRIXIE says.
fn trixie() -> PathBuf {
    if let Some(dir) = std::env::var_os("CUDATRACE_TEST_TRIXIE") {
        return dir.into();
    }
    // CARGO_TARGET_TMPDIR is target/tmp, or target/<triple>/tmp for a cross build (the
    // arm64 guests' tests), whose root `vm-test --arch arm64` makes for them.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .ancestors()
        .find(|dir| dir.file_name().is_some_and(|name| name == "target"))
        .expect("CARGO_TARGET_TMPDIR under target/")
        .to_path_buf();
    if cfg!(target_arch = "x86_64") {
        target.join("pythons/trixie")
    } else {
        target.join("pythons/trixie-arm64")
    }
}

/// An interpreter to trace, and how its files are reached: a chroot sees them under its
/// own root.
struct Python {
    label: String,
    /// The command line up to the script (`python3.11`, or `chroot DIR python3`).
    command: Vec<String>,
    /// Where the script, the library and the output go, as this process and as the
    /// interpreter see that directory.
    host_dir: PathBuf,
    seen_dir: PathBuf,
    /// The minor version: 3.10 has no qualified names.
    minor: u32,
    /// The file whose DWARF gives its layout (pyenv's libpython: CPython's configure
    /// builds with `-g`); none for Debian's, which are stripped.
    dwarf: Option<PathBuf>,
}

impl Python {
    fn host(label: &str, binary: &str, minor: u32) -> Option<Python> {
        Path::new(binary).exists().then(|| {
            let dir = scratch(&format!("stacks-{label}"));
            Python {
                label: label.into(),
                command: vec![binary.into()],
                host_dir: dir.clone(),
                seen_dir: dir,
                minor,
                dwarf: None,
            }
        })
    }

    /// `python` (`/usr/bin/python3`, `/usr/bin/python3.14`) in the root `root`.
    fn chroot(root: &Path, label: &str, python: &str, minor: u32) -> Python {
        let seen = PathBuf::from(format!(
            "/tmp/cudatrace-stacks-{label}-{}",
            std::process::id()
        ));
        let host_dir = root.join(seen.strip_prefix("/").unwrap());
        std::fs::create_dir_all(&host_dir).unwrap();
        Python {
            label: label.into(),
            command: vec!["chroot".into(), root.display().to_string(), python.into()],
            host_dir,
            seen_dir: seen,
            minor,
            dwarf: None,
        }
    }

    /// pyenv's interpreter `version`: its libpython has DWARF.
    fn pyenv(version: &str, minor: u32) -> Option<Python> {
        let pyenv = Path::new("/root/.pyenv/versions").join(version);
        Python::host(
            &format!("pyenv-{version}"),
            pyenv.join(format!("bin/python3.{minor}")).to_str().unwrap(),
            minor,
        )
        .map(|python| Python {
            dwarf: Some(pyenv.join(format!("lib/libpython3.{minor}.so.1.0"))),
            ..python
        })
    }

    /// The `interpreter` line's `offsets` for it, and the file they came from.
    fn offsets(&self) -> (&'static str, Option<String>) {
        match &self.dwarf {
            Some(file) => ("dwarf", Some(file.display().to_string())),
            None if self.minor >= 13 => ("debug_offsets", None),
            None => ("table", None),
        }
    }

    /// Copies `script` and the stand-in library where the interpreter sees them, and runs it
    /// under `cudatrace run ARGS`: the trace and what the script recorded.
    fn trace(&self, script: &str, cudatrace: &[&str], script_args: &[&str]) -> Traced {
        let quiet: Vec<&str> = ["-q"].iter().chain(cudatrace).copied().collect();
        self.trace_with(script, &quiet, script_args, &[])
    }

    /// [`Python::trace`] without `-q` in `cudatrace`'s own arguments, with `env` set.
    fn trace_with(
        &self,
        script: &str,
        cudatrace: &[&str],
        script_args: &[&str],
        env: &[(&str, &str)],
    ) -> Traced {
        self.trace_under(&[], script, cudatrace, script_args, env)
    }

    /// [`Python::trace_with`], `cudatrace` started by the command `wrapper` (none: itself)
    /// in an environment of `env` alone where a wrapper is given.
    fn trace_under(
        &self,
        wrapper: &[&str],
        script: &str,
        cudatrace: &[&str],
        script_args: &[&str],
        env: &[(&str, &str)],
    ) -> Traced {
        let standin = standin();
        // The script, and the helpers they import from beside it.
        for file in [script, "free_probe.py", "stack_recorder.py"] {
            std::fs::copy(scripts().join(file), self.host_dir.join(file)).unwrap();
        }
        std::fs::copy(&standin.lib, self.host_dir.join("libcuda.so.1")).unwrap();
        let trace = self.host_dir.join(format!("{script}.jsonl"));
        let recorded = self.host_dir.join(format!("{script}.json"));
        let _ = std::fs::remove_file(&recorded);
        let seen = |name: &str| self.seen_dir.join(name).display().to_string();
        let mut command = match wrapper.split_first() {
            None => Command::new(CUDATRACE),
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.env_clear().args(args).arg(CUDATRACE);
                command
            }
        };
        let output = command
            .envs(env.iter().copied())
            .args(["run", "--missing-probes", "ignore", "-o"])
            .arg(&trace)
            .args(cudatrace)
            .arg("--")
            .args(&self.command)
            .args([
                seen(script),
                seen("libcuda.so.1"),
                seen(&format!("{script}.json")),
            ])
            .args(script_args)
            .output()
            .expect("running cudatrace");
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}: {}",
            self.label,
            stderr(&output)
        );
        let lines = read_trace(&trace);
        assert_complete(&lines);
        let recorded = std::fs::read_to_string(&recorded)
            .map(|text| serde_json::from_str(&text).unwrap())
            .unwrap_or(Value::Null);
        Traced {
            lines,
            recorded,
            stderr: stderr(&output),
        }
    }

    /// The script's path as its frames name it.
    fn script(&self, script: &str) -> String {
        self.seen_dir.join(script).display().to_string()
    }
}

struct Traced {
    lines: Vec<Value>,
    recorded: Value,
    stderr: String,
}

/// A frame as the trace and the script give it: file, qualified name, line.
type Frame = (String, String, Option<u64>);

impl Traced {
    /// Stack lines by id: their frames and whether they were cut.
    fn stacks(&self) -> BTreeMap<u64, (Vec<Frame>, bool)> {
        self.lines
            .iter()
            .filter(|line| line["type"] == "stack")
            .map(|line| {
                let frames = line["frames"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| {
                        (
                            f["file"].as_str().unwrap().to_owned(),
                            f["qualname"].as_str().unwrap().to_owned(),
                            f["line"].as_u64(),
                        )
                    })
                    .collect();
                (line["id"].as_u64().unwrap(), (frames, line["cut"] == true))
            })
            .collect()
    }

    /// The calls into the stand-in the scripts make (sync and launch), per thread in
    /// entry order: their `stack`.
    fn calls_by_thread(&self) -> BTreeMap<u64, Vec<Option<u64>>> {
        let mut by_thread: BTreeMap<u64, Vec<(u64, Option<u64>)>> = BTreeMap::new();
        for call in calls(&self.lines) {
            let name = call["name"].as_str().unwrap();
            if name.starts_with("cuCtxSynchronize") || name.starts_with("cuLaunchKernel") {
                by_thread
                    .entry(call["tid"].as_u64().unwrap())
                    .or_default()
                    .push((call["ts_ns"].as_u64().unwrap(), call["stack"].as_u64()));
            }
        }
        by_thread
            .into_iter()
            .map(|(tid, mut calls)| {
                calls.sort();
                (tid, calls.into_iter().map(|(_, stack)| stack).collect())
            })
            .collect()
    }

    /// What CPython gave, per thread in call order.
    fn recorded(&self) -> BTreeMap<u64, Vec<Vec<Frame>>> {
        self.recorded
            .as_object()
            .unwrap()
            .iter()
            .map(|(tid, stacks)| {
                let stacks = stacks
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|stack| {
                        stack
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|f| {
                                (
                                    f[0].as_str().unwrap().to_owned(),
                                    f[1].as_str().unwrap().to_owned(),
                                    f[2].as_u64(),
                                )
                            })
                            .collect()
                    })
                    .collect();
                (tid.parse().unwrap(), stacks)
            })
            .collect()
    }

    fn footer_stacks(&self) -> &Value {
        &self.lines.last().unwrap()["stacks"]
    }

    fn interpreter(&self) -> &Value {
        self.lines
            .iter()
            .find(|line| line["type"] == "interpreter")
            .expect("an interpreter line")
    }
}

/// Every call's stack is CPython's, frame for frame; the innermost `depth` frames where
/// the budget cut it (and then it says so). Returns the number of calls compared and of
/// stacks cut.
fn assert_stacks_are_cpythons(python: &Python, traced: &Traced, depth: usize) -> (usize, usize) {
    assert_sampled_stacks_are_cpythons(python, traced, depth, 1)
}

/// The same with `--stack-every N`: each call has CPython's stack or, N > 1, none, counted
/// as sampled out and for no other reason; the footer's accounting is exact (with a stack
/// plus sampled out: every call line). Returns the number of calls compared and of stacks
/// cut.
fn assert_sampled_stacks_are_cpythons(
    python: &Python,
    traced: &Traced,
    depth: usize,
    every: usize,
) -> (usize, usize) {
    let stacks = traced.stacks();
    let calls = traced.calls_by_thread();
    let recorded = traced.recorded();
    assert_eq!(
        calls.keys().collect::<Vec<_>>(),
        recorded.keys().collect::<Vec<_>>(),
        "{}: threads",
        python.label
    );
    let (mut compared, mut cut, mut sampled_out) = (0, 0, 0);
    for (tid, expected) in &recorded {
        let got = &calls[tid];
        assert_eq!(
            got.len(),
            expected.len(),
            "{}: calls of {tid}",
            python.label
        );
        for (index, (stack, want)) in got.iter().zip(expected).enumerate() {
            let Some(id) = stack else {
                assert!(
                    every > 1,
                    "{}: call {index} of {tid} has no stack",
                    python.label
                );
                sampled_out += 1;
                continue;
            };
            let (frames, was_cut) = &stacks[id];
            let kept = want.len().min(depth);
            assert_eq!(
                (frames, *was_cut),
                (&want[..kept].to_vec(), want.len() > depth),
                "{}: call {index} of thread {tid}",
                python.label
            );
            compared += 1;
            cut += usize::from(*was_cut);
        }
    }
    let footer = traced.footer_stacks();
    assert_eq!(footer["calls"], compared as u64, "{}", python.label);
    assert_eq!(footer["cut"], cut as u64, "{}", python.label);
    let mut without = footer["without"].as_object().unwrap().clone();
    // Present only when some call was sampled out.
    let counted = without.remove("sampled_out").map(|v| v.as_u64().unwrap());
    assert_eq!(
        counted,
        (sampled_out > 0).then_some(sampled_out as u64),
        "{}",
        python.label
    );
    assert_eq!(
        without.values().map(|v| v.as_u64().unwrap()).sum::<u64>(),
        0
    );
    // Every call line is counted once: with its stack or sampled out.
    assert_eq!(
        compared + sampled_out,
        calls.values().map(Vec::len).sum::<usize>(),
        "{}",
        python.label
    );
    (compared, cut)
}

/// The line marked `# line:NAME` in `script`.
fn marked(script: &str, name: &str) -> u64 {
    let text = std::fs::read_to_string(scripts().join(script)).unwrap();
    let mark = format!("# line:{name}");
    text.lines()
        .position(|line| line.trim_end().ends_with(&mark))
        .unwrap_or_else(|| panic!("no {mark}")) as u64
        + 1
}

/// Whether `path` is there; in CI (`CI=true`) it must be: a test whose interpreter is
/// missing there fails rather than passing without it.
fn present(path: &Path) -> bool {
    let there = path.exists();
    assert!(
        there || std::env::var("CI").as_deref() != Ok("true"),
        "CI: {} is missing (pyenv's interpreters; `cargo xtask pythons` makes the Debian ones)",
        path.display()
    );
    there
}

/// The interpreters this machine has; Debian's 3.11, pyenv's 3.11.7 and the trixie root's
/// 3.13 and 3.14 are required, pyenv's others where the machine has them (and in CI).
fn pythons() -> Vec<Python> {
    let pyenv = |version: &str| {
        format!(
            "/root/.pyenv/versions/{version}/bin/python{}",
            &version[..version.rfind('.').unwrap()]
        )
    };
    let debian =
        Python::host("debian-3.11", "/usr/bin/python3.11", 11).expect("/usr/bin/python3.11");
    // pyenv's builds are x86-64 programs: an arm64 machine (vm-test's arm64 guest) traces
    // its own Debian 3.11 and the arm64 root's 3.13 and 3.14.
    let arm64 = cfg!(not(target_arch = "x86_64"));
    let mut found = vec![debian];
    if !arm64 {
        found.push(Python::pyenv("3.11.7", 11).expect("pyenv's 3.11.7 in /root/.pyenv"));
    }
    let root = trixie();
    for (python, label, minor) in [
        ("usr/bin/python3", "trixie-3.13", 13),
        ("usr/bin/python3.14", "sid-3.14", 14),
    ] {
        assert!(
            root.join(python).exists(),
            "no {python} in the Debian root at {}: `cargo xtask pythons` makes it \
             (debootstrap, apt-get download; arm64's: `cargo xtask vm-test --arch arm64`), \
             or set CUDATRACE_TEST_TRIXIE",
            root.display()
        );
        found.push(Python::chroot(&root, label, &format!("/{python}"), minor));
    }
    if arm64 {
        return found;
    }
    for (version, minor) in [("3.10.13", 10), ("3.12.1", 12), ("3.13.0", 13)] {
        if present(Path::new(&pyenv(version))) {
            found.extend(Python::pyenv(version, minor));
        }
    }
    found
}

#[test]
fn every_stack_is_the_one_cpython_gives_on_each_interpreter() {
    let Some(_guard) = root() else { return };
    let script = "stacks_target.py";
    for python in pythons() {
        let traced = python.trace(script, &["--stacks"], &[]);
        let (compared, cut) = assert_stacks_are_cpythons(&python, &traced, 128);
        // Block.forward ×4, after the try, the launch, the generator ×2, the coroutine,
        // the comprehension ×2, two threads, the recursion, the long function.
        assert_eq!((compared, cut), (15, 0), "{}", python.label);
        let interpreter = traced.interpreter();
        assert_eq!(interpreter["stacks"], true, "{}", python.label);
        assert!(
            interpreter["python"]
                .as_str()
                .unwrap()
                .starts_with(&format!("3.{}", python.minor)),
            "{interpreter}"
        );
        // Checked when the script opened the library: `<module>` calling `CDLL.__init__`
        // (which calls `CDLL._load_library` from 3.14) on the one thread; the offsets of
        // pyenv's DWARF, or CPython's own from 3.13, the same as the table's.
        let frames = if python.minor >= 14 { 3 } else { 2 };
        assert_eq!(
            interpreter["checked"],
            serde_json::json!({"thread_states": 1, "frames": frames, "code_objects": frames}),
            "{}",
            python.label
        );
        let (offsets, file) = python.offsets();
        assert_eq!(
            (
                interpreter["offsets"].as_str(),
                interpreter["offsets_file"].as_str()
            ),
            (Some(offsets), file.as_deref()),
            "{}",
            python.label
        );
        assert!(interpreter.get("table_differs").is_none(), "{interpreter}");
        assert!(interpreter.get("dwarf_unused").is_none(), "{interpreter}");

        // Known lines through known classes, checked by number too.
        let file = python.script(script);
        let qualname = |qualified: &str| match python.minor {
            10 => qualified.rsplit('.').next().unwrap().to_owned(),
            _ => qualified.to_owned(),
        };
        let frame =
            |name: &str, mark: &str| (file.clone(), qualname(name), Some(marked(script, mark)));
        let stacks = traced.stacks();
        let main_thread =
            traced.calls_by_thread()[&traced.lines[0]["pids"][0].as_u64().unwrap()].clone();
        assert_eq!(
            stacks[&main_thread[0].unwrap()].0,
            [
                frame("Block.forward", "block_loop"),
                frame("Net.forward", "net_loop"),
                frame("main", "main_net"),
                frame("<module>", "module_main"),
            ],
            "{}",
            python.label
        );
        // The same line in a loop is the same stack.
        assert_eq!(main_thread[..4], [main_thread[0]; 4], "{}", python.label);
        assert_eq!(
            stacks[&main_thread[4].unwrap()].0[0],
            frame("Net.forward", "after_try"),
            "{}",
            python.label
        );
        assert_eq!(
            stacks[&main_thread[5].unwrap()].0[0],
            frame("Net.forward", "launch"),
            "{}",
            python.label
        );
        assert_eq!(
            stacks[&main_thread[6].unwrap()].0[0],
            frame("generated", "generator"),
            "{}",
            python.label
        );
    }
}

/// Code objects freed and made anew at the same address, each with another name and line:
/// a stack known by its code addresses must not keep the names of the code objects that
/// were there before (the count of code objects freed, or their identities, tell them
/// apart).
#[test]
fn a_new_code_object_where_a_freed_one_was_gets_its_own_name() {
    let Some(_guard) = root() else { return };
    let script = "stacks_reuse.py";
    // The probe on PyCode_Type's deallocator is linked to the process's memory alone, with
    // uprobe_multi (6.6); without it every frame's identity is read (`run`'s per-symbol
    // links), and the stacks must be as exact.
    let per_process = kernel_at_least(6, 6);
    for python in pythons() {
        // Before 3.14 the count is the probe's: the script waits for its link after its
        // first call.
        let linked = u64::from(python.minor < 14 && per_process);
        let wait: &[&str] = if linked == 1 { &["wait"] } else { &[] };
        let traced = python.trace(script, &["--stacks"], wait);
        let codes: Vec<u64> = serde_json::from_str(
            &std::fs::read_to_string(python.host_dir.join(format!("{script}.json.codes"))).unwrap(),
        )
        .unwrap();
        // The test is only a test if the addresses repeat.
        let distinct = codes
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        assert!(
            distinct < codes.len() / 2,
            "{}: {distinct} addresses for {} code objects",
            python.label,
            codes.len()
        );
        let (compared, cut) = assert_stacks_are_cpythons(&python, &traced, 128);
        assert_eq!((compared, cut), (60, 0), "{}", python.label);
        // Linked where the kernel has uprobe_multi, or the test would pass by reading
        // identities per frame.
        let footer = traced.lines.last().unwrap();
        assert_eq!(
            footer["stacks"]["code_free_probes"],
            serde_json::json!({"linked": linked, "not_linked": 0}),
            "{}",
            python.label
        );
        // Each step's own function, by name and line.
        let stacks = traced.stacks();
        let calls = &traced.calls_by_thread()[&traced.lines[0]["pids"][0].as_u64().unwrap()];
        let names: Vec<(String, Option<u64>)> = calls
            .iter()
            .map(|id| stacks[&id.unwrap()].0[0].clone())
            .map(|(_, name, line)| (name, line))
            .collect();
        let expected: Vec<(String, Option<u64>)> = (0..60)
            .map(|step| (format!("step_{step}"), Some(step % 3 + 2)))
            .collect();
        assert_eq!(names, expected, "{}", python.label);
    }
}

/// The footer counts how the probes sent each stack: 200 calls from one line send it whole
/// once, then its hash alone. Where the probe on code frees is linked at the first stack
/// (3.10 to 3.13 with uprobe_multi), the layout is given again then (a new process image):
/// the second call sends the same stack whole again, and the footer says so. `summary`
/// shows the counts, in text and `--json`.
#[test]
fn the_footer_counts_known_stacks_and_stacks_sent_whole() {
    let Some(_guard) = root() else { return };
    let script = "stacks_records.py";
    let per_process = kernel_at_least(6, 6);
    for python in pythons() {
        let linked = python.minor < 14 && per_process;
        let args: &[&str] = if linked { &["200", "wait"] } else { &["200"] };
        let traced = python.trace(script, &["--stacks"], args);
        let footer = traced.footer_stacks();
        assert_eq!(footer["calls"], 200, "{}: {footer}", python.label);
        // Every known stack came in its call's own record: the loader no longer waited
        // for the first stack record when the second call was made.
        let expected = if linked {
            serde_json::json!({"known": 198, "known_in_call": 198, "sent_whole": 2, "sent_again": 1})
        } else {
            serde_json::json!({"known": 199, "known_in_call": 199, "sent_whole": 1, "sent_again": 0})
        };
        assert_eq!(footer["stack_records"], expected, "{}", python.label);
        // Each stacked call read the interpreter's pointer, the interpreter and the thread
        // state at least, and its frames in windows (3.10: one read each), a few reads more
        // at most (the thread counter, 3.11/3.12's `_PyCFrame`, a window that failed); the
        // first calls, before the probe on code frees was linked, also read each frame's
        // identity.
        let (reads, walked) = (
            footer["memory_reads"].as_u64().unwrap(),
            footer["frames_walked"].as_u64().unwrap(),
        );
        assert!(
            (3 * 200..=2 * walked + 8 * 200).contains(&reads),
            "{}: {reads} reads for 200 stacks of {walked} frames in all",
            python.label
        );
        // One stack, named by every call.
        assert_eq!(traced.stacks().len(), 1, "{}", python.label);
        let trace = python.host_dir.join(format!("{script}.jsonl"));
        let summary = Command::new(CUDATRACE)
            .args(["summary", "--json"])
            .arg(&trace)
            .output()
            .unwrap();
        let summary: Value = serde_json::from_slice(&summary.stdout).unwrap();
        assert_eq!(
            summary["stacks"]["stack_records"], expected,
            "{}",
            python.label
        );
        let text = Command::new(CUDATRACE)
            .arg("summary")
            .arg(&trace)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        let (known, whole, again) = if linked { (198, 2, 1) } else { (199, 1, 0) };
        let said = format!(
            "Stack records (the trace's footer): {known} known to the probes (their hash \
             alone, {known} of them in their call's own record), {whole} sent whole ({again} \
             of them a stack sent before)"
        );
        assert!(text.contains(&said), "{}: {text}", python.label);

        // Each known stack in a record of its own instead: the same stacks, call by call.
        let calls = traced.calls_by_thread();
        let apart = python.trace_with(
            script,
            &["-q", "--stacks"],
            args,
            &[("CUDATRACE_STACKS_NO_CALL_REF", "1")],
        );
        let mut expected = expected.clone();
        expected["known_in_call"] = 0.into();
        assert_eq!(
            apart.footer_stacks()["stack_records"],
            expected,
            "{}",
            python.label
        );
        assert_eq!(
            apart.calls_by_thread().into_values().collect::<Vec<_>>(),
            calls.into_values().collect::<Vec<_>>(),
            "{}",
            python.label
        );
    }
}

/// A window of the C stack stops at the end of the thread's stack once a read has found it
/// there: a read past the end faults, and a read that faults costs about ten that do not.
/// The interpreter runs without address randomization (`setarch -R`) and with an empty
/// environment, so that the stack's end lies where it lies in every run, and with 8 KiB
/// windows, so that the first window of each call reaches it (3.12+: entry frames on the C
/// stack). Without the ceiling (`CUDATRACE_STACKS_NO_UP_CEILING`) each of the 200 calls
/// faults; with it, the first walk of each process image does (two images where the probe
/// on code frees is linked at the first stack, one otherwise), and the stack is the same.
#[test]
fn a_window_of_the_c_stack_faults_at_its_end_once() {
    let Some(_guard) = root() else { return };
    let script = "stacks_records.py";
    let per_process = kernel_at_least(6, 6);
    let wrapper = ["setarch", std::env::consts::ARCH, "-R"];
    let mut tried = 0;
    for python in pythons().into_iter().filter(|python| python.minor >= 12) {
        tried += 1;
        let linked = python.minor < 14 && per_process;
        let args: &[&str] = if linked { &["200", "wait"] } else { &["200"] };
        let run = |off: bool| {
            // Whole windows, as before the reach was kept: the ceiling alone decides.
            let mut env = vec![
                ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                ("CUDATRACE_STACKS_UP_WINDOW", "8112"),
                ("CUDATRACE_STACKS_NO_UP_REACH", "1"),
            ];
            if off {
                env.push(("CUDATRACE_STACKS_NO_UP_CEILING", "1"));
            }
            python.trace_under(&wrapper, script, &["-q", "--stacks"], args, &env)
        };
        let (without, with) = (run(true), run(false));
        for traced in [&without, &with] {
            assert_eq!(traced.footer_stacks()["calls"], 200, "{}", python.label);
        }
        let faults = |traced: &Traced| traced.footer_stacks()["memory_read_faults"].clone();
        assert_eq!(
            faults(&without),
            200,
            "{}: without the ceiling every call's first window reaches the stack's end: {}",
            python.label,
            without.footer_stacks()
        );
        assert_eq!(
            faults(&with),
            if linked { 2 } else { 1 },
            "{}: {}",
            python.label,
            with.footer_stacks()
        );
        // The same stack, whole, under either.
        let stacks = |traced: &Traced| traced.stacks().into_values().collect::<Vec<_>>();
        assert_eq!(stacks(&without).len(), 1, "{}", python.label);
        assert_eq!(stacks(&with), stacks(&without), "{}", python.label);
    }
    // An arm64 machine traces its own Debian 3.11 alone (`pythons`), with no entry frame on
    // the C stack.
    assert!(
        tried >= 2 || cfg!(not(target_arch = "x86_64")),
        "no 3.12+ interpreter to trace"
    );
}

/// A C-stack window reads only as far up as the thread's walks have needed entry frames
/// (`ThreadSeen::up_reach`): a loop of 200 calls from one line makes the same reads either
/// way (but for a whole window's fault past the stack's end) and gets the same stack, but on
/// 3.12+ (whose walks read the C stack) copies less than with whole 8 KiB windows
/// (`CUDATRACE_STACKS_NO_UP_REACH`); before 3.12 nothing changes, to the byte. On 3.12+
/// both run under `setarch -R` with the same environment, so that the stack's end lies
/// alike in both and cannot make the difference.
#[test]
fn a_window_of_the_c_stack_reads_only_as_far_as_its_walks_have_needed() {
    let Some(_guard) = root() else { return };
    let script = "stacks_records.py";
    let per_process = kernel_at_least(6, 6);
    let mut tried = 0;
    for python in pythons() {
        // Before 3.12 no window reads the C stack, and the runs are compared to the byte.
        let wrapper: &[&str] = if python.minor >= 12 {
            &["setarch", std::env::consts::ARCH, "-R"]
        } else {
            &[]
        };
        let linked = python.minor < 14 && per_process;
        let args: &[&str] = if linked { &["200", "wait"] } else { &["200"] };
        // Without address randomization and with the same environment, both runs' stacks
        // lie alike: the bytes compared differ by the reach alone.
        let run = |whole: bool| {
            let mut env = vec![("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")];
            if whole {
                env.push(("CUDATRACE_STACKS_NO_UP_REACH", "1"));
            }
            python.trace_under(wrapper, script, &["-q", "--stacks"], args, &env)
        };
        let (whole, reach) = (run(true), run(false));
        let counted = |traced: &Traced, what: &str| {
            traced.footer_stacks()[what].as_u64().unwrap_or_else(|| {
                panic!("{}: no {what}: {}", python.label, traced.footer_stacks())
            })
        };
        for traced in [&whole, &reach] {
            assert_eq!(traced.footer_stacks()["calls"], 200, "{}", python.label);
        }
        // The same reads, less those that faulted: a window may reach past the stack's end
        // (where the kernel's random offset puts it), then read again to its page's end.
        let made = |traced: &Traced| {
            counted(traced, "memory_reads") - counted(traced, "memory_read_faults")
        };
        assert_eq!(
            made(&reach),
            made(&whole),
            "{}: the same reads: {} against {}",
            python.label,
            reach.footer_stacks(),
            whole.footer_stacks()
        );
        let (bytes_whole, bytes_reach) = (
            counted(&whole, "memory_read_bytes"),
            counted(&reach, "memory_read_bytes"),
        );
        if python.minor >= 12 {
            tried += 1;
            // Each call's first C-stack window was 8 KiB (or to the stack's end, where
            // that was nearer); now only the first call's is, and each later call of this
            // 3-frame loop copies under 2 KiB in all (about 650 bytes here).
            assert!(
                bytes_reach < bytes_whole && bytes_reach < 200 * 2048,
                "{}: {bytes_reach} bytes read against {bytes_whole}",
                python.label
            );
        } else {
            assert_eq!(bytes_reach, bytes_whole, "{}", python.label);
        }
        let stacks = |traced: &Traced| traced.stacks().into_values().collect::<Vec<_>>();
        assert_eq!(stacks(&whole).len(), 1, "{}", python.label);
        assert_eq!(stacks(&reach), stacks(&whole), "{}", python.label);
    }
    assert!(
        tried >= 2 || cfg!(not(target_arch = "x86_64")),
        "no 3.12+ interpreter to trace"
    );
}

/// Every stack program leaves a fifth of the verifier's budget of instructions to spare
/// (`CUDATRACE_VERIFIER_STATS`): the walk once stood at 96% of it unseen, so that any
/// branch more made it fail to load. On kernels with uprobe_multi, whose loader reports the
/// statistics (the verifiers of older kernels are checked by loading, in vm-test).
#[test]
fn each_stack_program_leaves_room_under_the_verifiers_limit() {
    let Some(_guard) = root() else { return };
    if !kernel_at_least(6, 6) {
        return;
    }
    let output = Command::new(CUDATRACE)
        .env("CUDATRACE_VERIFIER_STATS", "1")
        .args([
            "run",
            "-q",
            "--stacks",
            "--missing-probes",
            "ignore",
            "--libcuda",
        ])
        .arg(&standin().lib)
        .args(["-o", "/dev/null", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stderr = stderr(&output);
    let mut seen = BTreeMap::new();
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix("verifier-stats ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let name = words.next().unwrap().to_string();
        let field = |key: &str| -> u64 {
            rest.split_whitespace()
                .find_map(|word| word.strip_prefix(key))
                .and_then(|value| value.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {line}"))
        };
        seen.insert(name, (field("processed="), field("limit=")));
    }
    for program in [
        "stack_walk",
        "stack_walk_ident",
        "stack_threads",
        "stack_codes",
        "stack_capture",
    ] {
        let Some(&(processed, limit)) = seen.get(program) else {
            panic!("no verifier statistics of {program}: {stderr}");
        };
        assert!(
            processed * 5 <= limit * 4,
            "{program}: the verifier processed {processed} instructions of its {limit}"
        );
    }
}

/// A wrong layout (one field of cudatrace's table moved by the tests' hook) gives no stack:
/// the check on the live process refuses it before the probes read a frame, says why in
/// the `interpreter` line and once on stderr, and every call is counted
/// `unsupported_python`. A field the interpreter's DWARF (pyenv's) or its own
/// `_Py_DebugOffsets` (3.13+) give is taken from them instead: the stacks stay exact and
/// the difference is said.
#[test]
fn a_wrong_layout_gives_no_stacks_and_says_why() {
    let Some(_guard) = root() else { return };
    let script = "stacks_target.py";
    let shift = "CUDATRACE_TEST_LAYOUT_SHIFT";
    let failing = "its layout fails the check on the live process: ";
    for python in pythons() {
        let label = &python.label;
        let frame_code = match python.minor {
            10 | 11 => 32,
            _ => 0,
        };
        for (moved, differs, reason) in [
            // No interpreter's debug offsets give `tstate_interp` (16 in every version).
            (
                "tstate_interp+8",
                "tstate_interp: 16 in the file, 24 in the table".to_owned(),
                "a thread state does not point back at its interpreter (tstate_interp at 24)"
                    .to_owned(),
            ),
            (
                "frame_code+8",
                format!(
                    "frame_code: {frame_code} in the file, {} in the table",
                    frame_code + 8
                ),
                format!(
                    "a frame's code object (frame_code at {}, code_ob_type at 8) is not of \
                     type code",
                    frame_code + 8
                ),
            ),
        ] {
            let traced = python.trace_with(script, &["--stacks"], &[], &[(shift, moved)]);
            let (offsets, file) = python.offsets();
            if offsets == "table" || (offsets == "debug_offsets" && moved == "tstate_interp+8") {
                assert_refused(&traced, label, &format!("{failing}{reason}"), moved);
                continue;
            }
            assert_eq!(
                assert_stacks_are_cpythons(&python, &traced, 128),
                (15, 0),
                "{label} {moved}"
            );
            let interpreter = traced.interpreter();
            assert_eq!(interpreter["stacks"], true, "{label}");
            assert_eq!(
                (
                    interpreter["offsets"].as_str(),
                    interpreter["offsets_file"].as_str()
                ),
                (Some(offsets), file.as_deref()),
                "{label} {moved}"
            );
            assert_eq!(
                interpreter["table_differs"],
                serde_json::json!([differs]),
                "{label}"
            );
            let theirs = match &file {
                Some(file) => format!("its DWARF ({file}) differs"),
                None => "its _Py_DebugOffsets differ".into(),
            };
            assert_eq!(
                traced
                    .stderr
                    .matches(&format!(
                        "{theirs} from cudatrace's table for 3.{} ({differs}): the file's are \
                         used",
                        python.minor
                    ))
                    .count(),
                1,
                "{label}: {}",
                traced.stderr
            );
        }
    }
}

/// pyenv's libpython split as a `-dbg` package splits it (`objcopy --only-keep-debug`, the
/// library stripped of its DWARF and linked to the debug file by `.gnu_debuglink`): with
/// the table wrong, the layout comes from the debug file and the stacks are exact; the same
/// library without its debug file is refused as the table is.
#[test]
fn a_separate_debug_file_gives_the_layout_over_a_wrong_table() {
    let Some(_guard) = root() else { return };
    if cfg!(not(target_arch = "x86_64")) {
        eprintln!("skipped: its libpython is pyenv's 3.11.7, an x86-64 build");
        return;
    }
    let pyenv = Path::new("/root/.pyenv/versions/3.11.7");
    let dir = scratch("stacks-debuglink");
    let library = dir.join("libpython3.11.so.1.0");
    let debug = dir.join("libpython3.11.so.1.0.debug");
    let run = |args: &[&std::ffi::OsStr]| {
        let status = Command::new(args[0])
            .args(&args[1..])
            .current_dir(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "{args:?}");
    };
    let original = pyenv.join("lib/libpython3.11.so.1.0");
    run(&[
        "objcopy".as_ref(),
        "--only-keep-debug".as_ref(),
        original.as_os_str(),
        debug.as_os_str(),
    ]);
    run(&[
        "strip".as_ref(),
        "--strip-debug".as_ref(),
        "-o".as_ref(),
        library.as_os_str(),
        original.as_os_str(),
    ]);
    run(&[
        "objcopy".as_ref(),
        "--add-gnu-debuglink=libpython3.11.so.1.0.debug".as_ref(),
        library.as_os_str(),
    ]);
    let python = Python::host(
        "debuglink-3.11.7",
        pyenv.join("bin/python3.11").to_str().unwrap(),
        11,
    )
    .expect("pyenv's 3.11.7");
    let shift = [("CUDATRACE_TEST_LAYOUT_SHIFT", "tstate_interp+8")];
    // SAFETY: the tests of this binary run one at a time (the root lock).
    unsafe { std::env::set_var("LD_LIBRARY_PATH", &dir) };
    let traced = python.trace_with("stacks_target.py", &["--stacks"], &[], &shift);
    std::fs::remove_file(&debug).unwrap();
    let without = python.trace_with("stacks_target.py", &["--stacks"], &[], &shift);
    unsafe { std::env::remove_var("LD_LIBRARY_PATH") };

    let interpreter = traced.interpreter();
    assert_eq!(
        (
            interpreter["path"].as_str(),
            interpreter["offsets"].as_str(),
            interpreter["offsets_file"].as_str()
        ),
        (library.to_str(), Some("dwarf"), debug.to_str())
    );
    assert_eq!(
        interpreter["table_differs"],
        serde_json::json!(["tstate_interp: 16 in the file, 24 in the table"])
    );
    assert_eq!(assert_stacks_are_cpythons(&python, &traced, 128), (15, 0));
    assert_eq!(without.interpreter()["path"].as_str(), library.to_str());
    assert_refused(
        &without,
        &python.label,
        "its layout fails the check on the live process: a thread state does not point back \
         at its interpreter (tstate_interp at 24)",
        "tstate_interp+8",
    );
}

/// An interpreter looked at before it is initialised (libcuda preloaded: opened by the
/// loader) has no frame to check then: it is checked at its first stack, while it runs. The
/// right layout keeps its stacks; a wrong one is refused then, said in a second
/// `interpreter` line, and the stacks walked with it are dropped, counted.
#[test]
fn a_layout_unchecked_at_first_is_checked_at_the_first_stack() {
    let Some(_guard) = root() else { return };
    let standin = standin();
    let dir = scratch("stacks-preloaded");
    let script = scripts().join("stacks_preloaded.py");
    let trace = |name: &str, env: &[(&str, &str)]| {
        let path = dir.join(name);
        let output = Command::new(CUDATRACE)
            .envs(env.iter().copied())
            .args(["run", "--stacks", "--missing-probes", "ignore", "-o"])
            .arg(&path)
            .args(["--", "env"])
            .arg(format!("LD_PRELOAD={}", standin.lib.display()))
            .arg("/usr/bin/python3.11")
            .arg(&script)
            .arg(&standin.lib)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        (read_trace(&path), stderr(&output))
    };
    let of_type = |lines: &[Value], kind: &str| -> Vec<Value> {
        lines
            .iter()
            .filter(|l| l["type"] == kind)
            .cloned()
            .collect()
    };
    let unchecked = serde_json::json!({"thread_states": 0, "frames": 0, "code_objects": 0});

    let (lines, _) = trace("right.jsonl", &[]);
    let interpreters = of_type(&lines, "interpreter");
    assert_eq!(interpreters.len(), 1, "{interpreters:?}");
    assert_eq!(interpreters[0]["stacks"], true);
    assert_eq!(interpreters[0]["checked"], unchecked);
    let stacks = of_type(&lines, "stack");
    let file = script.display().to_string();
    let frames: Vec<Value> = stacks
        .iter()
        .map(|stack| {
            let frame = &stack["frames"][0];
            serde_json::json!([frame["file"], frame["qualname"], frame["line"]])
        })
        .collect();
    let line = |name| serde_json::json!([file, "<module>", marked("stacks_preloaded.py", name)]);
    assert_eq!(frames, [line("first"), line("second")]);
    assert_eq!(lines.last().unwrap()["stacks"]["calls"], 2);

    let (lines, stderr) = trace(
        "wrong.jsonl",
        &[("CUDATRACE_TEST_LAYOUT_SHIFT", "code_qualname+8")],
    );
    let interpreters = of_type(&lines, "interpreter");
    assert_eq!(interpreters.len(), 2, "{interpreters:?}");
    assert_eq!(
        (&interpreters[0]["stacks"], &interpreters[0]["checked"]),
        (&Value::Bool(true), &unchecked)
    );
    let reason = "its layout fails the check on the live process: a code object's co_qualname \
                  (code_qualname at 136) is not a str as laid out: its type is not str";
    assert_eq!(
        (
            interpreters[1]["stacks"].as_bool(),
            interpreters[1]["reason"].as_str()
        ),
        (Some(false), Some(reason))
    );
    assert_eq!(stderr.matches(reason).count(), 1, "{stderr}");
    assert!(of_type(&lines, "stack").is_empty());
    let footer = &lines.last().unwrap()["stacks"];
    assert_eq!(footer["calls"], 0);
    for (why, count) in footer["without"].as_object().unwrap() {
        let expected = if why == "unsupported_python" { 2 } else { 0 };
        assert_eq!(count, expected, "{why}");
    }
}

/// No stack, the reason in the interpreter line and once on stderr, the 15 calls counted.
fn assert_refused(traced: &Traced, label: &str, reason: &str, shift: &str) {
    let interpreter = traced.interpreter();
    assert_eq!(
        (
            interpreter["stacks"].as_bool(),
            interpreter["reason"].as_str()
        ),
        (Some(false), Some(reason)),
        "{label}"
    );
    assert_eq!(
        traced
            .lines
            .iter()
            .filter(|l| l["type"] == "interpreter")
            .count(),
        1,
        "{label}"
    );
    assert!(
        !traced.lines.iter().any(|l| l["type"] == "stack"),
        "{label}"
    );
    let calls: Vec<&Value> = traced
        .lines
        .iter()
        .filter(|l| l["type"] == "call")
        .collect();
    assert_eq!(calls.len(), 15, "{label}");
    assert!(calls.iter().all(|c| c.get("stack").is_none()), "{label}");
    let footer = traced.footer_stacks();
    assert_eq!(footer["calls"], 0, "{label}");
    let without = footer["without"].as_object().unwrap();
    for (why, count) in without {
        let expected = if why == "unsupported_python" { 15 } else { 0 };
        assert_eq!(count, expected, "{label}: {why}");
    }
    assert_eq!(
        traced
            .stderr
            .matches(&format!(
                " cannot be read: {reason}: its calls have no Python stacks"
            ))
            .count(),
        1,
        "{label}: {}",
        traced.stderr
    );
    assert_eq!(
        traced
            .stderr
            .matches(&format!(
                "cudatrace: --stacks: CUDATRACE_TEST_LAYOUT_SHIFT moves {shift} in the table"
            ))
            .count(),
        1,
        "{label}: {}",
        traced.stderr
    );
}

#[test]
fn a_stack_deeper_than_the_budget_keeps_its_innermost_frames_and_says_it_was_cut() {
    let Some(_guard) = root() else { return };
    let python = Python::host("debian-3.11", "/usr/bin/python3.11", 11).expect("python3.11");
    let traced = python.trace(
        "stacks_target.py",
        &["--stacks", "--stack-depth", "8"],
        &["40"],
    );
    let (compared, cut) = assert_stacks_are_cpythons(&python, &traced, 8);
    // The recursion (43 frames) and the coroutine (12 frames) are deeper than 8.
    assert_eq!((compared, cut), (15, 2));
    assert_eq!(traced.lines[0]["stacks"]["depth"], 8);
}

/// At the budget's edge: a stack of exactly `--stack-depth` frames is whole, one of a frame
/// more is cut, on every interpreter; on 3.12+ whether the frames after the budget are only
/// the interpreter's own entry frames (whole) or lead to a Python frame (cut).
#[test]
fn a_stack_of_exactly_the_budget_is_whole_and_one_frame_more_is_cut() {
    let Some(_guard) = root() else { return };
    for python in pythons() {
        let traced = python.trace(
            "stacks_depth.py",
            &["--stacks", "--stack-depth", "8"],
            &["8"],
        );
        let mut depths: Vec<usize> = traced.recorded().values().flatten().map(Vec::len).collect();
        depths.sort_unstable();
        assert_eq!(depths, [7, 7, 7, 8, 8, 8, 9, 9, 9], "{}", python.label);
        // Direct, through `map` and in a thread, at 7, 8 and 9 frames: the three of 9 cut.
        let (compared, cut) = assert_stacks_are_cpythons(&python, &traced, 8);
        assert_eq!((compared, cut), (9, 3), "{}", python.label);
        let cut_lengths: Vec<usize> = traced
            .stacks()
            .values()
            .filter(|(_, cut)| *cut)
            .map(|(frames, _)| frames.len())
            .collect();
        assert_eq!(cut_lengths, [8, 8, 8], "{}", python.label);
    }
}

/// A stack deeper than a chunk of CPython's data stack (16 KiB: a deeper stack continues
/// in a new chunk, anywhere in memory) is CPython's on every interpreter, and each later
/// call reads it a window at a time: from 3.11 a page of the data stack, or 8 KiB of the C
/// stack around 3.12+'s entry frames. 50 calls each from a recursion 238 frames deep, and
/// from 122 levels of calls through `map` (on 3.12+ an entry frame between every two: 244
/// walked). Before, the caller of a chunk's first frame (not within a window below the
/// frames read) was taken for an entry frame, read with the C stack's 8 KiB above it, and
/// each of its callers below took a read of its own: 146 reads a call of the recursion and
/// 291 of 362 frames through nested objects on 3.12, against 15 and 27 now (the build VM).
/// Here each later call reads at most 8, plus one for each 8 frames walked (and one for
/// each frame's identity where the probe on code frees cannot be linked: the arm64 6.1
/// guest read 18,698 in all, 698 of them windows).
#[test]
fn a_stack_deeper_than_a_data_stack_chunk_is_read_a_window_at_a_time() {
    let Some(_guard) = root() else { return };
    let per_process = kernel_at_least(6, 6);
    for python in pythons() {
        let linked = python.minor < 14 && per_process;
        let args: &[&str] = if linked { &["50", "wait"] } else { &["50"] };
        let traced = python.trace(
            "stacks_chunks.py",
            &["--stacks", "--stack-depth", "256"],
            args,
        );
        assert_eq!(
            assert_stacks_are_cpythons(&python, &traced, 256),
            (100, 0),
            "{}",
            python.label
        );
        let footer = traced.footer_stacks();
        if python.minor < 11 {
            // 3.10's frames are objects, each where the allocator put it: read one by one.
            continue;
        }
        // The stacks read whole (the first of each, and again after the probe on code
        // frees was linked) also read each frame's identity: one read a frame.
        let counted = |what: &str| footer[what].as_u64().unwrap();
        let whole = footer["stack_records"]["sent_whole"].as_u64().unwrap();
        let (calls, walked, reads) = (
            counted("calls"),
            counted("frames_walked"),
            counted("memory_reads"),
        );
        assert_eq!(calls, 100, "{}", python.label);
        // Where the probe on code frees cannot be linked (3.11 to 3.13 on a kernel without
        // uprobe_multi), every walk also reads each frame's identity: a read a frame.
        let identities = if python.minor < 14 && !per_process {
            walked
        } else {
            0
        };
        // (Saturating: where every frame's identity is read, the later calls' windows
        // can number fewer than the allowance for the stacks read whole, as on 5.10 since
        // 3.12+'s windows reach down to their chunk's start.)
        let later = reads.saturating_sub(whole * (walked / calls + 8) + identities);
        eprintln!(
            "{}: {reads} reads, {whole} stacks read whole, {later} by the later calls, \
             {walked} frames walked",
            python.label
        );
        assert!(
            later <= 8 * calls + walked / 8,
            "{}: {reads} reads for {calls} calls of {walked} frames in all, {whole} read \
             whole: {footer}",
            python.label
        );
    }
}

/// 3.12+: a frame in the thread's current data-stack chunk is read with everything below
/// it down to the chunk's start, not only down to its page (the chunk is one mapping,
/// written from its start as frames were pushed). A recursion of 20 frames of a function
/// with 16 locals (about 5 KiB of one chunk, across a page) then takes one read a call
/// fewer than with the windows stopping at their page (`CUDATRACE_STACKS_NO_DATA_CHUNK`),
/// every call, and its stacks are CPython's either way (measured on the build VM: 5.38
/// reads a call against 6.38 on 3.12 and 3.13). 3.11 keeps the chunk past its thread
/// state's read: the switch changes nothing there.
#[test]
fn a_data_stack_within_its_chunk_is_read_in_one_window() {
    let Some(_guard) = root() else { return };
    let per_process = kernel_at_least(6, 6);
    for python in pythons() {
        if python.minor < 11 {
            continue;
        }
        let linked = python.minor < 14 && per_process;
        let args: &[&str] = if linked {
            &["100", "20", "wait"]
        } else {
            &["100", "20"]
        };
        let mut reads = Vec::new();
        for env in [&[][..], &[("CUDATRACE_STACKS_NO_DATA_CHUNK", "1")][..]] {
            let traced = python.trace_with("stacks_data_chunk.py", &["-q", "--stacks"], args, env);
            assert_eq!(
                assert_stacks_are_cpythons(&python, &traced, 128),
                (100, 0),
                "{}",
                python.label
            );
            let footer = traced.footer_stacks();
            let counted = |what: &str| footer[what].as_u64().unwrap();
            assert_eq!(counted("calls"), 100, "{}", python.label);
            reads.push(counted("memory_reads") - counted("memory_read_faults"));
        }
        eprintln!("{}: reads {reads:?}", python.label);
        let fewer = if python.minor >= 12 { 100 } else { 0 };
        assert_eq!(reads[1] - reads[0], fewer, "{}: {reads:?}", python.label);
    }
}

/// A function whose line table is over the 16 KiB a code record holds (Inductor's
/// generated `call`) keeps its frame, its line (the table read apart) and the rest of the
/// stack, on every interpreter; the footer counts the table as read, once in each process
/// image: where the probe on code frees is linked at the first stack (3.10 to 3.13 with
/// uprobe_multi), the script waits for the layout given again between its two runs of the
/// function, which is read again under it.
#[test]
fn a_function_with_a_line_table_over_16_kib_keeps_its_frame_and_line() {
    let Some(_guard) = root() else { return };
    let per_process = kernel_at_least(6, 6);
    for python in pythons() {
        let linked = python.minor < 14 && per_process;
        let args: &[&str] = if linked { &["wait"] } else { &[] };
        let traced = python.trace("stacks_long.py", &["--stacks"], args);
        // Two calls from its middle and two from its end, under main and the module.
        assert_eq!(
            assert_stacks_are_cpythons(&python, &traced, 128),
            (4, 0),
            "{}",
            python.label
        );
        let stacks = traced.stacks();
        let inner: Vec<&Frame> = stacks.values().map(|(frames, _)| &frames[0]).collect();
        assert_eq!(inner.len(), 2, "{}", python.label);
        for frame in inner {
            assert_eq!(
                (frame.0.as_str(), frame.1.as_str(), frame.2.is_some()),
                ("<generated inductor call>", "call", true),
                "{}",
                python.label
            );
        }
        let footer = traced.footer_stacks();
        assert_eq!(
            footer["long_linetables"],
            serde_json::json!({"read": if linked { 2 } else { 1 }, "unread": 0}),
            "{}",
            python.label
        );
        assert_eq!(
            footer["code_objects_unusable"],
            serde_json::json!({"not_code": 0, "read_fault": 0, "bad_name": 0}),
            "{}",
            python.label
        );
    }
}

#[test]
fn launches_probed_at_entry_alone_and_per_symbol_links_get_their_stacks() {
    let Some(_guard) = root() else { return };
    let python = Python::host("debian-3.11", "/usr/bin/python3.11", 11).expect("python3.11");
    let traced = python.trace(
        "stacks_target.py",
        &["--stacks=launch,sync", "--launch-entry-only"],
        &[],
    );
    assert_eq!(assert_stacks_are_cpythons(&python, &traced, 128), (15, 0));
    assert_eq!(
        traced.lines[0]["stacks"]["families"],
        serde_json::json!(["launch", "sync"])
    );

    // The older kernels' path: aya's programs on per-symbol links, for every process.
    let output = Command::new(CUDATRACE)
        .env("CUDATRACE_NO_UPROBE_MULTI", "1")
        .args(["run", "-q", "--stacks", "--missing-probes", "ignore", "-o"])
        .arg(python.host_dir.join("perf.jsonl"))
        .arg("--")
        .arg("/usr/bin/python3.11")
        .arg(scripts().join("stacks_target.py"))
        .arg(python.host_dir.join("libcuda.so.1"))
        .arg(python.host_dir.join("stacks_target.py.json"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let traced = Traced {
        lines: read_trace(&python.host_dir.join("perf.jsonl")),
        recorded: serde_json::from_str(
            &std::fs::read_to_string(python.host_dir.join("stacks_target.py.json")).unwrap(),
        )
        .unwrap(),
        stderr: stderr(&output),
    };
    assert_eq!(traced.lines[0]["attach"]["mechanism"], "perf_event");
    let perf = Python {
        seen_dir: scripts(),
        ..python
    };
    assert_eq!(assert_stacks_are_cpythons(&perf, &traced, 128), (15, 0));
}

/// `--stack-every N` picks calls at random, 1 in N: those stacks are still CPython's, the
/// others are counted as sampled out, and the trace says N.
#[test]
fn with_stack_every_calls_are_walked_at_random_one_in_n() {
    let Some(_guard) = root() else { return };
    for python in pythons() {
        let traced = python.trace("stacks_target.py", &["--stacks", "--stack-every", "3"], &[]);
        let per_thread: Vec<usize> = traced.calls_by_thread().values().map(Vec::len).collect();
        assert_eq!(per_thread.iter().sum::<usize>(), 15, "{}", python.label);
        let (compared, cut) = assert_sampled_stacks_are_cpythons(&python, &traced, 128, 3);
        assert_eq!(cut, 0, "{}", python.label);
        let sampled_out = traced.footer_stacks()["without"]["sampled_out"]
            .as_u64()
            .unwrap_or(0);
        assert_eq!(compared as u64 + sampled_out, 15, "{}", python.label);
        assert_eq!(traced.lines[0]["stacks"]["every"], 3, "{}", python.label);
    }

    // A loop whose step makes four calls from four lines, 400 steps, in the main thread
    // and then in two threads taking turns a step each; launches probed at entry alone.
    // Walking every 4th call of a thread would give line a its 400 calls and b, c and d
    // none; a count shared by the threads, some lines of one thread and none of the
    // other's. At random, each line of each thread has Binomial(400, 1/4) stacks: mean
    // 100, outside 50..=150 with a chance of 1.2e-8 (12 lines: about 1.5e-7 a run).
    let python = Python::host("debian-3.11", "/usr/bin/python3.11", 11).expect("python3.11");
    let traced = python.trace(
        "stacks_sampled.py",
        &[
            "--stacks=launch,sync",
            "--launch-entry-only",
            "--stack-every",
            "4",
        ],
        &[],
    );
    let by_thread = traced.calls_by_thread();
    assert_eq!(
        by_thread.values().map(Vec::len).collect::<Vec<_>>(),
        [1600; 3]
    );
    let (walked, _) = assert_sampled_stacks_are_cpythons(&python, &traced, 128, 4);
    assert_eq!(
        traced.footer_stacks()["without"]["sampled_out"],
        (3 * 1600 - walked) as u64
    );
    let recorded = traced.recorded();
    let lines = ["a", "b", "c", "d"].map(|name| marked("stacks_sampled.py", name));
    for (tid, stacks) in &by_thread {
        // Per line of the loop: its calls, and those with a stack.
        let mut by_line: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
        for (stack, want) in stacks.iter().zip(&recorded[tid]) {
            let line = by_line.entry(want[0].2.unwrap()).or_default();
            line.0 += 1;
            line.1 += usize::from(stack.is_some());
        }
        assert_eq!(
            by_line.keys().copied().collect::<Vec<_>>(),
            lines,
            "thread {tid}"
        );
        for (line, (calls, walked)) in &by_line {
            assert_eq!(*calls, 400, "thread {tid} line {line}");
            assert!(
                (50..=150).contains(walked),
                "thread {tid} line {line}: {walked} of 400 calls walked: {by_line:?}"
            );
        }
        eprintln!("--stack-every 4, thread {tid}: (calls, walked) by line {by_line:?}");
    }
    let launches = calls(&traced.lines)
        .into_iter()
        .filter(|c| c["name"].as_str().unwrap().starts_with("cuLaunchKernel"))
        .map(|c| c.get("stack").is_some())
        .collect::<Vec<_>>();
    // Entry-only launches: some walked, some sampled out.
    assert_eq!(launches.len(), 3 * 800);
    assert!(launches.contains(&true) && launches.contains(&false));

    // `--stack-every 1` is every call, as without it, and says nothing of sampling.
    let traced = python.trace("stacks_target.py", &["--stacks", "--stack-every", "1"], &[]);
    assert_eq!(assert_stacks_are_cpythons(&python, &traced, 128), (15, 0));
    assert!(traced.lines[0]["stacks"].get("every").is_none());
    assert!(
        traced.footer_stacks()["without"]
            .get("sampled_out")
            .is_none()
    );
}

/// A walked call's duration is the call's alone: its entry is stamped after its walk, so
/// that with `--stack-every` the walked calls and the skipped ones of one function measure
/// the same thing. 600 calls of the stand-in from 252 frames deep, 1 in 2 walked. The two
/// medians differ by less than a quarter of what a walk costs on the machine at hand (the
/// kernel's statistics of the call-entry program, which runs the walk's tail calls): on
/// the build VM 0.1 to 0.2 µs of a 4.1 to 4.8 µs walk; stamped before the walk, 2.5 to
/// 3.8 µs. (The test before had a limit of 3 µs from 101 frames deep, set when such a
/// walk cost 17 µs: it failed under arm64 emulation, where everything takes several
/// times as long, and no longer told the two stamps apart on x86-64: 1.0 to 1.3 µs.)
#[test]
fn a_walked_calls_duration_leaves_its_walk_out() {
    let Some(_guard) = root() else { return };
    let python = Python::host("debian-3.11", "/usr/bin/python3.11", 11).expect("python3.11");
    let traced = python.trace_with(
        "stacks_timing.py",
        &[
            "-q",
            "--stacks=sync",
            "--stack-every",
            "2",
            "--stack-depth",
            "256",
        ],
        &[],
        &[("CUDATRACE_BPF_STATS", "1")],
    );
    let (mut walked, mut skipped) = (Vec::new(), Vec::new());
    for call in calls(&traced.lines) {
        let dur = call["dur_ns"].as_u64().unwrap();
        match call.get("stack") {
            Some(_) => walked.push(dur),
            None => skipped.push(dur),
        }
    }
    assert_eq!(walked.len() + skipped.len(), 600);
    // Binomial(600, 1/2): below 200 with a chance of about 1e-16.
    assert!(
        walked.len() >= 200 && skipped.len() >= 200,
        "{} {}",
        walked.len(),
        skipped.len()
    );
    assert_eq!(
        traced.footer_stacks()["without"]["sampled_out"],
        skipped.len() as u64
    );
    let median = |durations: &mut Vec<u64>| {
        durations.sort_unstable();
        durations[durations.len() / 2]
    };
    let walks = walked.len() as u64;
    let (walked, skipped) = (median(&mut walked), median(&mut skipped));
    // The call-entry program's time over the walked calls: a walk's cost, plus that of
    // two calls' entries (1 in 2 walked), a few hundred ns.
    let program_ns: u64 = traced
        .stderr
        .lines()
        .find(|line| line.contains("bpf-stats call_enter "))
        .and_then(|line| {
            line.split("run_time_ns=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no bpf-stats line for call_enter: {}", traced.stderr));
    let walk = program_ns / walks;
    eprintln!("median duration: walked {walked} ns, skipped {skipped} ns; a walk {walk} ns");
    assert!(
        walked.abs_diff(skipped) < walk / 4,
        "walked calls' median {walked} ns, skipped ones' {skipped} ns, a walk {walk} ns"
    );
}

/// `--stack-rate HZ`: at most HZ stacked calls a second per thread, from a bucket of HZ
/// refilled at HZ a second (its arithmetic: tracer-common's unit tests). A burst of 1,000
/// calls (some milliseconds) gets stacks for exactly its first 10 calls at 10 a second,
/// whichever thread makes it and whatever the others do (where a burst takes 90 ms or
/// more, as in an emulated guest, its first 10 and what its bucket refilled, to one call); after a pause of 0.55 s (some 0.6
/// s between the calls) the main thread has what refilled, at least a call each 100 ms of
/// the pause, and what its bucket run over the calls' times gives, to one call (a walked
/// call's time is its walk's end, the bucket's its entry). The rest are counted
/// as rate limited, and the header says the rate.
#[test]
fn with_stack_rate_each_thread_gets_at_most_hz_stacks_a_second() {
    let Some(_guard) = root() else { return };
    let python = Python::host("debian-3.11", "/usr/bin/python3.11", 11).expect("python3.11");
    let traced = python.trace(
        "stacks_rate.py",
        &["--stacks=sync", "--stack-rate", "10"],
        &[],
    );
    assert_eq!(traced.lines[0]["stacks"]["rate"], 10);
    let mut by_thread: BTreeMap<u64, Vec<(u64, bool)>> = BTreeMap::new();
    for call in calls(&traced.lines) {
        by_thread
            .entry(call["tid"].as_u64().unwrap())
            .or_default()
            .push((call["ts_ns"].as_u64().unwrap(), call.get("stack").is_some()));
    }
    let main = traced.lines[0]["pids"][0].as_u64().unwrap();
    assert_eq!(by_thread.len(), 3);
    let mut first_10 = vec![true; 10];
    first_10.extend([false; 990]);
    let mut stacked = 0;
    for (tid, calls) in &mut by_thread {
        calls.sort_unstable();
        assert_eq!(calls.len(), if *tid == main { 2000 } else { 1000 });
        let first: Vec<bool> = calls[..1000].iter().map(|(_, s)| *s).collect();
        let span_ms = (calls[999].0 - calls[0].0) / 1_000_000;
        // The thread's bucket, run over its calls' times.
        let mut bucket = tracer_common::stacks::RateBucket::full(10, calls[0].0);
        let by_bucket: Vec<bool> = calls.iter().map(|(ts, _)| bucket.take(10, *ts)).collect();
        if span_ms < 90 {
            // Under 100 ms not one call refills: exactly the first 10.
            assert_eq!(first, first_10, "thread {tid}");
        } else {
            // A slow machine (an emulated guest): the first 10, then what refilled over
            // the burst, to one call.
            let in_burst = first.iter().filter(|s| **s).count();
            let expected = by_bucket[..1000].iter().filter(|s| **s).count();
            eprintln!(
                "thread {tid}: a burst of {span_ms} ms, {in_burst} stacked, {expected} by the bucket"
            );
            assert_eq!(first[..10], first_10[..10], "thread {tid}");
            assert!(
                in_burst.abs_diff(expected) <= 1,
                "thread {tid}: a burst of {span_ms} ms, {in_burst} stacked, the bucket's {expected}"
            );
        }
        stacked += calls.iter().filter(|(_, s)| *s).count();
        if *tid != main {
            continue;
        }
        let expected = by_bucket[1000..].iter().filter(|s| **s).count();
        let after_pause = calls[1000..].iter().filter(|(_, s)| *s).count();
        let pause_ms = (calls[1000].0 - calls[999].0) / 1_000_000;
        eprintln!(
            "--stack-rate 10: after {pause_ms} ms, {after_pause} stacked, {expected} by the bucket"
        );
        assert!(
            // The bucket holds 10: a pause over a second refills it, no more.
            after_pause.abs_diff(expected) <= 1
                && after_pause >= ((pause_ms / 100) as usize).min(10),
            "after {pause_ms} ms: {after_pause} stacked, the bucket's {expected}"
        );
    }
    let footer = traced.footer_stacks();
    assert_eq!(footer["calls"], stacked as u64);
    assert_eq!(footer["without"]["rate_limited"], (4000 - stacked) as u64);
    assert!(footer["without"].get("sampled_out").is_none());
}

#[test]
fn stack_every_is_checked() {
    for (args, message) in [
        (
            &["--stacks", "--stack-every", "0"][..],
            "must be 1 to 1000000",
        ),
        (
            &["--stacks", "--stack-every", "1000001"][..],
            "must be 1 to 1000000",
        ),
        (&["--stacks", "--stack-every", "x"][..], "invalid digit"),
        (&["--stack-every", "4"][..], "--stacks"),
        (
            &["--stacks", "--stack-rate", "0"][..],
            "must be 1 to 1000000",
        ),
        (
            &["--stacks", "--stack-rate", "1000001"][..],
            "must be 1 to 1000000",
        ),
        (&["--stack-rate", "10"][..], "--stacks"),
        (
            &["--stacks", "--stack-rate", "10", "--stack-every", "4"][..],
            "cannot be used with",
        ),
    ] {
        let output = Command::new(CUDATRACE)
            .arg("run")
            .args(args)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&output).contains(message),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

/// A stripped copy of pyenv's libpython (no `.symtab`: `_PyRuntime` and `PyCode_Type` from
/// its dynamic symbols) gives the same stacks.
#[test]
fn a_stripped_interpreter_is_read_from_its_dynamic_symbols() {
    let Some(_guard) = root() else { return };
    if cfg!(not(target_arch = "x86_64")) {
        eprintln!("skipped: its libpython is pyenv's 3.11.7, an x86-64 build");
        return;
    }
    let pyenv = Path::new("/root/.pyenv/versions/3.11.7");
    let dir = scratch("stacks-stripped");
    let library = dir.join("libpython3.11.so.1.0");
    let status = Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&library)
        .arg(pyenv.join("lib/libpython3.11.so.1.0"))
        .status()
        .unwrap();
    assert!(status.success());
    let python = Python::host(
        "stripped-3.11.7",
        pyenv.join("bin/python3.11").to_str().unwrap(),
        11,
    )
    .expect("pyenv's 3.11.7");
    // SAFETY: the tests of this binary run one at a time (the root lock).
    unsafe { std::env::set_var("LD_LIBRARY_PATH", &dir) };
    let traced = python.trace("stacks_target.py", &["--stacks"], &[]);
    unsafe { std::env::remove_var("LD_LIBRARY_PATH") };
    assert_eq!(
        traced.interpreter()["path"].as_str(),
        Some(library.to_str().unwrap())
    );
    // Stripped of its DWARF too: the table's offsets.
    assert_eq!(traced.interpreter()["offsets"], "table");
    assert_eq!(assert_stacks_are_cpythons(&python, &traced, 128), (15, 0));
}

/// What cannot get a stack says why, once, and loses nothing else: a program that is not
/// Python, a Python cudatrace does not read (3.9), a thread Python did not start.
#[test]
fn calls_without_a_readable_python_are_counted_with_their_reason_and_nothing_else_is_lost() {
    let Some(_guard) = root() else { return };
    let standin = standin();
    let dir = scratch("stacks-bad");
    let run = |trace: &Path, extra: &[&str], command: &[&str]| {
        Command::new(CUDATRACE)
            .args(["run", "--missing-probes", "ignore", "--libcuda"])
            .arg(&standin.lib)
            .arg("-o")
            .arg(trace)
            .args(extra)
            .arg("--")
            .args(command)
            .output()
            .unwrap()
    };

    // Not Python: the demo, with and without --stacks, the same calls.
    let demo = standin.demo.to_str().unwrap();
    let output = run(&dir.join("demo.jsonl"), &["--stacks"], &[demo]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let with = read_trace(&dir.join("demo.jsonl"));
    run(&dir.join("plain.jsonl"), &[], &[demo]);
    let without = read_trace(&dir.join("plain.jsonl"));
    assert_eq!(names(&calls(&with)), names(&calls(&without)));
    let interpreter = with.iter().find(|l| l["type"] == "interpreter").unwrap();
    assert_eq!(interpreter["stacks"], false);
    assert_eq!(
        interpreter["reason"].as_str().unwrap(),
        format!(
            "no Python interpreter: neither {demo} nor a libpython3.X.so it maps has _PyRuntime"
        )
    );
    assert!(
        stderr(&output).contains(&format!(
            "cudatrace: --stacks: pid {}: no Python interpreter",
            interpreter["pid"]
        )),
        "{}",
        stderr(&output)
    );
    let footer = with.last().unwrap();
    // The demo's calls of the default families: launches, allocations and frees, copies,
    // stream synchronisations, its library load (121 of its 133 calls).
    let stacked = calls(&with)
        .iter()
        .filter(|c| {
            let name = c["name"].as_str().unwrap();
            [
                "cuLaunchKernel",
                "cuMem",
                "cuStreamSynchronize",
                "cuLibraryLoadData",
            ]
            .iter()
            .any(|family| name.starts_with(family))
        })
        .count() as u64;
    assert_eq!(stacked, 121);
    assert_eq!(footer["stacks"]["without"]["not_python"], stacked);
    assert_eq!(footer["stacks"]["calls"], 0);
    assert_eq!(footer["lost"]["total"], 0);
    assert!(calls(&with).iter().all(|c| c.get("stack").is_none()));
    // Sampled: the same count, by that reason and not by sampling.
    let output = run(
        &dir.join("demo.jsonl"),
        &["--stacks", "--stack-every", "7"],
        &[demo],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let sampled = read_trace(&dir.join("demo.jsonl"));
    let without = &sampled.last().unwrap()["stacks"]["without"];
    assert_eq!(without["not_python"], 121, "{without}");
    assert!(without.get("sampled_out").is_none(), "{without}");

    // A Python cudatrace does not read: said, and counted.
    let script = scripts().join("stacks_native.py");
    let lib = standin.lib.to_str().unwrap();
    let old = "/root/.pyenv/versions/3.9.18/bin/python3.9";
    if present(Path::new(old)) {
        let output = run(
            &dir.join("old.jsonl"),
            &["--stacks"],
            &[old, script.to_str().unwrap(), lib],
        );
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let trace = read_trace(&dir.join("old.jsonl"));
        let interpreter = trace.iter().find(|l| l["type"] == "interpreter").unwrap();
        assert_eq!(
            (
                interpreter["python"].as_str(),
                interpreter["reason"].as_str()
            ),
            (
                Some("3.9"),
                Some("Python 3.9 is not supported (3.10 to 3.14 are)")
            )
        );
        assert!(
            stderr(&output).contains("Python 3.9 ("),
            "{}",
            stderr(&output)
        );
        assert_eq!(calls(&trace).len(), 2);
        assert_eq!(
            trace.last().unwrap()["stacks"]["without"]["unsupported_python"],
            2
        );
    }

    // A free-threaded build (`cargo xtask pythons --free-threaded` builds 3.13t from
    // Debian's source; not in CI, for its build time): refused by name, its calls counted.
    let free_threaded =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("../pythons/3.13t/bin/python3.13t");
    if free_threaded.exists() {
        let output = run(
            &dir.join("free-threaded.jsonl"),
            &["--stacks"],
            &[
                free_threaded.to_str().unwrap(),
                script.to_str().unwrap(),
                lib,
            ],
        );
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        let trace = read_trace(&dir.join("free-threaded.jsonl"));
        let interpreters: Vec<&Value> = trace
            .iter()
            .filter(|l| l["type"] == "interpreter")
            .collect();
        assert_eq!(interpreters.len(), 1);
        let reason = "a free-threaded build (3.13t): cudatrace reads the default build only";
        assert_eq!(
            (
                interpreters[0]["python"].as_str().map(|v| &v[..5]),
                interpreters[0]["stacks"].as_bool(),
                interpreters[0]["reason"].as_str()
            ),
            (Some("3.13."), Some(false), Some(reason))
        );
        assert_eq!(
            stderr(&output)
                .matches(&format!(
                    "/3.13t/bin/python3.13t) cannot be read: {reason}: its calls have no \
                     Python stacks"
                ))
                .count(),
            1,
            "{}",
            stderr(&output)
        );
        assert_eq!(calls(&trace).len(), 2);
        assert!(!trace.iter().any(|l| l["type"] == "stack"));
        let stacks = &trace.last().unwrap()["stacks"];
        assert_eq!(stacks["calls"], 0);
        for (why, count) in stacks["without"].as_object().unwrap() {
            let expected = if why == "unsupported_python" { 2 } else { 0 };
            assert_eq!(count, expected, "{why}");
        }
    } else {
        eprintln!(
            "note: no free-threaded 3.13t at {} (`cargo xtask pythons --free-threaded`): its \
             refusal is not tested in this run",
            free_threaded.display()
        );
    }

    // A thread Python did not start: no thread state; the Python thread's call has its
    // stack.
    let output = run(
        &dir.join("native.jsonl"),
        &["--stacks"],
        &["/usr/bin/python3.11", script.to_str().unwrap(), lib],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&dir.join("native.jsonl"));
    let calls = calls(&trace);
    assert_eq!(calls.len(), 2);
    let pid = &trace[0]["pids"][0];
    let (native, python): (Vec<&&Value>, Vec<&&Value>) =
        calls.iter().partition(|c| &c["tid"] != pid);
    assert_eq!((native.len(), python.len()), (1, 1));
    assert!(native[0].get("stack").is_none());
    let stack = trace
        .iter()
        .find(|l| l["type"] == "stack" && l["id"] == python[0]["stack"])
        .unwrap();
    assert_eq!(
        stack["frames"],
        serde_json::json!([{"file": script.to_str().unwrap(), "qualname": "<module>",
            "line": marked("stacks_native.py", "python"), "first_line": 1}])
    );
    let without = &trace.last().unwrap()["stacks"]["without"];
    assert_eq!(without["no_thread_state"], 1);
    assert_eq!(trace.last().unwrap()["stacks"]["calls"], 1);

    // Sampled, 1 in 7: a call that could have no stack is counted by that reason, before
    // the draw, so the five native threads' calls are all `no_thread_state`; the Python
    // call has its stack or is sampled out.
    let output = run(
        &dir.join("native.jsonl"),
        &["--stacks", "--stack-every", "7"],
        &["/usr/bin/python3.11", script.to_str().unwrap(), lib, "5"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&dir.join("native.jsonl"));
    assert_eq!(trace.iter().filter(|l| l["type"] == "call").count(), 6);
    let footer = &trace.last().unwrap()["stacks"];
    let without = &footer["without"];
    assert_eq!(without["no_thread_state"], 5, "{footer}");
    let sampled_out = without
        .get("sampled_out")
        .map_or(0, |n| n.as_u64().unwrap());
    assert_eq!(
        footer["calls"].as_u64().unwrap() + sampled_out,
        1,
        "{footer}"
    );
}

/// `script` run by Debian's python3.11 with the stand-in libcuda, once it says `ready`:
/// a process for `run -p` (its stdin is a pipe that tells it to go on).
fn started_ready(script: &Path) -> std::process::Child {
    let mut target = Command::new("/usr/bin/python3.11")
        .arg(script)
        .arg(&standin().lib)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(target.stdout.as_mut().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready, "ready\n");
    target
}

/// A process already calling when `-p` attaches: its interpreter is looked at before its
/// probes are attached, so every call traced has its stack. Looked at after, the calls
/// made meanwhile (some milliseconds of them) were counted `not_python`. Traced until the
/// process ends (a timed window could close while a slow guest is still attaching).
#[test]
fn a_busy_process_traced_with_dash_p_has_every_call_stacked() {
    let Some(_guard) = root() else { return };
    let dir = scratch("stacks-dash-p-busy");
    let mut target = started_ready(&scripts().join("stacks_busy.py"));
    let trace_path = dir.join("trace.jsonl");
    let tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "--stacks", "-o"])
        .arg(&trace_path)
        .args(["-p", &target.id().to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_trace(&trace_path, "\"type\":\"call\"");
    std::thread::sleep(std::time::Duration::from_millis(300));
    target.stdin.as_mut().unwrap().write_all(b"stop\n").unwrap();
    assert!(target.wait().unwrap().success());
    let output = tracer.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    let stacks = &trace.last().unwrap()["stacks"];
    let calls = assert_busy_calls_stacked(&trace, target.id());
    assert_eq!(stacks["calls"], calls, "{stacks}");
    assert_eq!(stacks["without"]["not_python"], 0, "{stacks}");

    // `--all` the same way: the busy process's calls, among whatever else runs.
    let mut target = started_ready(&scripts().join("stacks_busy.py"));
    let trace_path = dir.join("all.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--stacks", "--all", "-o"])
        .arg(&trace_path)
        .args(["--", "sleep", "1"])
        .output()
        .unwrap();
    target.stdin.as_mut().unwrap().write_all(b"stop\n").unwrap();
    assert!(target.wait().unwrap().success());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_busy_calls_stacked(&read_trace(&trace_path), target.id());
}

/// With a window, the footer's stacks count the call lines written: a busy process goes
/// on calling after the window closes, until the probes are detached, and those calls
/// (seen, walked, not written) are not in `calls` or `without`.
#[test]
fn a_windows_footer_counts_the_stacks_of_its_own_calls() {
    let Some(_guard) = root() else { return };
    let dir = scratch("stacks-window-footer");
    let mut target = started_ready(&scripts().join("stacks_busy.py"));
    let trace_path = dir.join("trace.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--stacks", "--duration", "1s", "-o"])
        .arg(&trace_path)
        .args(["-p", &target.id().to_string()])
        .output()
        .unwrap();
    target.stdin.as_mut().unwrap().write_all(b"stop\n").unwrap();
    assert!(target.wait().unwrap().success());
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    let footer = trace.last().unwrap();
    // What the test is about: calls after the window, seen and left out.
    assert!(
        footer["window"]["lines_after"].as_u64().unwrap() > 0,
        "{}",
        footer["window"]
    );
    let calls = assert_busy_calls_stacked(&trace, target.id());
    let stacks = &footer["stacks"];
    assert_eq!(stacks["calls"], calls, "{stacks}");
    let without: u64 = stacks["without"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(without, 0, "{stacks}");
}

/// The calls of process `pid` in `trace`: more than 100, each with its stack, nothing
/// lost. Returns their count.
fn assert_busy_calls_stacked(trace: &[Value], pid: u32) -> u64 {
    // Before 5.15 (no attach cookies) a probe is known by where it fired, in the mappings
    // recorded for the process: recorded after the probes attached, a busy process's
    // calls in between were lost (`unidentified_probe`, 3,718 in one run on 5.10).
    assert_complete(trace);
    let footer = trace.last().unwrap();
    let calls: Vec<&Value> = calls(trace)
        .into_iter()
        .filter(|call| call["pid"] == pid)
        .collect();
    let stacked = calls
        .iter()
        .filter(|call| call.get("stack").is_some())
        .count();
    eprintln!("{} calls of {pid}, {stacked} with a stack", calls.len());
    assert!(calls.len() > 100, "{} calls", calls.len());
    assert_eq!(stacked, calls.len(), "{}", footer["stacks"]);
    calls.len() as u64
}

/// A process traced with `-p` is looked at when tracing starts (it maps the library
/// already): its first call has its stack.
#[test]
fn a_process_traced_with_dash_p_is_looked_at_when_tracing_starts() {
    let Some(_guard) = root() else { return };
    let dir = scratch("stacks-dash-p");
    let script = scripts().join("stacks_waiting.py");
    let mut target = started_ready(&script);
    let trace_path = dir.join("trace.jsonl");
    let pid = target.id().to_string();
    let mut tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "--stacks", "--missing-probes", "ignore", "-o"])
        .arg(&trace_path)
        .args(["-p", &pid])
        .spawn()
        .unwrap();
    wait_for_trace(&trace_path, HEADER);
    target.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    assert!(target.wait().unwrap().success());
    assert!(tracer.wait().unwrap().success());
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let interpreter = trace.iter().find(|l| l["type"] == "interpreter").unwrap();
    assert_eq!(
        (interpreter["pid"].to_string(), &interpreter["stacks"]),
        (pid, &Value::Bool(true))
    );
    let calls = calls(&trace);
    assert_eq!(calls.len(), 1);
    let stack = trace
        .iter()
        .find(|l| l["type"] == "stack" && l["id"] == calls[0]["stack"])
        .expect("the call's stack");
    let file = script.to_str().unwrap();
    assert_eq!(
        stack["frames"],
        serde_json::json!([
            {"file": file, "qualname": "called", "line": marked("stacks_waiting.py", "called"), "first_line": 13},
            {"file": file, "qualname": "<module>", "line": marked("stacks_waiting.py", "module"), "first_line": 1},
        ])
    );
}
