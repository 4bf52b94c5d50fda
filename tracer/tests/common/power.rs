//! `--power` tests: the stand-in libnvidia-ml (standin/libnvml_standin.c, NOT NVIDIA's NVML)
//! and its values.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

/// device 0's power in the stand-in (device i draws (i + 1) times it).
pub const STANDIN_POWER_W: f64 = 100.0;

pub struct NvmlStandin {
    /// `DIR/nvml/libnvidia-ml.so.1`.
    pub lib: PathBuf,
    /// The same file in a `stubs` folder (`DIR/cuda/stubs/libnvidia-ml.so.1`): where the
    /// CUDA toolkit keeps its link-time stub, which cudatrace must never take.
    pub in_stubs: PathBuf,
}

/// The stand-in NVML, built once per test binary.
pub fn nvml_standin() -> &'static NvmlStandin {
    static NVML: OnceLock<NvmlStandin> = OnceLock::new();
    NVML.get_or_init(|| {
        let dir = &super::standin().dir;
        let lib = dir.join("nvml").join("libnvidia-ml.so.1");
        let in_stubs = dir.join("cuda").join("stubs").join("libnvidia-ml.so.1");
        for path in [&lib, &in_stubs] {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        }
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/../standin/libnvml_standin.c");
        super::standin_library("libnvidia-ml.so.1", &lib, Path::new(source), &[]);
        std::fs::copy(&lib, &in_stubs).unwrap();
        NvmlStandin { lib, in_stubs }
    })
}
