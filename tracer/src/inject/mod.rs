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
//! A user's own `CUDA_INJECTION64_PATH` keeps working: cudatrace's library starts it after
//! itself (`CUDATRACE_INJECT_CHAIN`). Such libraries are nearly always CUPTI clients
//! (Nsight Systems, another profiler): where CUPTI allows one client at a time, cudatrace's
//! library yields to it while it holds CUPTI, and the trace says when (`gpu_gap` lines).
//! Only cudatrace's own library (a `run --gpu` inside another) is refused.

pub mod control;
pub mod cupti;
pub mod late;
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

use self::{control::ControlFile, private_dir::PrivateLibrary};

/// The driver's injection hook.
pub const INJECTION_VAR: &str = "CUDA_INJECTION64_PATH";

/// What `--gpu` puts into the command; dropping it removes the library's directory.
#[derive(Debug)]
pub struct GpuInjection {
    /// A user's own injection library, started after cudatrace's.
    pub chain: Option<OsString>,
    /// Dropped before the library: the directory goes with the library.
    pub control: std::sync::Arc<ControlFile>,
    pub library: PrivateLibrary,
    /// `-p PID --gpu`: the name the library has in the running processes (an anonymous
    /// file each, `late::handover`), and the pids to attach to.
    pub late: Option<LateAttach>,
    pub cupti: cupti::Found,
    /// The command's `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`: how its CUDA devices
    /// are numbered (the header keeps them to match `--power`'s GPUs).
    pub cuda_visible_devices: Option<String>,
    pub cuda_device_order: Option<String>,
}

/// `-p PID --gpu`: the library as the processes show it, and whom it goes into.
#[derive(Debug)]
pub struct LateAttach {
    /// `/memfd:libcudatrace_inject-HASH.so`.
    pub library: PathBuf,
    pub pids: Vec<u32>,
}

/// `--all` with `--gpu`: nothing is injected into every process; `-p` with a command: one
/// or the other.
pub fn check_usage(has_command: bool, pids: &[u32], all: bool) -> Result<(), Failure> {
    if all {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!(
                "--gpu with --all: cudatrace does not put its library into every process; name \
                 them with -p PID (attach) or start the command under it"
            ),
        ));
    }
    if !pids.is_empty() {
        if has_command {
            return Err(Failure::new(
                ExitCode::Usage,
                anyhow!("--gpu attaches to -p PID or starts a command, not both"),
            ));
        }
        return Ok(());
    }
    if !has_command {
        return Err(Failure::new(
            ExitCode::Usage,
            anyhow!("--gpu needs a command: cudatrace run --gpu -- CMD [ARGS...]"),
        ));
    }
    Ok(())
}

