//! Perfetto's trace processor for tests outside `perfetto.rs`: the pinned engine fetched
//! by `tests/perfetto/fetch_ui.py` (cached under target/) and run under Node by
//! `tests/perfetto/trace_processor.mjs`, which exits 0 only when the trace loaded with no
//! error or data-loss statistic and every query was answered.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use serde_json::Value;

use super::stderr;

fn engine() -> &'static Path {
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
        assert!(output.status.success(), "{}", stderr(&output));
        PathBuf::from(String::from_utf8(output.stdout).unwrap().trim()).join("v52.0-6b9586def")
    })
}

/// Loads `file` and answers `queries`: each query's rows. Fails the test when the trace
/// does not load cleanly.
pub fn query(file: &Path, queries: &[&str]) -> Vec<Vec<Value>> {
    let output = Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/perfetto/trace_processor.mjs"
        ))
        .arg("--engine")
        .arg(engine())
        .arg(file)
        .args(queries)
        .output()
        .expect("running node (install Node.js 18 or newer)");
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
