//! Another injection library, started after this one as libcuda would have started it (a
//! user's own `CUDA_INJECTION64_PATH`, passed on as [`env::CHAIN`]).

use std::ffi::c_int;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use tracer_common::gpu_stage;

use crate::env;
use crate::outbox::Failure;

/// Loads and starts the library named in [`env::CHAIN`], if any; it stays loaded for the
/// life of the process, as libcuda would keep it.
pub fn start() -> Result<(), Failure> {
    let Some(path) = env::path(env::CHAIN) else {
        return Ok(());
    };
    let shown = path.to_string_lossy().into_owned();
    let failure = |message| Failure::plain(gpu_stage::CHAIN, false, message);
    // SAFETY: loading runs the library's initialisers, as libcuda's loading would.
    let library = unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| {
        failure(format!(
            "cannot load the chained injection library {shown}: {e}"
        ))
    })?;
    // SAFETY: the injection entry point's signature, `int InitializeInjection(void)`.
    let started =
        match unsafe { library.get::<unsafe extern "C" fn() -> c_int>(b"InitializeInjection\0") } {
            Ok(initialize) => {
                // SAFETY: as libcuda calls it.
                unsafe { initialize() };
                Ok(())
            }
            Err(e) => Err(failure(format!(
                "the chained injection library {shown} has no InitializeInjection: {e}"
            ))),
        };
    std::mem::forget(library);
    started
}
