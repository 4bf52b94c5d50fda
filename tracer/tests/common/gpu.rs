//! GPU activity tests: the injection library, the stand-in libcupti, and what
//! `cudatrace-driver gpu` makes them produce (standin/cudatrace_driver.c lists the calls).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::OnceLock,
};

use serde_json::Value;
use tracer_common::gpu_record;

/// `libcudatrace_inject.so`, as `tracer/build.rs` built it for embedding.
pub const INJECT_LIB: &str = env!("CUDATRACE_INJECT_LIB");

pub struct CuptiStandin {
    /// The stand-in libcupti.so.13.
    pub lib: PathBuf,
    /// The same without `cuptiActivityRegisterTimestampCallback` (in a folder of its own).
    pub without_timestamp_callback: PathBuf,
}

/// The stand-in libcupti, built once per test binary next to the stand-in libcuda, only by
/// the tests that use it (gcc is slow in vm-test's guest).
pub fn cupti_standin() -> &'static CuptiStandin {
    static CUPTI: OnceLock<CuptiStandin> = OnceLock::new();
    CUPTI.get_or_init(|| {
        let dir = &super::standin().dir;
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../standin/libcupti_standin.c");
        let nots = dir.join("nots");
        std::fs::create_dir_all(&nots).unwrap();
        let lib = dir.join("libcupti.so.13");
        let without_timestamp_callback = nots.join("libcupti.so.13");
        for (out, define) in [
            (&lib, None),
            (
                &without_timestamp_callback,
                Some("-DCUPTI_STANDIN_NO_TIMESTAMP_CALLBACK"),
            ),
        ] {
            let extra: Vec<&str> = define.into_iter().collect();
            super::standin_library("libcupti.so.13", out, &source, &extra);
        }
        CuptiStandin {
            lib,
            without_timestamp_callback,
        }
    })
}

/// `(correlation id, cbid, CUresult)` of the API records of `cudatrace-driver gpu`, in order.
pub const DRIVER_GPU_CALLS: [(u64, u64, u64); 9] = [
    (1, 276, 0),   // cuMemcpyHtoD_v2
    (2, 307, 0),   // cuLaunchKernel
    (3, 652, 0),   // cuLaunchKernelEx
    (4, 307, 0),   // cuLaunchKernel (1,500-byte name)
    (5, 307, 0),   // cuLaunchKernel (5,000-byte name)
    (6, 307, 400), // cuLaunchKernel(NULL): CUDA_ERROR_INVALID_HANDLE
    (7, 249, 0),   // cuMemsetD8_v2
    (8, 220, 0),   // cuMemsetD32Async
    (9, 279, 0),   // cuMemcpyDtoHAsync_v2
];

/// Records `cudatrace-driver gpu` produces with no switch: INFO, 9 API, 4 kernels, 2 copies,
/// 2 memsets, 3 names.
pub const DRIVER_GPU_RECORDS: usize = 21;

/// The driver's three kernel names, in the order they are first launched.
pub fn driver_kernel_names() -> [String; 3] {
    let name = |len: usize, fill: char, suffix: &str| {
        let mut name = String::from("_Z");
        name.extend(std::iter::repeat_n(fill, len - 2 - suffix.len()));
        name.push_str(suffix);
        name
    };
    [
        "_Z10vector_addPKfS0_Pfi".to_owned(),
        name(1500, 'a', "_longv"),
        name(5000, 'b', "_hugev"),
    ]
}

pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// `cudatrace-driver gpu` with the injection library, `cupti` and a debug file.
pub fn driver_command(cupti: &Path, debug: &Path) -> Command {
    let standin = super::standin();
    let mut command = Command::new(&standin.driver);
    command
        .arg("gpu")
        .env("CUDA_INJECTION64_PATH", INJECT_LIB)
        .env("CUDATRACE_CUPTI", cupti)
        .env("CUDATRACE_INJECT_DEBUG_FILE", debug)
        .env_remove("CUPTI_STANDIN_DROPPED")
        .env_remove("CUPTI_STANDIN_ENABLE_ERROR")
        .env_remove("CUDATRACE_INJECT_CHAIN");
    command
}

pub struct GpuRun {
    pub output: Output,
    pub pid: u32,
    /// The debug file's records, in order.
    pub records: Vec<Value>,
    /// CLOCK_MONOTONIC before the spawn and after the exit.
    pub window: (u64, u64),
}

/// Runs [`driver_command`] (changed by `setup`) and reads the debug file.
pub fn run_driver(name: &str, cupti: &Path, setup: impl FnOnce(&mut Command)) -> GpuRun {
    let dir = super::scratch(name);
    let debug = dir.join("records.jsonl");
    let mut command = driver_command(cupti, &debug);
    setup(&mut command);
    let before = monotonic_ns();
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running cudatrace-driver");
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    let after = monotonic_ns();
    GpuRun {
        output,
        pid,
        records: read_records(&debug),
        window: (before, after),
    }
}

/// The debug file's JSON lines; none if the file was never written.
pub fn read_records(path: &Path) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

pub fn of_kind(records: &[Value], what: u32) -> Vec<&Value> {
    records.iter().filter(|r| r["what"] == what).collect()
}

/// The API record with this correlation id.
pub fn api_record(records: &[Value], correlation_id: u64) -> &Value {
    let apis: Vec<&Value> = records
        .iter()
        .filter(|r| r["what"] == gpu_record::API && r["correlation_id"] == correlation_id)
        .collect();
    assert_eq!(
        apis.len(),
        1,
        "API records for correlation {correlation_id}"
    );
    apis[0]
}

pub fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{value} is not a u64"))
}

/// A small injection library for `CUDATRACE_INJECT_CHAIN`: its `InitializeInjection`
/// writes "chained <pid>" to the file named in `CHAINED_MARKER`.
pub fn chained_library(dir: &Path) -> PathBuf {
    let source = dir.join("chained.c");
    std::fs::write(
        &source,
        "#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n\
         int InitializeInjection(void) {\n\
             FILE *f = fopen(getenv(\"CHAINED_MARKER\"), \"w\");\n\
             if (f) { fprintf(f, \"chained %d\", (int)getpid()); fclose(f); }\n\
             return 1;\n\
         }\n",
    )
    .unwrap();
    let library = dir.join("libchained.so");
    super::gcc(&[
        "-shared",
        "-fPIC",
        "-Wall",
        "-Werror",
        "-o",
        library.to_str().unwrap(),
        source.to_str().unwrap(),
    ]);
    library
}
