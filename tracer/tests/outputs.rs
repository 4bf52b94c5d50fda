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
