//! `cudatrace run --gpu`: what is put into the command, and nothing without `--gpu`.
//!
//! Before the command starts: the command is checked (a command to start, no injection
//! library of the user's own), libcupti is found (`cupti.rs`), and the injection library
//! embedded in this binary is written to a private directory for the run
//! (`private_dir.rs`). The command then gets, in its environment only,
//! `CUDA_INJECTION64_PATH` (libcuda loads the library at `cuInit`), `CUDATRACE_CUPTI` and
//! `CUDATRACE_INJECT_STDERR=0` (the library's errors reach the user through cudatrace, as
//! `gpu_error` lines and one stderr line each). docs/gpu.md has the whole path.
//!
//! A `CUDA_INJECTION64_PATH` already in the environment is refused rather than chained:
//! such libraries are nearly always CUPTI clients themselves (Nsight Systems, another
//! profiler), and two CUPTI clients in one process take each other's activity buffers and
//! callbacks, so both would record wrongly without saying so. The library can chain
//! (`CUDATRACE_INJECT_CHAIN`) for whoever sets that on purpose.

pub mod cupti;
pub mod private_dir;

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use anyhow::anyhow;

use crate::{
    exit::{ExitCode, Failure},
    privileges::TargetUser,
    schema::GpuHeaderInfo,
};

use self::private_dir::PrivateLibrary;

/// The driver's injection hook.
pub const INJECTION_VAR: &str = "CUDA_INJECTION64_PATH";

/// What `--gpu` puts into the command; dropping it removes the library's directory.
#[derive(Debug)]
pub struct GpuInjection {
    pub library: PrivateLibrary,
    pub cupti: cupti::Found,
    /// The command's `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`: how its CUDA devices
    /// are numbered (the header keeps them to match `--power`'s GPUs).
    pub cuda_visible_devices: Option<String>,
    pub cuda_device_order: Option<String>,
}

/// `-p`/`--all` with `--gpu`: nothing can be injected into a process that already runs.
pub fn check_usage(has_command: bool, pids: &[u32], all: bool) -> Result<(), Failure> {
    if !pids.is_empty() || all {
        let what = if all { "--all" } else { "-p" };
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!(
                "--gpu needs a command to start: {what} traces processes that already run, and \
                 nothing can be injected into them (CUPTI starts at cuInit)"
            ),
        ));
    }
    if !has_command {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!("--gpu needs a command: cudatrace run --gpu -- CMD [ARGS...]"),
        ));
    }
    Ok(())
}

/// The user's own `CUDA_INJECTION64_PATH`, refused (see the module's doc).
pub fn check_environment(env: &[(OsString, OsString)]) -> Result<(), Failure> {
    let Some((_, value)) = env
        .iter()
        .rev()
        .find(|(key, value)| key == INJECTION_VAR && !value.is_empty())
    else {
        return Ok(());
    };
    let shown = value.to_string_lossy();
    let file = Path::new(value)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tool = if file.starts_with("libToolsInjection") {
        "Nsight Systems' injection library"
    } else if file.starts_with("libcudatrace_inject") {
        "cudatrace's own (a cudatrace run --gpu inside another)"
    } else {
        "another CUDA tool's injection library"
    };
    Err(Failure::new(
        ExitCode::InjectionPathSet,
        anyhow!(
            "{INJECTION_VAR} is already set to {shown} ({tool}): --gpu injects its own library \
             through it, and two CUPTI clients in one process take each other's records; \
             unset it for this run (env -u {INJECTION_VAR}), or, to run both anyway, name it \
             in CUDATRACE_INJECT_CHAIN instead (cudatrace's library starts it after itself)"
        ),
    ))
}

/// Finds libcupti and writes the injection library; before the command exists.
pub fn prepare(
    explicit_cupti: Option<&Path>,
    program: Option<&Path>,
    env: &[(OsString, OsString)],
    user: Option<&TargetUser>,
) -> Result<GpuInjection, Failure> {
    let roots: Vec<&Path> = cupti::TOOLKIT_ROOTS.iter().map(Path::new).collect();
    let cupti = cupti::find(&cupti::Search {
        explicit: explicit_cupti,
        program,
        env,
        user,
        toolkit_roots: &roots,
        ldconfig: true,
    })
    .map_err(|e| Failure::new(ExitCode::NoCupti, e))?;
    let library = private_dir::write(user.is_some())
        .map_err(|e| Failure::new(ExitCode::Internal, e.context("--gpu")))?;
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.to_string_lossy().into_owned())
    };
    Ok(GpuInjection {
        library,
        cupti,
        cuda_visible_devices: var("CUDA_VISIBLE_DEVICES"),
        cuda_device_order: var("CUDA_DEVICE_ORDER"),
    })
}

impl GpuInjection {
    /// The variables the command's environment gets (replacing any of the same name).
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        vec![
            (INJECTION_VAR.into(), self.library.path.clone().into()),
            ("CUDATRACE_CUPTI".into(), self.cupti.path.clone().into()),
            ("CUDATRACE_INJECT_STDERR".into(), "0".into()),
        ]
    }

    pub fn header(&self) -> GpuHeaderInfo {
        GpuHeaderInfo {
            library: self.library.path.display().to_string(),
            libcupti: self.cupti.path.display().to_string(),
            libcupti_from: self.cupti.from.clone(),
            cuda_visible_devices: self.cuda_visible_devices.clone(),
            cuda_device_order: self.cuda_device_order.clone(),
        }
    }

    pub fn library_path(&self) -> &PathBuf {
        &self.library.path
    }
}

/// `env` with `extra` set, replacing any of the same name.
pub fn with_vars(
    mut env: Vec<(OsString, OsString)>,
    extra: Vec<(OsString, OsString)>,
) -> Vec<(OsString, OsString)> {
    for (key, value) in extra {
        env.retain(|(k, _)| *k != key);
        env.push((key, value));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_injection_library_is_refused_naming_it() {
        assert!(check_environment(&[("CUDA_INJECTION64_PATH".into(), "".into())]).is_ok());
        let failure = check_environment(&[(
            "CUDA_INJECTION64_PATH".into(),
            "/opt/nsys/libToolsInjection64.so".into(),
        )])
        .unwrap_err();
        assert_eq!(failure.code, ExitCode::InjectionPathSet);
        let text = format!("{:#}", failure.error);
        assert!(
            text.starts_with(
                "CUDA_INJECTION64_PATH is already set to /opt/nsys/libToolsInjection64.so \
                 (Nsight Systems' injection library)"
            ),
            "{text}"
        );
        assert_eq!(
            check_usage(true, &[5], false).unwrap_err().code,
            ExitCode::Usage
        );
        assert!(check_usage(true, &[], false).is_ok());
    }

    #[test]
    fn vars_replace_their_namesakes() {
        let env = with_vars(
            vec![("A".into(), "1".into()), ("B".into(), "2".into())],
            vec![("A".into(), "3".into())],
        );
        assert_eq!(
            env,
            [
                (OsString::from("B"), OsString::from("2")),
                (OsString::from("A"), OsString::from("3"))
            ]
        );
    }
}
