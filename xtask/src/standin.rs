//! Builds the stand-in libcuda and its programs (standin/README.md has the gcc lines).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, ensure};

/// Builds `libcuda.so.1`, `libcupti.so.13`, `libnvidia-ml.so.1` (the stand-in NVML, for
/// `run --power`), `cudatrace-driver` and `cudatrace-demo` into `out`.
pub fn build(root: &Path, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let src = root.join("standin");
    let lib = out.join("libcuda.so.1");
    gcc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-O2".as_ref(),
        "-fno-ipa-icf".as_ref(),
        "-g".as_ref(),
        "-Wall".as_ref(),
        "-Wextra".as_ref(),
        "-Werror".as_ref(),
        "-Wl,-soname,libcuda.so.1".as_ref(),
        "-o".as_ref(),
        lib.as_os_str(),
        src.join("libcuda_standin.c").as_os_str(),
    ])?;
    let cupti = out.join("libcupti.so.13");
    gcc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-O2".as_ref(),
        "-g".as_ref(),
        "-Wall".as_ref(),
        "-Wextra".as_ref(),
        "-Werror".as_ref(),
        "-Wl,-soname,libcupti.so.13".as_ref(),
        "-o".as_ref(),
        cupti.as_os_str(),
        src.join("libcupti_standin.c").as_os_str(),
    ])?;
    let nvml = out.join("libnvidia-ml.so.1");
    gcc(&[
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-O2".as_ref(),
        "-g".as_ref(),
        "-Wall".as_ref(),
        "-Wextra".as_ref(),
        "-Werror".as_ref(),
        "-Wl,-soname,libnvidia-ml.so.1".as_ref(),
        "-o".as_ref(),
        nvml.as_os_str(),
        src.join("libnvml_standin.c").as_os_str(),
    ])?;
    for (program, source) in [
        ("cudatrace-driver", "cudatrace_driver.c"),
        ("cudatrace-demo", "demo_inference.c"),
    ] {
        build_program(root, out, program, source)?;
    }
    Ok(())
}

/// Builds one program of `standin/` into `out`, linked against the `libcuda.so.1` that
/// [`build`] put there.
pub fn build_program(root: &Path, out: &Path, program: &str, source: &str) -> Result<()> {
    let link_dir = format!("-L{}", out.display());
    gcc(&[
        "-O2".as_ref(),
        "-g".as_ref(),
        "-Wall".as_ref(),
        "-Wextra".as_ref(),
        "-Werror".as_ref(),
        "-o".as_ref(),
        out.join(program).as_os_str(),
        root.join("standin").join(source).as_os_str(),
        link_dir.as_ref(),
        "-l:libcuda.so.1".as_ref(),
        "-Wl,-rpath,$ORIGIN".as_ref(),
        "-lpthread".as_ref(),
    ])
}

fn gcc(args: &[&std::ffi::OsStr]) -> Result<()> {
    let status = Command::new("gcc")
        .args(args)
        .status()
        .context("running gcc (install it: apt-get install gcc)")?;
    ensure!(status.success(), "gcc failed building the stand-in libcuda");
    Ok(())
}

/// Where `cargo xtask demo` builds the stand-in.
pub fn out_dir(root: &Path) -> PathBuf {
    root.join("target/standin")
}
