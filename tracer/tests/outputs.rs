//! Root tests of where root writes: traces, exports and plots are written as the user who
//! ran sudo, never through a link planted in a shared folder, never over a file that is
//! not a regular file or is an input, and one output has one writer at a time.

mod common;

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt, symlink},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use common::*;

/// uid and gid of `nobody`, the user who "ran sudo" in these tests.
const USER: u32 = 65534;

/// A folder like /tmp: root's, world-writable, sticky; inside a root folder (0755) in the
/// temporary folder, which the user can reach wherever the checkout is (a CI clone in a
/// `mktemp -d` folder is root's alone).
fn sticky_folder(name: &str) -> PathBuf {
    let outer = std::env::temp_dir().join(format!("cudatrace-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outer);
    std::fs::create_dir(&outer).unwrap();
    std::fs::set_permissions(&outer, PermissionsExt::from_mode(0o755)).unwrap();
    let dir = outer.join("pub");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o1777)).unwrap();
    dir
}

/// A file only root may write, whose content and owner must survive.
fn victim(dir: &Path) -> PathBuf {
    let path = dir.join("victim");
    std::fs::write(&path, b"root's file").unwrap();
    path
}

fn assert_untouched(path: &Path) {
    assert_eq!(std::fs::read(path).unwrap(), b"root's file");
    let metadata = std::fs::metadata(path).unwrap();
    assert_eq!((metadata.uid(), metadata.gid()), (0, 0));
}

/// `cudatrace ARGS` as if run with `sudo` by `nobody`, in `cwd`.
fn as_sudo(cwd: &Path, args: &[&str]) -> Output {
    Command::new(CUDATRACE)
        .args(args)
        .current_dir(cwd)
        .env("SUDO_UID", USER.to_string())
        .env("SUDO_GID", USER.to_string())
        .env("SUDO_USER", "nobody")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `run` of the stand-in driver's `exit 0` writing to `output`.
fn run_args<'a>(lib: &'a str, output: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "-q",
        "--missing-probes",
        "ignore",
        "--libcuda",
        lib,
        "-o",
        output,
        "--",
        "true",
    ]
}

fn refused(output: &Output, why: &str) {
    let stderr = stderr(output);
    assert_eq!(output.status.code(), Some(73), "{stderr}");
    assert!(stderr.contains(why), "{why:?} not in {stderr}");
}

#[test]
fn a_link_planted_in_a_shared_folder_is_not_followed() {
    let Some(_guard) = root() else { return };
    let public = sticky_folder("outputs-link");
    let victim = victim(public.parent().unwrap());
    let lib = standin().lib.to_str().unwrap();
    let planted = public.join("t.jsonl");
    symlink(&victim, &planted).unwrap();
    let output = as_sudo(&public, &run_args(lib, planted.to_str().unwrap()));
    refused(&output, "is a symbolic link");
    assert_untouched(&victim);

    // Through a link as a folder on the way: written as the user, who may not write there.
    let root_only = public.parent().unwrap().join("root-only");
    std::fs::create_dir(&root_only).unwrap();
    symlink(&root_only, public.join("dir")).unwrap();
    let through = public.join("dir/t.jsonl");
    let output = as_sudo(&public, &run_args(lib, through.to_str().unwrap()));
    refused(&output, "as nobody: Permission denied");
    assert_eq!(std::fs::read_dir(&root_only).unwrap().count(), 0);

    // A `traces` link in the folder the command runs from, for the default name.
    let cwd = sticky_folder("outputs-traces-link");
    symlink(&root_only, cwd.join("traces")).unwrap();
    let output = as_sudo(
        &cwd,
        &[
            "run",
            "-q",
            "--missing-probes",
            "ignore",
            "--libcuda",
            lib,
            "--",
            "true",
        ],
    );
    refused(&output, "traces is a symbolic link");
    assert_eq!(std::fs::read_dir(&root_only).unwrap().count(), 0);

    // A `traces` folder another user made there, open to all: not a place for the trace.
    let cwd = sticky_folder("outputs-traces-foreign");
    let foreign = cwd.join("traces");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::set_permissions(&foreign, PermissionsExt::from_mode(0o777)).unwrap();
    std::os::unix::fs::chown(&foreign, Some(4242), Some(4242)).unwrap();
    let output = as_sudo(
        &cwd,
        &[
            "run",
            "-q",
            "--missing-probes",
            "ignore",
            "--libcuda",
            lib,
            "--",
            "true",
        ],
    );
    refused(&output, "traces belongs to another user (uid 4242)");
    assert_eq!(std::fs::read_dir(&foreign).unwrap().count(), 0);
}

