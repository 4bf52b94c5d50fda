//! NCCL tests: the stand-in libnccl (standin/libnccl_standin.c, NOT NVIDIA's NCCL) and
//! `tests/c/nccl_caller.c`, which `dlopen()`s it from the path it is given.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use serde_json::Value;

use super::{CUDATRACE, assert_complete, gcc, read_trace, scratch, standin_library, stderr};

pub struct NcclStandin {
    /// `DIR/site-packages/nvidia/nccl/lib/libnccl.so.2`: where no search looks.
    pub lib: PathBuf,
    pub caller: PathBuf,
}

/// The stand-in libnccl and its caller, built once per test binary.
pub fn nccl_standin() -> &'static NcclStandin {
    static BUILT: OnceLock<NcclStandin> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = scratch("nccl-bin");
        let lib_dir = dir.join("site-packages/nvidia/nccl/lib");
        std::fs::create_dir_all(&lib_dir).unwrap();
        let lib = lib_dir.join("libnccl.so.2");
        standin_library(
            "libnccl.so.2",
            &lib,
            Path::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../standin/libnccl_standin.c"
            )),
            &[],
        );
        let caller = dir.join("nccl_caller");
        gcc(&[
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            caller.to_str().unwrap(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/nccl_caller.c"),
        ]);
        NcclStandin { lib, caller }
    })
}

/// `cudatrace run -o DIR/t.jsonl -- nccl_caller LIB`: the trace's lines, complete.
pub fn trace_nccl_caller(dir: &Path) -> Vec<Value> {
    let NcclStandin { lib, caller } = nccl_standin();
    let trace = dir.join("t.jsonl");
    let output = Command::new(CUDATRACE)
        .args(["run", "-q", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(caller)
        .arg(lib)
        .output()
        .expect("running cudatrace");
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "ok\n");
    let lines = read_trace(&trace);
    assert_complete(&lines);
    lines
}
