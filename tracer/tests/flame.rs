//! `cudatrace flame` checked by a third party's reader of pprof's format: Datadog's
//! `pprof-format` (npm, pinned and checked by its sha512, fetched once per build into
//! `target/tmp`), run under Node by `tests/pprof/read_profile.cjs`. Each sample type's
//! flat value per Python line, as that reader decodes the profile, is exactly the row
//! `cudatrace summary --json` gives for that line, and each total the summary's total.
//! Offline, set `CUDATRACE_PPROF_FORMAT_TGZ` to the package's tarball.

mod common;
mod traces;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use common::{CUDATRACE, scratch, stderr};
use serde_json::Value;

const PACKAGE: &str = "pprof-format@2.3.2";
/// npm's `dist.integrity` of that version.
const INTEGRITY: &str = "sha512-fcMM+sgKMOveSurz7i0BMHfy1hHNnI9+VWjd4kdclqQjSTuiHWaP69DGwvkw3zcLkM/F76LhVIKvPyrxmp6iiw==";

/// The unpacked package (its `package/` folder).
fn pprof_format() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pprof-format-2.3.2");
        let package = cache.join("package");
        if package.join("dist/commonjs/index.js").is_file() {
            return package;
        }
        std::fs::create_dir_all(&cache).unwrap();
        let tarball = match std::env::var_os("CUDATRACE_PPROF_FORMAT_TGZ") {
            Some(path) => PathBuf::from(path),
            None => {
                let output = Command::new("npm")
                    .args(["pack", PACKAGE, "--silent", "--pack-destination"])
                    .arg(&cache)
                    .output()
                    .expect("running npm pack (Node.js's npm)");
                assert!(output.status.success(), "npm pack: {}", stderr(&output));
                cache.join("pprof-format-2.3.2.tgz")
            }
        };
        let digest = Command::new("python3")
            .args([
                "-c",
                "import base64,hashlib,sys;print('sha512-'+base64.b64encode(hashlib.sha512(open(sys.argv[1],'rb').read()).digest()).decode())",
            ])
            .arg(&tarball)
            .output()
            .expect("running python3");
        assert_eq!(String::from_utf8_lossy(&digest.stdout).trim(), INTEGRITY);
        let untar = Command::new("tar")
            .arg("xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&cache)
            .output()
            .expect("running tar");
        assert!(untar.status.success(), "tar: {}", stderr(&untar));
        package
    })
}

fn cudatrace(args: &[&str]) -> std::process::Output {
    let output = Command::new(CUDATRACE)
        .args(args)
        .output()
        .expect("running cudatrace");
    assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    output
}

#[test]
fn a_third_party_reader_finds_the_summarys_figures_in_the_profile() {
    let dir = scratch("flame-pprof");
    let trace = dir.join("trace.jsonl");
    std::fs::write(&trace, traces::stacks()).unwrap();
    let trace = trace.to_str().unwrap();
    let written = cudatrace(&["flame", trace]);
    assert_eq!(
        stderr(&written).trim(),
        format!(
            "cudatrace: wrote {} (pprof, 5 stacks, gpu {} nanoseconds)\n\
             cudatrace: warning: 1 call of {trace} named a stack the trace does not have: they \
             weigh under (no stack)",
            dir.join("trace.pb.gz").display(),
            traces::STACKS_GPU_NS
        )
    );
    let read = Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/pprof/read_profile.cjs"
        ))
        .arg(pprof_format())
        .arg(dir.join("trace.pb.gz"))
        .output()
        .expect("running node");
    assert!(read.status.success(), "node: {}", stderr(&read));
    let profile: Value = serde_json::from_slice(&read.stdout).unwrap();
    assert_eq!(profile["default_sample_type"], "gpu");

    let summary: Value = serde_json::from_slice(&cudatrace(&["summary", "--json", trace]).stdout)
        .expect("summary --json");
    let stacks = &summary["stacks"];
    // (sample type, the summary's field) for each weight.
    let weights = [
        ("gpu", "gpu_ns"),
        ("time", "time_ns"),
        ("calls", "calls"),
        ("allocated", "allocated_bytes"),
        ("copied", "copied_bytes"),
        ("live", "live_bytes"),
        ("launches", "launches"),
    ];
    let types: Vec<&str> = profile["sample_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t[0].as_str().unwrap())
        .collect();
    assert_eq!(types, weights.map(|(kind, _)| kind));
    for (kind, field) in weights {
        let flat = profile["flat"][kind].as_object().unwrap();
        let lines = stacks["lines"].as_array().unwrap();
        for row in lines {
            let name = row["name"].as_str().unwrap();
            assert_eq!(
                flat.get(name).cloned().unwrap_or(Value::from(0)),
                row[field],
                "{kind} of {name}"
            );
        }
        // No line the summary lacks.
        assert_eq!(flat.len(), lines.len(), "{kind}: {flat:?}");
        assert_eq!(profile["total"][kind], stacks["total"][field], "{kind}");
    }
    assert_eq!(profile["total"]["calls"], traces::STACKS_CALLS);
    assert_eq!(
        summary["calls"],
        traces::STACKS_CALLS,
        "the summary's own count of calls"
    );
}

#[test]
fn folded_text_is_chosen_by_the_name_and_a_trace_without_stacks_is_refused() {
    let dir = scratch("flame-folded");
    let trace = dir.join("trace.jsonl");
    std::fs::write(&trace, traces::stacks()).unwrap();
    let folded = dir.join("calls.folded");
    cudatrace(&[
        "flame",
        trace.to_str().unwrap(),
        "--weight",
        "calls",
        "-o",
        folded.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&folded).unwrap();
    let total: u64 = text
        .lines()
        .map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, traces::STACKS_CALLS);
    assert_eq!(text.lines().count(), 6);

    let plain = dir.join("plain.jsonl");
    std::fs::write(&plain, traces::known()).unwrap();
    let refused = Command::new(CUDATRACE)
        .args(["flame", plain.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(65));
    assert!(
        stderr(&refused).contains("has no Python stacks: record it with `cudatrace run --stacks`"),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn an_unreadable_trace_exits_74_and_a_bad_line_65() {
    let dir = scratch("flame-unreadable");
    let flame = |trace: &Path| {
        Command::new(CUDATRACE)
            .args(["flame", "-o"])
            .arg(dir.join("out.folded"))
            .arg(trace)
            .output()
            .unwrap()
    };
    for (trace, why) in [
        (
            dir.join("none.jsonl"),
            "No such file or directory (os error 2)",
        ),
        (dir.clone(), "folder"),
    ] {
        let output = flame(&trace);
        assert_eq!(output.status.code(), Some(74), "{}", stderr(&output));
        assert_eq!(
            stderr(&output),
            if why == "folder" {
                format!(
                    "cudatrace: error: {} is a folder, not a trace: a trace is a regular file, or a pipe named on the command line\n",
                    trace.display()
                )
            } else {
                format!(
                    "cudatrace: error: cannot open the trace {}: {why}\n",
                    trace.display()
                )
            }
        );
    }
    let bad = dir.join("bad.jsonl");
    let stacks = traces::stacks();
    let header = stacks.lines().next().unwrap();
    std::fs::write(&bad, format!("{header}\nnot json\n")).unwrap();
    let output = flame(&bad);
    assert_eq!(output.status.code(), Some(65), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        format!(
            "cudatrace: error: {}:2: expected ident at column 2 (--skip-bad-lines reads past \
             malformed lines)\n",
            bad.display()
        )
    );
    assert!(!dir.join("out.folded").exists());
}