/// The user's own `CUDA_INJECTION64_PATH`, where set: the library cudatrace's starts after
/// itself. cudatrace's own is refused (a `run --gpu` inside another).
pub fn check_environment(env: &[(OsString, OsString)]) -> Result<Option<OsString>, Failure> {
    let Some((_, value)) = env
        .iter()
        .rev()
        .find(|(key, value)| key == INJECTION_VAR && !value.is_empty())
    else {
        return Ok(None);
    };
    let file = Path::new(value)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !file.starts_with("libcudatrace_inject") {
        return Ok(Some(value.clone()));
    }
    Err(Failure::new(
        ExitCode::InjectionPathSet,
        anyhow!(
            "{INJECTION_VAR} is already set to {} (cudatrace's own: a cudatrace run --gpu \
             inside another): one run records the GPU at a time; unset it for this run \
             (env -u {INJECTION_VAR})",
            value.to_string_lossy()
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
    let control = ControlFile::create(library.path.parent().unwrap_or(Path::new("/")))
        .map_err(|e| Failure::new(ExitCode::Internal, e.context("--gpu")))?;
    let chain = check_environment(env)?;
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.to_string_lossy().into_owned())
    };
    Ok(GpuInjection {
        chain,
        control: std::sync::Arc::new(control),
        library,
        late: None,
        cupti,
        cuda_visible_devices: var("CUDA_VISIBLE_DEVICES"),
        cuda_device_order: var("CUDA_DEVICE_ORDER"),
    })
}

/// `-p PID --gpu`: libcupti as each process has it (its own, where loaded; else as `--gpu`
/// would find it for the process's program and environment), the library's name, the
/// run's control file. Before any process is touched.
pub fn prepare_late(explicit_cupti: Option<&Path>, pids: &[u32]) -> Result<GpuInjection, Failure> {
    let first = pids[0];
    let environ = process_env(first);
    let maps = std::fs::read_to_string(format!("/proc/{first}/maps"))
        .map(|maps| late::target::parse_maps(&maps))
        .unwrap_or_default();
    let loaded = maps
        .iter()
        .find(|m| m.file_name().starts_with("libcupti.so"));
    let mapped: Vec<PathBuf> = maps
        .iter()
        .filter(|m| m.path.starts_with('/'))
        .map(|m| PathBuf::from(&m.path))
        .collect();
    let beside = cupti::beside_mapped(&mapped);
    let cupti = match (explicit_cupti, loaded, beside) {
        (None, Some(mapping), _) => cupti::Found {
            path: PathBuf::from(&mapping.path),
            from: format!("process {first}'s own"),
        },
        (None, None, Some(found)) => found,
        _ => {
            let program = std::fs::read_link(format!("/proc/{first}/exe")).ok();
            let roots: Vec<&Path> = cupti::TOOLKIT_ROOTS.iter().map(Path::new).collect();
            cupti::find(&cupti::Search {
                explicit: explicit_cupti,
                program: program.as_deref(),
                env: &environ,
                user: None,
                toolkit_roots: &roots,
                ldconfig: true,
            })
            .map_err(|e| Failure::new(ExitCode::NoCupti, e))?
        }
    };
    for &pid in pids {
        reachable_from(pid, &cupti.path)?;
    }
    let library = private_dir::write(true)
        .map_err(|e| Failure::new(ExitCode::Internal, e.context("--gpu")))?;
    let control = ControlFile::create(library.path.parent().unwrap_or(Path::new("/")))
        .map_err(|e| Failure::new(ExitCode::Internal, e.context("--gpu")))?;
    let var = |name: &str| {
        environ
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.to_string_lossy().into_owned())
    };
    Ok(GpuInjection {
        chain: None,
        control: std::sync::Arc::new(control),
        library,
        late: Some(LateAttach {
            library: PathBuf::from(format!("/memfd:{}", late::library_name())),
            pids: pids.to_vec(),
        }),
        cupti,
        cuda_visible_devices: var("CUDA_VISIBLE_DEVICES"),
        cuda_device_order: var("CUDA_DEVICE_ORDER"),
    })
}

/// `-p PID --gpu`: whether process `pid` can open `cupti` by that path from its own root
/// (the library loads it there; a process in a container has a root of its own).
fn reachable_from(pid: u32, cupti: &Path) -> Result<(), Failure> {
    let relative = cupti.strip_prefix("/").unwrap_or(cupti);
    let there = PathBuf::from(format!("/proc/{pid}/root")).join(relative);
    // A process that is gone is refused later, with the other checks.
    if there.is_file() || !Path::new(&format!("/proc/{pid}")).exists() {
        return Ok(());
    }
    Err(Failure::new(
        ExitCode::AttachRefused,
        anyhow!(
            "--gpu: cannot attach to process {pid}: libcupti {} is not at that path in its \
             root (it runs in another mount namespace, a container), where the injection \
             library would load it; pass --cupti with a libcupti at the same path in both \
             roots, or let the program load its own first",
            cupti.display()
        ),
    ))
}

/// A running process's environment (`/proc/PID/environ`), as it started.
fn process_env(pid: u32) -> Vec<(OsString, OsString)> {
    use std::os::unix::ffi::OsStrExt;
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let at = entry.iter().position(|b| *b == b'=')?;
            Some((
                std::ffi::OsStr::from_bytes(&entry[..at]).to_owned(),
                std::ffi::OsStr::from_bytes(&entry[at + 1..]).to_owned(),
            ))
        })
        .collect()
}