#[test]
fn a_trace_is_created_by_the_user_and_belongs_to_them() {
    let Some(_guard) = root() else { return };
    let public = sticky_folder("outputs-owner");
    let lib = standin().lib.to_str().unwrap();
    let trace = public.join("t.jsonl");
    let mut args = run_args(lib, trace.to_str().unwrap());
    args.splice(1..1, ["--export", "perfetto"]);
    let output = as_sudo(&public, &args);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    for written in [trace.clone(), public.join("t.pftrace")] {
        let metadata = std::fs::metadata(&written).unwrap();
        assert_eq!(
            (metadata.uid(), metadata.gid(), metadata.mode() & 0o777),
            (USER, USER, 0o644),
            "{}",
            written.display()
        );
    }
    // The default name, in a `traces/` folder the user makes.
    let output = as_sudo(
        &public,
        &[
            "run",
            "-q",
            "--missing-probes",
            "ignore",
            "--libcuda",
            lib,
            "--",
            "true",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let folder = std::fs::metadata(public.join("traces")).unwrap();
    assert_eq!((folder.uid(), folder.mode() & 0o777), (USER, 0o755));
    let made: Vec<_> = std::fs::read_dir(public.join("traces"))
        .unwrap()
        .map(|entry| entry.unwrap().metadata().unwrap().uid())
        .collect();
    assert_eq!(made, [USER]);

    // A file of root's the user cannot write is not theirs to overwrite.
    let victim = victim(&public);
    let output = as_sudo(&public, &run_args(lib, victim.to_str().unwrap()));
    refused(&output, "as nobody: Permission denied");
    assert_untouched(&victim);
}

#[test]
fn exports_and_plots_refuse_links_and_belong_to_the_user() {
    let Some(_guard) = root() else { return };
    let public = sticky_folder("outputs-readers");
    let victim = victim(public.parent().unwrap());
    let trace = public.join("t.jsonl");
    let status = Command::new(CUDATRACE)
        .args(["run", "-q", "--missing-probes", "ignore", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .args(["--", standin().driver.to_str().unwrap(), "sequence"])
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::set_permissions(&trace, PermissionsExt::from_mode(0o644)).unwrap();
    for (name, command) in [("t.json", "export"), ("t.svg", "plot")] {
        let planted = public.join(name);
        symlink(&victim, &planted).unwrap();
        let output = as_sudo(&public, &[command, trace.to_str().unwrap()]);
        refused(&output, "is a symbolic link");
        assert_untouched(&victim);
        std::fs::remove_file(&planted).unwrap();
        let output = as_sudo(&public, &[command, trace.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert_eq!(std::fs::metadata(&planted).unwrap().uid(), USER, "{name}");
    }
}

#[test]
fn an_output_that_is_an_input_a_fifo_or_taken_is_refused() {
    let Some(_guard) = root() else { return };
    let dir = scratch("outputs-inputs");
    // `-o` naming the library being probed.
    let library = dir.join("libcuda.so.1");
    std::fs::copy(&standin().lib, &library).unwrap();
    let before = std::fs::read(&library).unwrap();
    let lib = library.to_str().unwrap();
    let output = Command::new(CUDATRACE)
        .args(run_args(lib, lib))
        .output()
        .unwrap();
    refused(&output, "is libcuda, a library this run probes: refusing");
    assert!(
        std::fs::read(&library).unwrap() == before,
        "the library is intact"
    );

    // A FIFO: refused at once, not waited on.
    let fifo = dir.join("fifo");
    let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o666) }, 0);
    let output = Command::new(CUDATRACE)
        .args(run_args(lib, fifo.to_str().unwrap()))
        .output()
        .unwrap();
    refused(&output, "is not a regular file");

    // Two runs on one output: the second refuses while the first writes.
    let trace = dir.join("t.jsonl");
    let mut first = Command::new(CUDATRACE)
        .args([
            "run",
            "-q",
            "--missing-probes",
            "ignore",
            "--libcuda",
            lib,
            "-o",
        ])
        .arg(&trace)
        .args(["--", standin().driver.to_str().unwrap(), "sleep", "30"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_trace(&trace, HEADER);
    let output = Command::new(CUDATRACE)
        .args(run_args(lib, trace.to_str().unwrap()))
        .output()
        .unwrap();
    refused(&output, "is being written by another process");
    // Its command's first call is in the trace before it is stopped (a loaded machine can
    // be slow to start the command).
    wait_for_trace(&trace, r#""name":"cuInit""#);
    // SAFETY: kill(2) of the cudatrace this test started.
    unsafe { libc::kill(first.id() as i32, libc::SIGINT) };
    assert_eq!(first.wait().unwrap().code(), Some(130));
    let lines = read_trace(&trace);
    assert_complete(&lines);
    assert!(names(&calls(&lines)).contains(&"cuInit".to_owned()));

    // An export onto the trace it reads, by another name (a hard link).
    let alias = dir.join("alias.json");
    std::fs::hard_link(&trace, &alias).unwrap();
    let output = Command::new(CUDATRACE)
        .args(["export", "-o"])
        .arg(&alias)
        .arg(&trace)
        .output()
        .unwrap();
    refused(&output, "is the trace being exported");
    assert_complete(&read_trace(&trace));
}

/// A tmpfs of `bytes` at `dir`, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, bytes: u64) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={bytes},mode=0755"),
                "cudatrace-test",
            ])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs at {}", dir.display());
        SmallDisk(dir.to_owned())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_ends_recording_with_a_footer_and_the_command_runs_to_its_end() {
    use std::io::{BufRead, BufReader};
    let Some(_guard) = root() else { return };
    let disk = SmallDisk::mount(&scratch("outputs-full").join("disk"), 256 << 10);
    let trace = disk.0.join("t.jsonl");
    // 20,000 calls paced over 2 s: some 5 MB of trace for 256 KiB of disk.
    let mut tracer = Command::new(CUDATRACE)
        .args(["run", "-q", "--missing-probes", "ignore", "--libcuda"])
        .arg(&standin().lib)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(&standin().bench_loop)
        .args(["20000", "10000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = BufReader::new(tracer.stderr.take().unwrap());
    let mut first = String::new();
    said.read_line(&mut first).unwrap();
    // Said at once, while the command still runs.
    assert!(
        first.starts_with("cudatrace: error: cannot write the trace (No space left on device"),
        "{first}"
    );
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", tracer.id())).unwrap();
    assert!(!children.trim().is_empty(), "the command runs on");
    let output = tracer.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut said, &mut rest).unwrap();
    assert_eq!(output.status.code(), Some(73), "{first}{rest}");
    // The command ran to its end: its own report of its 20,000 calls.
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["calls"], 20000, "{report}");
    assert!(rest.contains("No space left on device"), "{rest}");
    assert!(rest.contains("(command exited with 0)"), "{rest}");
    // Whole lines, then a footer that counts them, says why and how much is missing.
    let lines = read_trace(&trace);
    assert_complete_with_losses(&lines);
    let footer = lines.last().unwrap();
    let unwritten = footer["lost"]["unwritten"].as_u64().unwrap();
    let written = footer["events"]["call"].as_u64().unwrap();
    assert!(unwritten > 0 && written > 0, "{footer}");
    // Every call seen until recording stopped is a line or counted unwritten (but one
    // in flight when the probes went).
    let seen = footer["entries_seen"].as_u64().unwrap();
    assert!(
        written + unwritten + 1 >= seen,
        "{written} + {unwritten} < {seen}"
    );
    assert!(
        footer["error"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{footer}"
    );
    assert_eq!(footer["exit_code"], 0);
}
