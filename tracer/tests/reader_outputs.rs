//! The readers' one output (export, flame, plot, merge): `-o -` is standard output; a
//! file is written under a temporary name and renamed into place, so a failure leaves the
//! earlier result whole; a merge never goes into its own job folder; the OS error of a
//! failed write is said once. No root needed: hand-written traces (`traces/`).

mod common;
mod traces;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use common::{CUDATRACE, scratch, stderr};

fn cudatrace(args: &[&str]) -> Output {
    Command::new(CUDATRACE)
        .args(args)
        .output()
        .expect("running cudatrace")
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The folder's entries, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A good trace (with stacks, for flame) and the same trace with a broken line in its
/// middle.
fn traces(dir: &Path) -> (PathBuf, PathBuf) {
    let good = dir.join("good.jsonl");
    let text = traces::stacks();
    fs::write(&good, &text).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let middle = lines.len() / 2;
    let mut broken = lines[..middle].join("\n");
    broken.push_str("\n{\"type\":\"call\",broken\n");
    broken.push_str(&lines[middle..].join("\n"));
    broken.push('\n');
    let bad = dir.join("bad.jsonl");
    fs::write(&bad, broken).unwrap();
    (good, bad)
}

/// A rank's trace of a two-rank job, with the header `merge` asks for.
fn job_rank(rank: usize) -> String {
    traces::job_rank(rank).replacen(
        r#"{"type":"header","#,
        r#"{"type":"header","format":"cudatrace","#,
        1,
    )
}

#[test]
fn a_failed_output_leaves_the_earlier_one_whole() {
    let dir = scratch("reader-outputs-failed");
    let (good, bad) = traces(&dir);
    let out = dir.join("out");
    fs::create_dir(&out).unwrap();
    for (what, file, args) in [
        ("chrome", "t.json", &["export"][..]),
        (
            "perfetto",
            "t.pftrace",
            &["export", "--format", "perfetto"][..],
        ),
        ("flame", "t.pb.gz", &["flame"][..]),
        ("plot", "t.svg", &["plot"][..]),
    ] {
        let path = out.join(file);
        let first = cudatrace(&[args, &[arg(&good), "-o", arg(&path)]].concat());
        assert_eq!(first.status.code(), Some(0), "{what}: {}", stderr(&first));
        let before = fs::read(&path).unwrap();
        assert!(!before.is_empty(), "{what}");
        let failed = cudatrace(&[args, &[arg(&bad), "-o", arg(&path)]].concat());
        assert_eq!(
            failed.status.code(),
            Some(65),
            "{what}: {}",
            stderr(&failed)
        );
        assert_eq!(
            fs::read(&path).unwrap(),
            before,
            "{what}: the earlier output is whole"
        );
    }
    assert_eq!(
        entries(&out),
        ["t.json", "t.pb.gz", "t.pftrace", "t.svg"],
        "no temporary file is left"
    );

    let tables = dir.join("tables");
    let first = cudatrace(&[
        "export",
        "--format",
        "parquet",
        arg(&good),
        "-o",
        arg(&tables),
    ]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let before: Vec<(String, Vec<u8>)> = entries(&tables)
        .into_iter()
        .map(|name| {
            let bytes = fs::read(tables.join(&name)).unwrap();
            (name, bytes)
        })
        .collect();
    assert!(before.iter().any(|(name, _)| name == "calls.parquet"));
    let failed = cudatrace(&[
        "export",
        "--format",
        "parquet",
        arg(&bad),
        "-o",
        arg(&tables),
    ]);
    assert_eq!(failed.status.code(), Some(65), "{}", stderr(&failed));
    let after: Vec<(String, Vec<u8>)> = entries(&tables)
        .into_iter()
        .map(|name| {
            let bytes = fs::read(tables.join(&name)).unwrap();
            (name, bytes)
        })
        .collect();
    assert!(
        after == before,
        "the earlier tables are whole, and nothing else is there"
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn dash_is_standard_output_for_every_reader_that_writes_one_file() {
    let dir = scratch("reader-outputs-stdout");
    let (good, _) = traces(&dir);
    let job = dir.join("job");
    fs::create_dir(&job).unwrap();
    for rank in 0..2 {
        fs::write(job.join(format!("rank{rank}.jsonl")), job_rank(rank)).unwrap();
    }
    let cases: [(&str, Vec<&str>, PathBuf); 5] = [
        (
            "flame",
            vec!["flame", "--format", "folded"],
            dir.join("f.folded"),
        ),
        ("flame pprof", vec!["flame"], dir.join("f.pb.gz")),
        ("plot", vec!["plot"], dir.join("p.svg")),
        ("export", vec!["export"], dir.join("e.json")),
        (
            "merge",
            vec!["merge", "--format", "chrome", "--job", arg(&job)],
            dir.join("m.json"),
        ),
    ];
    for (what, args, file) in cases {
        let input: Vec<&str> = if what == "merge" {
            vec![]
        } else {
            vec![arg(&good)]
        };
        let to_file = cudatrace(&[&args[..], &input, &["-o", arg(&file)]].concat());
        assert_eq!(
            to_file.status.code(),
            Some(0),
            "{what}: {}",
            stderr(&to_file)
        );
        let to_stdout = cudatrace(&[&args[..], &input, &["-o", "-"]].concat());
        assert_eq!(
            to_stdout.status.code(),
            Some(0),
            "{what}: {}",
            stderr(&to_stdout)
        );
        assert!(!to_stdout.stdout.is_empty(), "{what}");
        assert_eq!(to_stdout.stdout, fs::read(&file).unwrap(), "{what}");
        assert!(
            stderr(&to_stdout).contains("cudatrace: wrote stdout"),
            "{what}: {}",
            stderr(&to_stdout)
        );
    }
    assert!(!dir.join("-").exists(), "no file named -");
    assert!(!std::env::current_dir().unwrap().join("-").exists());
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_merge_into_its_own_job_folder_is_refused() {
    let dir = scratch("reader-outputs-merge-inside");
    let job = dir.join("job");
    fs::create_dir_all(job.join("sub")).unwrap();
    for rank in 0..2 {
        fs::write(job.join(format!("rank{rank}.jsonl")), job_rank(rank)).unwrap();
    }
    let before = entries(&job);
    for output in [job.join("job.jsonl"), job.join("sub/merged.pftrace")] {
        let refused = cudatrace(&["merge", "--job", arg(&job), "-o", arg(&output)]);
        assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
        assert_eq!(
            stderr(&refused),
            format!(
                "cudatrace: error: {} is inside the job folder {}: the merge would sit among \
                 the traces it was made of (and a later `summary --job` would read it): \
                 write it elsewhere\n",
                output.display(),
                job.display()
            )
        );
    }
    assert_eq!(entries(&job), before);
    assert_eq!(entries(&job.join("sub")), Vec::<String>::new());
    let summary = cudatrace(&["summary", "--job", arg(&job)]);
    assert_eq!(summary.status.code(), Some(0), "{}", stderr(&summary));
    let beside = dir.join("job.pftrace");
    let merged = cudatrace(&["merge", "--job", arg(&job), "-o", arg(&beside)]);
    assert_eq!(merged.status.code(), Some(0), "{}", stderr(&merged));
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_failed_write_says_the_os_error_once() {
    let dir = scratch("reader-outputs-os-error");
    let (good, _) = traces(&dir);
    for args in [
        &["export"][..],
        &["flame", "--format", "folded"][..],
        &["plot"][..],
    ] {
        let output = cudatrace(&[args, &[arg(&good), "-o", "/nonexistent-cudatrace/out"]].concat());
        assert_eq!(output.status.code(), Some(73), "{args:?}");
        assert_eq!(
            stderr(&output),
            "cudatrace: error: cannot write /nonexistent-cudatrace/out: No such file or \
             directory (os error 2)\n",
            "{args:?}"
        );
    }
    fs::remove_dir_all(dir).unwrap();
}
