//! Running other programs: where the workspace is, the cargo running this xtask, and
//! commands whose failure stops the task. Every task module uses these; this one uses none
//! of them, so no two xtask modules import each other.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::{Context, Result, ensure};

/// The cudatrace workspace root: the directory above this crate.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The cargo running this xtask, so that the same toolchain builds everything.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Runs a command, saying what it does; its failure is an error naming it.
pub fn run(command: &mut Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}");
    let status = command
        .status()
        .with_context(|| format!("starting: {what}"))?;
    ensure!(status.success(), "{what} failed ({status})");
    Ok(())
}

/// Runs a command with inherited output, without announcing it; a non-zero exit is an error
/// naming the program.
pub fn run_quietly(command: &mut Command) -> Result<()> {
    let program = command.get_program().to_string_lossy().into_owned();
    let status = command
        .status()
        .with_context(|| format!("starting `{program}`"))?;
    ensure!(status.success(), "`{program}` exited with {status}");
    Ok(())
}

/// What a command prints on stdout; a non-zero exit is an error with its stderr.
pub fn stdout(command: &mut Command) -> Result<String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let out = command
        .output()
        .with_context(|| format!("starting `{program}`"))?;
    ensure!(
        out.status.success(),
        "`{program}` exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8(out.stdout).with_context(|| format!("`{program}` printed non-UTF-8"))
}

/// Whether this task ran `apt-get update` already.
static APT_UPDATED: AtomicBool = AtomicBool::new(false);

/// Installs Debian's `packages` with the machine's own sources (`apt-get update` first,
/// once a task), without recommends.
pub fn apt_install(packages: &[&str]) -> Result<()> {
    if !APT_UPDATED.swap(true, Ordering::SeqCst) {
        run(
            Command::new("apt-get").args(["update", "-q"]),
            "apt-get update",
        )?;
    }
    run(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        &format!("apt-get install {}", packages.join(" ")),
    )
}
