//! Embeds the eBPF objects built by `cargo xtask build-ebpf`, or stops with the hint.

use std::{env, path::PathBuf, process::exit};

fn main() {
    let dir = env::var_os("CUDATRACE_EBPF_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap());
            manifest.join("../target/ebpf/bpfel-unknown-none/release")
        });
    println!("cargo:rerun-if-env-changed=CUDATRACE_EBPF_DIR");
    for (object, var) in [
        ("cudatrace-probes", "CUDATRACE_PROBES_OBJ"),
        ("selftest", "CUDATRACE_SELFTEST_OBJ"),
    ] {
        let path = dir.join(object);
        if !path.is_file() {
            eprintln!(
                "error: eBPF object {} not found: run `cargo xtask build-ebpf` first",
                path.display()
            );
            exit(1);
        }
        let path = path.canonicalize().unwrap();
        println!("cargo:rerun-if-changed={}", path.display());
        println!("cargo:rustc-env={var}={}", path.display());
    }
}
