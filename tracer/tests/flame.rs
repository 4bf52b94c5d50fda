//! `cudatrace flame` checked by a third party's reader of pprof's format: Datadog's
//! `pprof-format` (npm, pinned and checked by its sha512, fetched once per build into
//! `target/tmp`), run under Node by `tests/pprof/read_profile.cjs`. Each sample type's
//! flat value per Python line, as that reader decodes the profile, is exactly the row
//! `cudatrace summary --json` gives for that line, and each total the summary's total.
//! Offline, set `CUDATRACE_PPROF_FORMAT_TGZ` to the package's tarball.
//!
//! And by the reference reader, Go's `pprof` (`go tool pprof`, Debian's `golang-go`), under
//! its default options: the names it shows for Python's `<module>`, `<lambda>` and
//! comprehension frames, whose `<...>` its demangler would strip as a C++ template's.

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
                common::folder_refused(trace.display())
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

/// `go tool pprof ARGS PROFILE`'s standard output (its default options otherwise).
fn go_pprof(args: &[&str], profile: &Path) -> String {
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(profile)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running `go tool pprof` ({e}): the flame tests read profiles with Go's pprof: \
                 install golang-go (apt-get install golang-go; .ci/run does)"
            )
        });
    assert!(
        output.status.success(),
        "go tool pprof {args:?}: {}",
        stderr(&output)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `-top`'s rows: (flat, cum, name).
fn top_rows(top: &str) -> Vec<(String, String, String)> {
    let rows = top
        .lines()
        .skip_while(|line| !line.trim_start().starts_with("flat"))
        .skip(1);
    rows.map(|row| {
        let columns: Vec<&str> = row.split_whitespace().collect();
        assert!(columns.len() >= 6, "a -top row: {row:?}");
        (
            columns[0].to_owned(),
            columns[3].to_owned(),
            columns[5..].join(" "),
        )
    })
    .collect()
}

/// `-traces`' samples: (value, frames leaf first), by value.
fn traces_of(traces: &str) -> Vec<(String, Vec<String>)> {
    let mut samples: Vec<(String, Vec<String>)> = Vec::new();
    let mut current: Option<(String, Vec<String>)> = None;
    for line in traces.lines() {
        if line.starts_with("-----------+") {
            samples.extend(current.take());
        } else if let Some((value, frames)) = &mut current {
            assert!(!value.is_empty());
            frames.push(line.trim().to_owned());
        } else if line.starts_with(' ') {
            let (value, frame) = line.trim().split_once(char::is_whitespace).unwrap();
            current = Some((value.to_owned(), vec![frame.trim().to_owned()]));
        }
    }
    samples.extend(current);
    samples.sort_by_key(|(value, _)| value.trim_end_matches("us").parse::<u64>().unwrap());
    samples
}

fn owned<const N: usize>(rows: [(&str, &str, &str); N]) -> Vec<(String, String, String)> {
    rows.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

#[test]
fn go_pprof_shows_pythons_own_names_with_their_file() {
    let dir = scratch("flame-go-pprof");
    let trace = dir.join("names.jsonl");
    std::fs::write(&trace, traces::python_names()).unwrap();
    cudatrace(&["flame", trace.to_str().unwrap()]);
    let profile = dir.join("names.pb.gz");

    let top = go_pprof(&["-top"], &profile);
    assert!(top.contains("Type: time\n"), "{top}");
    assert_eq!(
        top_rows(&top),
        owned([
            ("7us", "28us", "run.py.<module>"),
            ("6us", "6us", "run.py.<dictcomp>"),
            ("5us", "5us", "aot_module_simplified.<locals>.forward"),
            ("4us", "4us", "Trainer.fit.<locals>.<lambda>"),
            ("3us", "3us", "run.py.<lambda>"),
            ("2us", "2us", "data.py.<genexpr>"),
            ("1us", "1us", "run.py.<listcomp>"),
            ("0", "4us", "Trainer.fit"),
            ("0", "2us", "data.py.<module>"),
        ]),
        "{top}"
    );

    let traces = go_pprof(&["-traces"], &profile);
    let sample = |value: &str, frames: &[&str]| {
        (
            value.to_owned(),
            frames.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(
        traces_of(&traces),
        [
            sample("1us", &["run.py.<listcomp>", "run.py.<module>"]),
            sample(
                "2us",
                &["data.py.<genexpr>", "data.py.<module>", "run.py.<module>"]
            ),
            sample("3us", &["run.py.<lambda>", "run.py.<module>"]),
            sample(
                "4us",
                &[
                    "Trainer.fit.<locals>.<lambda>",
                    "Trainer.fit",
                    "run.py.<module>"
                ]
            ),
            sample(
                "5us",
                &["aot_module_simplified.<locals>.forward", "run.py.<module>"]
            ),
            sample("6us", &["run.py.<dictcomp>", "run.py.<module>"]),
            sample("7us", &["run.py.<module>"]),
        ],
        "{traces}"
    );

    // The function's system name keeps the exact qualname; `-raw` shows it after the name.
    let raw = go_pprof(&["-raw"], &profile);
    for (name, place) in [
        ("run.py.<module>", "/w/run.py:3 s=1(<module>)"),
        ("data.py.<genexpr>", "/w/data.py:4 s=4(<genexpr>)"),
        ("Trainer.fit", "/w/train.py:21 s=18\n"),
    ] {
        assert!(raw.contains(&format!("{name} {place}")), "{name}: {raw}");
    }
}

#[test]
fn go_pprof_shows_the_stacks_traces_figures_by_name() {
    let dir = scratch("flame-go-pprof-stacks");
    let trace = dir.join("trace.jsonl");
    std::fs::write(&trace, traces::stacks()).unwrap();
    cudatrace(&["flame", trace.to_str().unwrap()]);
    let top = go_pprof(&["-top"], &dir.join("trace.pb.gz"));
    assert!(top.contains("Type: gpu\n"), "{top}");
    assert_eq!(
        top_rows(&top),
        owned([
            ("30us", "30us", "Linear.forward"),
            ("7us", "42us", "Block.forward"),
            ("5us", "5us", "(no stack)"),
            ("5us", "5us", "Scale.forward"),
            ("3us", "3us", "Thread.run"),
            ("0", "3us", "(cut at the frame budget)"),
            ("0", "42us", "Module._call_impl"),
            ("0", "42us", "Module._wrapped_call_impl"),
            ("0", "42us", "Net.forward"),
            ("0", "42us", "run.py.<module>"),
        ]),
        "{top}"
    );
}
