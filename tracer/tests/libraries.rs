//! Root tests of libraries beyond the first: many copies of one library attached at once
//! (their symbols share the probe table's slots), and a library that cannot be attached,
//! a loss counted and named in the trace, its footer, the summary and on stderr.

mod common;

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use common::*;
use serde_json::Value;

/// `tests/c/loader.c`, built once per test binary.
fn loader(dir: &Path) -> PathBuf {
    let program = dir.join("loader");
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
}

fn lines_of<'a>(trace: &'a [Value], kind: &str) -> Vec<&'a Value> {
    trace.iter().filter(|l| l["type"] == kind).collect()
}

#[test]
fn fifty_copies_of_libcuda_are_all_attached_and_traced() {
    let Some(_guard) = root() else { return };
    const COPIES: usize = 50;
    let dir = scratch("fifty-copies");
    let loader = loader(&dir);
    let mut script = String::new();
    for index in 0..COPIES {
        let copy = dir.join(format!("copy{index}/libcuda.so.1"));
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        std::fs::copy(&standin().lib, &copy).unwrap();
        let _ = writeln!(
            script,
            "{} {} calls 2 >/dev/null",
            loader.display(),
            copy.display()
        );
    }
    let trace_path = dir.join("t.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "--missing-probes", "ignore", "-o"])
        .arg(&trace_path)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let trace = read_trace(&trace_path);
    assert_complete(&trace);
    let libraries = lines_of(&trace, "library");
    assert_eq!(libraries.len(), COPIES);
    // Each copy's calls: cuInit and two cuCtxSynchronize, into that copy.
    let calls = calls(&trace);
    assert_eq!(calls.len(), COPIES * 3);
    for library in &libraries {
        let id = &library["id"];
        let into: Vec<&str> = calls
            .iter()
            .filter(|c| &c["lib"] == id)
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            into,
            ["cuInit", "cuCtxSynchronize", "cuCtxSynchronize"],
            "{id}"
        );
    }
    let footer = trace.last().unwrap();
    assert_eq!(footer["lost"]["total"], 0);
}

/// A libcuda (by its name) exporting cuInit, cuCtxSynchronize and `count` functions more,
/// `cuFake0`..: beyond the probe table's room with `--functions all`.
fn big_library(dir: &Path, count: usize) -> PathBuf {
    let mut source = String::from(
        "int cuInit(unsigned flags) { return (int)flags; }\nint cuCtxSynchronize(void) { return 0; }\n",
    );
    for index in 0..count {
        let _ = writeln!(source, "int cuFake{index}(int x) {{ return x + {index}; }}");
    }
    let c_file = dir.join("big.c");
    std::fs::write(&c_file, source).unwrap();
    let library = dir.join("big/libcuda.so.1");
    std::fs::create_dir_all(library.parent().unwrap()).unwrap();
    gcc(&[
        "-shared",
        "-fPIC",
        "-O0",
        "-o",
        library.to_str().unwrap(),
        c_file.to_str().unwrap(),
    ]);
    library
}

#[test]
fn a_library_that_cannot_be_attached_is_a_counted_and_named_loss() {
    let Some(_guard) = root() else { return };
    let dir = scratch("not-attached");
    let loader = loader(&dir);
    let big = big_library(&dir, tracer_common::MAX_PROBES as usize + 100);
    let copy = dir.join("ok/libcuda.so.1");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(&standin().lib, &copy).unwrap();
    let script = format!(
        "{loader} {big} calls 1 >/dev/null; {loader} {copy} calls 2 >/dev/null",
        loader = loader.display(),
        big = big.display(),
        copy = copy.display()
    );
    let trace_path = dir.join("t.jsonl");
    let output = Command::new(CUDATRACE)
        .args([
            "run",
            "-q",
            "--functions",
            "all",
            "--missing-probes",
            "ignore",
            "-o",
        ])
        .arg(&trace_path)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    let said = stderr(&output);
    assert!(output.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "{} not attached, its calls are missing",
            big.display()
        )),
        "{said}"
    );
    let trace = read_trace(&trace_path);
    assert_complete_with_losses(&trace);
    // The loss: one line naming the library, the process and why; in the footer too.
    let lost = lines_of(&trace, "lost");
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["reason"], "library_not_attached");
    assert_eq!(lost[0]["count"], 1);
    assert_eq!(lost[0]["library"], big.to_str().unwrap());
    assert!(lost[0]["pid"].as_u64().is_some());
    assert!(
        lost[0]["error"]
            .as_str()
            .unwrap()
            .contains("the probe table is full"),
        "{}",
        lost[0]
    );
    let footer = trace.last().unwrap();
    assert_eq!(footer["lost"]["library_not_attached"], 1);
    assert_eq!(footer["lost"]["total"], 1);
    // The other library is traced as ever: cuInit and two cuCtxSynchronize.
    let names: Vec<&str> = calls(&trace)
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cuInit", "cuCtxSynchronize", "cuCtxSynchronize"]);
    // The summary names it.
    let summary = Command::new(CUDATRACE)
        .arg("summary")
        .arg(&trace_path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&summary.stdout);
    assert!(
        text.contains(&format!(
            "NOT ATTACHED: pid {}: {}",
            lost[0]["pid"],
            big.display()
        )),
        "{text}"
    );
    assert!(
        stderr(&summary).contains(&format!("{} was not attached", big.display())),
        "{}",
        stderr(&summary)
    );
}
