//! Perfetto's trace processor for the tests (`perfetto.rs`, `jobs.rs`): the pinned engine fetched
//! by `tests/perfetto/fetch_ui.py` (cached under target/) and run under Node by
//! `tests/perfetto/trace_processor.mjs`, which exits 0 only when the trace loaded with no
//! error or data-loss statistic and every query was answered.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::OnceLock,
};

use serde_json::Value;

use super::stderr;

/// The trace processor's engine files (engine_bundle.js, trace_processor.wasm) of the pinned
/// Perfetto UI, fetched once per test binary.
pub fn engine() -> &'static Path {
    static ENGINE: OnceLock<PathBuf> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("perfetto-ui");
        let output = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/perfetto/fetch_ui.py"
            ))
            .arg(&cache)
            .output()
            .expect("running python3 tests/perfetto/fetch_ui.py");
        assert!(
            output.status.success(),
            "fetching the pinned Perfetto UI failed (exit {:?}):\n{}",
            output.status.code(),
            stderr(&output)
        );
        PathBuf::from(String::from_utf8(output.stdout).unwrap().trim()).join("v52.0-6b9586def")
    })
}

/// Runs the harness on `file` with `queries`. Its exit code says whether the trace loaded
/// (0), was rejected (1) or had error statistics (3).
pub fn run(file: &Path, queries: &[&str]) -> Output {
    Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/perfetto/trace_processor.mjs"
        ))
        .arg("--engine")
        .arg(engine())
        .arg(file)
        .args(queries)
        .output()
        .expect("running node (install Node.js 18 or newer: apt-get install nodejs)")
}

/// Loads `file` and answers `queries`: each query's rows. Fails the test when the trace
/// does not load cleanly.
pub fn query(file: &Path, queries: &[&str]) -> Vec<Vec<Value>> {
    let output = run(file, queries);
    assert_eq!(
        output.status.code(),
        Some(0),
        "the trace processor did not load {} cleanly:\n{}\n{}",
        file.display(),
        stderr(&output),
        String::from_utf8_lossy(&output.stdout)
    );
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    result["queries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|answer| answer["rows"].as_array().unwrap().clone())
        .collect()
}