impl GpuInjection {
    /// The settings a late start gets (`-p PID --gpu`): those `--gpu` puts into a
    /// command's environment, with the process's own control file (`control`, its path
    /// there), and who cudatrace is.
    pub fn late_settings(&self, control: &str) -> Vec<u8> {
        let mut vars = self.env();
        vars.retain(|(key, _)| key != INJECTION_VAR && key != "CUDATRACE_INJECT_CONTROL");
        vars.push(("CUDATRACE_INJECT_CONTROL".into(), control.into()));
        vars.push((
            "CUDATRACE_INJECT_TRACER".into(),
            late::tracer_identity().into(),
        ));
        // Ways to compare on a GPU, from cudatrace's own environment (the program's is
        // its own).
        for name in [
            "CUDATRACE_INJECT_DRIVER_API",
            "CUDATRACE_INJECT_VERBOSE",
            "CUDATRACE_INJECT_LATE_CALLS",
            "CUDATRACE_INJECT_LATE_RUNTIME",
            "CUDATRACE_INJECT_DEBUG_FILE",
        ] {
            if let Some(value) = std::env::var_os(name) {
                vars.push((name.into(), value));
            }
        }
        late::settings(&vars)
    }

    /// The variables the command's environment gets (replacing any of the same name).
    pub fn env(&self) -> Vec<(OsString, OsString)> {
        let chain = self
            .chain
            .iter()
            .map(|path| ("CUDATRACE_INJECT_CHAIN".into(), path.clone()));
        vec![
            (INJECTION_VAR.into(), self.library.path.clone().into()),
            ("CUDATRACE_CUPTI".into(), self.cupti.path.clone().into()),
            ("CUDATRACE_INJECT_STDERR".into(), "0".into()),
            (
                "CUDATRACE_INJECT_CONTROL".into(),
                self.control.path.clone().into(),
            ),
        ]
        .into_iter()
        .chain(chain)
        .collect()
    }

    pub fn header(&self) -> GpuHeaderInfo {
        GpuHeaderInfo {
            library: self.library_path().display().to_string(),
            libcupti: self.cupti.path.display().to_string(),
            libcupti_from: self.cupti.from.clone(),
            cuda_visible_devices: self.cuda_visible_devices.clone(),
            cuda_device_order: self.cuda_device_order.clone(),
            launch_results: Some("cupti".into()),
            chained: self
                .chain
                .as_ref()
                .map(|path| path.to_string_lossy().into_owned()),
        }
    }

    /// The library the processes load: the command's, or the anonymous file's name.
    pub fn library_path(&self) -> &PathBuf {
        match &self.late {
            Some(late) => &late.library,
            None => &self.library.path,
        }
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
    fn a_users_injection_library_is_chained_cudatraces_own_refused() {
        assert_eq!(
            check_environment(&[("CUDA_INJECTION64_PATH".into(), "".into())]).unwrap(),
            None
        );
        assert_eq!(
            check_environment(&[(
                "CUDA_INJECTION64_PATH".into(),
                "/opt/nsys/libToolsInjection64.so".into(),
            )])
            .unwrap(),
            Some("/opt/nsys/libToolsInjection64.so".into())
        );
        let failure = check_environment(&[(
            "CUDA_INJECTION64_PATH".into(),
            "/tmp/cudatrace-gpu-x/libcudatrace_inject.so".into(),
        )])
        .unwrap_err();
        assert_eq!(failure.code, ExitCode::InjectionPathSet);
        let text = format!("{:#}", failure.error);
        assert!(text.contains("(cudatrace's own"), "{text}");
        assert_eq!(
            check_usage(true, &[5], false).unwrap_err().code,
            ExitCode::Usage
        );
        assert!(check_usage(false, &[5], false).is_ok());
        assert_eq!(
            check_usage(false, &[], true).unwrap_err().code,
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
