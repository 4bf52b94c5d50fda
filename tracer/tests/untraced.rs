//! Root tests of the promise that the traced command runs as it would untraced: its signal
//! dispositions and mask are the ones an untraced child of the same parent gets.

mod common;

use std::{
    os::unix::process::CommandExt,
    process::{Command, Output},
};

use common::*;

/// Before the exec of `command`: SIGUSR2 ignored and SIGUSR1 blocked, as a parent (`nohup`,
/// a shell's background job, a supervisor) may leave them; both are inherited across exec.
fn with_parent_signals(command: &mut Command) -> &mut Command {
    // SAFETY: signal(2) and sigprocmask(2) are async-signal-safe; nothing else runs
    // between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGUSR2, libc::SIG_IGN);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Ok(())
        })
    }
}

/// `cudatrace run -q ... -- ARGS`, its output.
fn traced(trace: &std::path::Path, args: &[&str]) -> Output {
    with_parent_signals(
        Command::new(CUDATRACE)
            .args(["run", "-q", "--missing-probes", "ignore", "--libcuda"])
            .arg(&standin().lib)
            .arg("-o")
            .arg(trace)
            .arg("--")
            .args(args),
    )
    .output()
    .unwrap()
}

/// `SigIgn` and `SigBlk` of /proc/self/status as printed by `grep`.
fn signal_lines(output: &Output) -> String {
    assert!(output.status.success(), "{}", stderr(output));
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// The bit of `signal` in a /proc/PID/status mask line (`SigIgn:\t0000000000001000`).
fn has(line: &str, signal: libc::c_int) -> bool {
    let hex = line.split_whitespace().nth(1).unwrap();
    u64::from_str_radix(hex, 16).unwrap() & (1 << (signal - 1)) != 0
}

#[test]
fn the_command_starts_with_the_signal_dispositions_and_mask_of_an_untraced_child() {
    let Some(_guard) = root() else { return };
    let dir = scratch("untraced-signals");
    let grep = ["grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"];
    let untraced = signal_lines(
        &with_parent_signals(Command::new(grep[0]).args(&grep[1..]))
            .output()
            .unwrap(),
    );
    let traced = signal_lines(&traced(&dir.join("t.jsonl"), &grep));
    assert_eq!(traced, untraced);
    let lines: Vec<&str> = traced.lines().collect();
    assert_eq!(lines.len(), 2, "{traced}");
    // /proc/PID/status has SigBlk before SigIgn.
    let (blocked, ignored) = (lines[0], lines[1]);
    assert!(ignored.starts_with("SigIgn:") && blocked.starts_with("SigBlk:"));
    // What the parent set is kept; what cudatrace's runtime set (SIGPIPE ignored) is not.
    assert!(has(ignored, libc::SIGUSR2), "{ignored}");
    assert!(!has(ignored, libc::SIGPIPE), "{ignored}");
    assert!(has(blocked, libc::SIGUSR1), "{blocked}");
}

#[test]
fn a_pipeline_in_the_command_ends_by_sigpipe_as_untraced() {
    let Some(_guard) = root() else { return };
    let dir = scratch("untraced-sigpipe");
    let script = "yes | head -1 >/dev/null; echo ${PIPESTATUS[*]}";
    let untraced = Command::new("bash").args(["-c", script]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&untraced.stdout), "141 0\n");
    let output = traced(&dir.join("t.jsonl"), &["bash", "-c", script]);
    assert!(output.status.success(), "{}", stderr(&output));
    // `yes` killed by SIGPIPE (128 + 13), not failing with EPIPE ("Broken pipe", 1).
    assert_eq!(String::from_utf8_lossy(&output.stdout), "141 0\n");
    assert!(
        !stderr(&output).contains("Broken pipe"),
        "{}",
        stderr(&output)
    );
}
