//! Embeds the eBPF objects built by `cargo xtask build-ebpf`, or stops with the hint; and
//! builds the CUDA injection library (`cupti-inject/`) that `run --gpu` hands to the
//! traced command, for embedding too.

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, exit},
};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
    // The probes read the registers of the architecture they were built for
    // (`cargo xtask build-ebpf --arch`): embed those of this build's target.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap();
    let (default_dir, build) = match arch.as_str() {
        "x86_64" => ("../target/ebpf", "cargo xtask build-ebpf"),
        "aarch64" => (
            "../target/ebpf-aarch64",
            "cargo xtask build-ebpf --arch aarch64",
        ),
        other => {
            eprintln!("error: cudatrace's probes know x86_64 and aarch64, not {other}");
            exit(1);
        }
    };
    let dir = env::var_os("CUDATRACE_EBPF_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            manifest
                .join(default_dir)
                .join("bpfel-unknown-none/release")
        });
    println!("cargo:rerun-if-env-changed=CUDATRACE_EBPF_DIR");
    for (object, var) in [
        ("cudatrace-probes", "CUDATRACE_PROBES_OBJ"),
        ("selftest", "CUDATRACE_SELFTEST_OBJ"),
    ] {
        let path = dir.join(object);
        if !path.is_file() {
            eprintln!(
                "error: eBPF object {} not found: run `{build}` first",
                path.display()
            );
            exit(1);
        }
        let path = path.canonicalize().unwrap();
        println!("cargo:rerun-if-changed={}", path.display());
        println!("cargo:rustc-env={var}={}", path.display());
    }
    let inject = injection_library(&manifest);
    println!("cargo:rustc-env=CUDATRACE_INJECT_LIB={}", inject.display());
}

/// `libcudatrace_inject.so`: `CUDATRACE_INJECT_LIB` when set (a prebuilt one, e.g. for
/// packagers), else built here by a nested cargo (release, debug info stripped) into
/// `target/inject`, a target directory of its own so it never waits on this build's lock.
fn injection_library(manifest: &Path) -> PathBuf {
    println!("cargo:rerun-if-env-changed=CUDATRACE_INJECT_LIB");
    if let Some(path) = env::var_os("CUDATRACE_INJECT_LIB") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            eprintln!(
                "error: CUDATRACE_INJECT_LIB={} is not a file",
                path.display()
            );
            exit(1);
        }
        println!("cargo:rerun-if-changed={}", path.display());
        return path;
    }
    let workspace = manifest.parent().unwrap();
    for input in ["cupti-inject", "tracer-common", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", workspace.join(input).display());
    }
    let target_dir = workspace.join("target/inject");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--release", "--locked", "-p", "cudatrace-inject"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(workspace)
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo");
    // Settings of this build that must not leak into the nested one (clippy's wrapper,
    // this crate's flags, a --target).
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
    ] {
        command.env_remove(var);
    }
    // A cross build (`cargo xtask build-arm64`) embeds a library of its own target; the
    // host's is in release/, another target's in TARGET/release/.
    let target = env::var("TARGET").unwrap_or_default();
    let cross = !target.is_empty() && env::var("HOST").ok().as_deref() != Some(target.as_str());
    if cross {
        command.args(["--target", &target]);
    }
    match command.status() {
        Ok(status) if status.success() => {}
        Ok(status) => {
            eprintln!("error: building the injection library (cupti-inject) failed: {status}");
            exit(1);
        }
        Err(e) => {
            eprintln!("error: running cargo to build the injection library: {e}");
            exit(1);
        }
    }
    if cross {
        target_dir
            .join(&target)
            .join("release/libcudatrace_inject.so")
    } else {
        target_dir.join("release/libcudatrace_inject.so")
    }
}
