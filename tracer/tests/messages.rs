//! Messages and flags a hostile user met (issue 34): each odd input refused by name or said,
//! never taken silently. No root needed.

mod common;
mod traces;

use std::{fs, process::Command};

use common::{CUDATRACE, scratch, stderr};

fn cudatrace(args: &[&str]) -> std::process::Output {
    Command::new(CUDATRACE)
        .args(args)
        .output()
        .expect("running cudatrace")
}

#[test]
fn all_among_families_is_refused_as_standing_alone() {
    let output = cudatrace(&["run", "--stacks=all,launch", "--", "true"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains(
            "`all` stands alone: give --stacks=all, or families separated by commas without \
             it (any of launch, alloc, copy, memset, sync, module, collective)"
        ),
        "{}",
        stderr(&output)
    );
    assert!(!stderr(&output).contains("is not a family"));
}

#[test]
fn flame_says_calls_naming_no_stack_and_repeated_stack_ids() {
    let dir = scratch("messages-flame");
    let text = traces::stacks();
    let first_stack = text
        .lines()
        .find(|line| line.contains(r#""type":"stack""#))
        .unwrap();
    let doubled = text.replacen(first_stack, &format!("{first_stack}\n{first_stack}"), 1);
    let trace = dir.join("t.jsonl");
    fs::write(&trace, doubled).unwrap();
    let folded = dir.join("t.folded");
    let output = cudatrace(&[
        "flame",
        trace.to_str().unwrap(),
        "-o",
        folded.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let label = trace.display();
    let said = stderr(&output);
    // The test trace has one call naming stack 99, which it never defines.
    assert!(
        said.contains(&format!(
            "cudatrace: warning: 1 call of {label} named a stack the trace does not have: \
             they weigh under (no stack)\n"
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "cudatrace: warning: 1 stack line of {label} repeated an id seen before: the first \
             line of each id was kept\n"
        )),
        "{said}"
    );
    let summary = cudatrace(&["summary", trace.to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&summary.stdout).contains(
            "  1 stack line repeated an id seen before: the first line of each id was kept\n"
        ),
        "{}",
        String::from_utf8_lossy(&summary.stdout)
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_top_help_names_parquet() {
    let output = cudatrace(&["--help"]);
    let help = String::from_utf8_lossy(&output.stdout);
    // Whatever width clap wraps the help to (a terminal's, or COLUMNS).
    let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        words.contains(
            "export Convert a trace for the Perfetto UI (ui.perfetto.dev) or chrome://tracing, \
             or into Parquet tables for SQL engines"
        ),
        "{help}"
    );
    assert!(help.contains("cudatrace export --format parquet trace.jsonl"));
}

#[test]
fn a_rank_that_is_not_utf8_is_named_not_reported_unset() {
    let Some(_root) = common::root() else { return };
    use std::os::unix::ffi::OsStrExt;
    let dir = scratch("messages-rank");
    let output = Command::new(CUDATRACE)
        .env("RANK", std::ffi::OsStr::from_bytes(b"1\xff"))
        .args(["run", "-q", "-o"])
        .arg(dir.join("%r.jsonl"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(r#"-o uses %r but RANK is not UTF-8 ("1\xFF"), not a rank"#),
        "{}",
        stderr(&output)
    );
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_host_named_dot_dot_stays_inside_the_folder_given() {
    let Some(_root) = common::root() else { return };
    let dir = scratch("messages-host");
    let inner = dir.join("traces");
    // `run -o` makes no folder: the one `%h` is to name is there.
    fs::create_dir_all(inner.join("__")).unwrap();
    // A host named `..`, in a UTS namespace of its own (`hostname` refuses the name).
    let output = Command::new("unshare")
        .args([
            "--uts",
            "python3",
            "-c",
            "import os, socket, sys; socket.sethostname('..'); os.execv(sys.argv[1], sys.argv[1:])",
            CUDATRACE,
            "run",
            "-q",
            "--missing-probes",
            "ignore",
            "-o",
        ])
        .arg(inner.join("%h/t.jsonl"))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(inner.join("__/t.jsonl").is_file(), "{}", stderr(&output));
    assert!(!dir.join("t.jsonl").exists());
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn odd_window_and_stack_flags_are_refused_by_name() {
    let output = cudatrace(&["run", "--stack-depth", "8", "--", "true"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("the following required arguments were not provided")
            && stderr(&output).contains("--stacks"),
        "{}",
        stderr(&output)
    );
    let output = cudatrace(&["run", "--duration", "999999999999h", "--", "true"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains(
            "\"999999999999h\" is longer than 366 days: give a shorter window, or leave \
             --duration out to record until the command ends"
        ),
        "{}",
        stderr(&output)
    );
    let Some(_root) = common::root() else { return };
    let output = cudatrace(&["run", "--start-at", "0", "--", "true"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).starts_with("cudatrace: error: --start-at 1970-01-01T00:00:00Z is 2"),
        "{}",
        stderr(&output)
    );
}
