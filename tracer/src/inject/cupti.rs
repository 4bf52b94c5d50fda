//! Finding the libcupti the injection library loads in the command, in this order:
//!
//! 1. `--cupti PATH`;
//! 2. the NVIDIA wheels of the Python the command runs (PyTorch depends on them):
//!    `nvidia/cu13/lib` and `nvidia/cuda_cupti/lib` in each of its `sys.path` folders.
//!    That Python is the command itself when it is a `python*`, else the interpreter its
//!    `#!` line names, else `python3` on the command's `PATH`. It is asked for its
//!    `sys.path` (as the user the command runs as, with the command's environment); if that
//!    fails, its prefix's `lib/python3*/{site,dist}-packages` are looked at;
//! 3. the CUDA toolkit: `/usr/local/cuda*/extras/CUPTI/lib64`,
//!    `/usr/local/cuda*/targets/*/lib` (`/usr/local/cuda` first, then by version, newest
//!    first), the same under `/opt/cuda`;
//! 4. the loader's search: the ldconfig cache, then the command's `LD_LIBRARY_PATH`.
//!
//! In each folder the names tried are `libcupti.so.13`, `libcupti.so.12`, `libcupti.so`.

use std::{
    ffi::{OsStr, OsString},
    fs,
    io::Read,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{privileges::TargetUser, spawn};

/// File names tried in each folder, most preferred first.
const FILE_NAMES: [&str; 3] = ["libcupti.so.13", "libcupti.so.12", "libcupti.so"];
/// Wheel folders under a `site-packages`.
const WHEEL_DIRS: [&str; 2] = ["nvidia/cu13/lib", "nvidia/cuda_cupti/lib"];
/// How long the Python may take to say its `sys.path`.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(10);

/// A libcupti, and where it was found (for the header and messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    pub from: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CuptiError {
    #[error("--cupti {}: {}", .0.display(), .1)]
    Explicit(PathBuf, String),
    #[error(
        "no libcupti found for --gpu (looked in {}): pass --cupti PATH, or install CUPTI \
         (PyTorch's NVIDIA wheels, or the CUDA toolkit)",
        .0.join("; ")
    )]
    NotFound(Vec<String>),
}

/// Where to look: the places of steps 3 and 4, changeable by the tests.
pub struct Search<'a> {
    /// `--cupti`.
    pub explicit: Option<&'a Path>,
    /// The command's resolved program (`None`: no command).
    pub program: Option<&'a Path>,
    /// The command's environment (its `PATH` and `LD_LIBRARY_PATH`).
    pub env: &'a [(OsString, OsString)],
    /// Who the command runs as (`None`: as this process).
    pub user: Option<&'a TargetUser>,
    /// Folders holding `cuda*` toolkit installations.
    pub toolkit_roots: &'a [&'a Path],
    /// Whether to read the ldconfig cache.
    pub ldconfig: bool,
}

impl Search<'_> {
    fn var(&self, key: &str) -> Option<&OsStr> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_os_str())
    }
}

/// The toolkit folders searched by default.
pub const TOOLKIT_ROOTS: [&str; 2] = ["/usr/local", "/opt"];

pub fn find(search: &Search<'_>) -> Result<Found, CuptiError> {
    if let Some(path) = search.explicit {
        return match fs::canonicalize(path) {
            Ok(real) if real.is_file() => Ok(Found {
                path: real,
                from: "--cupti".into(),
            }),
            Ok(_) => Err(CuptiError::Explicit(path.into(), "not a file".into())),
            Err(e) => Err(CuptiError::Explicit(path.into(), e.to_string())),
        };
    }
    let mut looked = Vec::new();

    if let Some(python) = python_of(search) {
        let dirs = site_dirs(&python, search);
        let wheel_dirs: Vec<PathBuf> = dirs
            .iter()
            .flat_map(|dir| WHEEL_DIRS.iter().map(move |w| dir.join(w)))
            .collect();
        if let Some(path) = first_in(&wheel_dirs) {
            return Ok(Found {
                path,
                from: format!("the NVIDIA wheels of {}", python.display()),
            });
        }
        looked.push(format!(
            "the NVIDIA wheels of {} (nvidia/cu13/lib, nvidia/cuda_cupti/lib in {} folders)",
            python.display(),
            dirs.len()
        ));
    }

    let toolkit = toolkit_dirs(search.toolkit_roots);
    if let Some(path) = first_in(&toolkit) {
        return Ok(Found {
            path,
            from: "the CUDA toolkit".into(),
        });
    }
    looked.push(
        search
            .toolkit_roots
            .iter()
            .map(|root| {
                format!(
                    "{0}/cuda*/extras/CUPTI/lib64, {0}/cuda*/targets/*/lib",
                    root.display()
                )
            })
            .collect::<Vec<_>>()
            .join(", "),
    );

    if search.ldconfig
        && let Some(path) = ldconfig_cache().into_iter().find(|p| p.is_file())
    {
        return Ok(Found {
            path: fs::canonicalize(&path).unwrap_or(path),
            from: "the ldconfig cache".into(),
        });
    }
    let library_path: Vec<PathBuf> = search
        .var("LD_LIBRARY_PATH")
        .map(|value| {
            std::env::split_paths(value)
                .filter(|d| !d.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    if let Some(path) = first_in(&library_path) {
        return Ok(Found {
            path,
            from: "LD_LIBRARY_PATH".into(),
        });
    }
    looked.push("the ldconfig cache and LD_LIBRARY_PATH".into());
    Err(CuptiError::NotFound(looked))
}

/// The first of [`FILE_NAMES`] in the first folder that has one, symlinks resolved.
/// A running process's libcupti where it has none loaded: beside a library it mapped
/// (libcudart, libcublas: a toolkit's `lib64`), or in the NVIDIA wheels of the
/// `site-packages` a mapped library came from (PyTorch's `nvidia/cu13/lib`).
pub fn beside_mapped(mapped: &[PathBuf]) -> Option<Found> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for path in mapped {
        let Some(dir) = path.parent() else { continue };
        let wheels = dir
            .ancestors()
            .find(|a| a.file_name().is_some_and(|n| n == "site-packages"))
            .map(|site| WHEEL_DIRS.iter().map(|w| site.join(w)).collect::<Vec<_>>())
            .unwrap_or_default();
        for candidate in std::iter::once(dir.to_owned()).chain(wheels) {
            if !dirs.contains(&candidate) {
                dirs.push(candidate);
            }
        }
    }
    first_in(&dirs).map(|path| Found {
        path,
        from: "beside the libraries the process mapped".into(),
    })
}

fn first_in(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .flat_map(|dir| FILE_NAMES.iter().map(move |name| dir.join(name)))
        .find(|path| path.is_file())
        .and_then(|path| fs::canonicalize(path).ok())
}

fn is_python(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(OsStr::to_str) else {
        return false;
    };
    name.strip_prefix("python")
        .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// The Python the command will run, if any.
fn python_of(search: &Search<'_>) -> Option<PathBuf> {
    let path_var = search.var("PATH");
    let resolve = |name: &OsStr| spawn::resolve(name, path_var).ok();
    if let Some(program) = search.program {
        if is_python(program) {
            return Some(program.to_owned());
        }
        if let Some(interpreter) = shebang_python(program) {
            return if interpreter.is_absolute() {
                Some(interpreter)
            } else {
                resolve(interpreter.as_os_str())
            };
        }
    }
    resolve(OsStr::new("python3"))
}

/// The Python a script's `#!` line names (`#!/usr/bin/python3`, `#!/usr/bin/env python3`).
fn shebang_python(program: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let mut file = fs::File::open(program).ok()?;
    let n = file.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    let interpreter = PathBuf::from(words.next()?);
    if is_python(&interpreter) {
        return Some(interpreter);
    }
    if interpreter.file_name() == Some(OsStr::new("env")) {
        let named = words.find(|w| !w.starts_with('-') && !w.contains('='))?;
        let named = PathBuf::from(named);
        return is_python(&named).then_some(named);
    }
    None
}

/// The Python's `sys.path` folders; its prefix's site folders if asking fails.
fn site_dirs(python: &Path, search: &Search<'_>) -> Vec<PathBuf> {
    if let Some(dirs) = ask_sys_path(python, search) {
        return dirs;
    }
    let prefix = fs::canonicalize(python)
        .ok()
        .and_then(|real| real.parent()?.parent().map(Path::to_owned));
    // A virtual environment's own bin/python is a symlink out of it: try both prefixes.
    let prefixes = [
        python.parent().and_then(Path::parent).map(Path::to_owned),
        prefix,
    ];
    let mut dirs = Vec::new();
    for prefix in prefixes.into_iter().flatten() {
        let Ok(entries) = fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("python3") {
                for site in ["site-packages", "dist-packages"] {
                    let dir = entry.path().join(site);
                    if dir.is_dir() && !dirs.contains(&dir) {
                        dirs.push(dir);
                    }
                }
            }
        }
    }
    dirs
}

/// Runs `python -c 'print sys.path'` as the command would run; `None` when that fails.
fn ask_sys_path(python: &Path, search: &Search<'_>) -> Option<Vec<PathBuf>> {
    let mut command = Command::new(python);
    command
        .args(["-c", "import sys\nfor p in sys.path:\n    print(p)"])
        .env_clear()
        .envs(search.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(user) = search.user {
        command.uid(user.uid).gid(user.gid);
    }
    let mut child = command.spawn().ok()?;
    let deadline = Instant::now() + PYTHON_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    if !status.success() {
        return None;
    }
    Some(
        out.lines()
            .filter(|line| !line.is_empty())
            .map(PathBuf::from)
            .filter(|dir| dir.is_dir())
            .collect(),
    )
}

/// `ROOT/cuda` first, then `ROOT/cuda-*` newest first, for each root: their CUPTI folders.
fn toolkit_dirs(roots: &[&Path]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for root in roots {
        let mut versioned: Vec<(Vec<u64>, PathBuf)> = fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let version = name.strip_prefix("cuda-")?;
                let numbers = version
                    .split('.')
                    .map(|part| part.parse().ok())
                    .collect::<Option<Vec<u64>>>()?;
                Some((numbers, entry.path()))
            })
            .collect();
        versioned.sort_by(|a, b| b.0.cmp(&a.0));
        let installs = std::iter::once(root.join("cuda")).chain(versioned.into_iter().map(|v| v.1));
        for install in installs {
            dirs.push(install.join("extras/CUPTI/lib64"));
            let Ok(targets) = fs::read_dir(install.join("targets")) else {
                continue;
            };
            let mut targets: Vec<PathBuf> =
                targets.flatten().map(|e| e.path().join("lib")).collect();
            targets.sort();
            dirs.extend(targets);
        }
    }
    dirs
}

/// `ldconfig -p` lines for libcupti, in [`FILE_NAMES`] order.
fn ldconfig_cache() -> Vec<PathBuf> {
    let output = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|bin| Command::new(bin).arg("-p").output().ok())
        .filter(|out| out.status.success());
    let Some(output) = output else {
        return Vec::new();
    };
    parse_ldconfig(&String::from_utf8_lossy(&output.stdout))
}

fn parse_ldconfig(text: &str) -> Vec<PathBuf> {
    let mut found: Vec<(usize, PathBuf)> = text
        .lines()
        .filter_map(|line| {
            let (library, path) = line.trim().split_once(" => ")?;
            let name = library.split_whitespace().next()?;
            let rank = FILE_NAMES.iter().position(|n| *n == name)?;
            crate::probes::library::ldconfig_is_ours(library, &tracer_common::arch::TARGET)
                .then(|| (rank, PathBuf::from(path.trim())))
        })
        .collect();
    found.sort_by_key(|(rank, _)| *rank);
    found.into_iter().map(|(_, path)| path).collect()
}

#[cfg(test)]
mod late_tests {
    use super::*;

    #[test]
    fn a_running_processs_libcupti_is_found_beside_what_it_mapped() {
        let base = std::env::temp_dir().join(format!("cudatrace-beside-{}", std::process::id()));
        let torch = base.join("venv/lib/python3.12/site-packages/torch/lib");
        let wheel = base.join("venv/lib/python3.12/site-packages/nvidia/cu13/lib");
        fs::create_dir_all(&torch).unwrap();
        fs::create_dir_all(&wheel).unwrap();
        assert_eq!(beside_mapped(&[torch.join("libtorch_cuda.so")]), None);
        fs::write(wheel.join("libcupti.so.13"), b"").unwrap();
        let found = beside_mapped(&[
            PathBuf::from("/usr/lib/libc.so.6"),
            torch.join("libtorch_cuda.so"),
        ])
        .unwrap();
        assert_eq!(
            found.path,
            fs::canonicalize(wheel.join("libcupti.so.13")).unwrap()
        );
        fs::remove_dir_all(&base).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("cudatrace-cupti-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"").unwrap();
    }

    fn search<'a>(env: &'a [(OsString, OsString)], roots: &'a [&'a Path]) -> Search<'a> {
        Search {
            explicit: None,
            program: None,
            env,
            user: None,
            toolkit_roots: roots,
            ldconfig: false,
        }
    }

    #[test]
    fn pythons_are_recognised_by_name_and_shebang() {
        assert!(is_python(Path::new("/usr/bin/python3")));
        assert!(is_python(Path::new("python3.12")));
        assert!(is_python(Path::new("/venv/bin/python")));
        assert!(!is_python(Path::new("/usr/bin/python3-config")));
        assert!(!is_python(Path::new("/usr/bin/torchrun")));
        let dir = scratch("shebang");
        let script = |name: &str, text: &str| {
            let path = dir.join(name);
            fs::write(&path, text).unwrap();
            shebang_python(&path)
        };
        assert_eq!(
            script("a", "#!/opt/venv/bin/python3.11\nimport x\n"),
            Some(PathBuf::from("/opt/venv/bin/python3.11"))
        );
        assert_eq!(
            script("b", "#!/usr/bin/env -S python3 -u\n"),
            Some(PathBuf::from("python3"))
        );
        assert_eq!(script("c", "#!/bin/sh\nexec python3 x\n"), None);
        assert_eq!(script("d", "\x7fELF"), None);
    }

    #[test]
    fn the_toolkit_is_searched_plain_first_then_newest() {
        let root = scratch("toolkit");
        touch(&root.join("cuda-12.4/extras/CUPTI/lib64/libcupti.so.12"));
        touch(&root.join("cuda-12.10/targets/x86_64-linux/lib/libcupti.so.12"));
        let roots = [root.as_path()];
        let env = [];
        let found = find(&search(&env, &roots)).unwrap();
        assert_eq!(
            found.path,
            root.join("cuda-12.10/targets/x86_64-linux/lib/libcupti.so.12")
        );
        assert_eq!(found.from, "the CUDA toolkit");
        touch(&root.join("cuda/extras/CUPTI/lib64/libcupti.so.13"));
        assert_eq!(
            find(&search(&env, &roots)).unwrap().path,
            root.join("cuda/extras/CUPTI/lib64/libcupti.so.13")
        );
    }

    #[test]
    fn a_python_is_asked_for_its_wheels_before_the_toolkit() {
        let dir = scratch("python");
        let site = dir.join("site");
        touch(&site.join("nvidia/cuda_cupti/lib/libcupti.so.12"));
        touch(&site.join("nvidia/cu13/lib/libcupti.so.13"));
        let toolkit = dir.join("toolkit");
        touch(&toolkit.join("cuda/extras/CUPTI/lib64/libcupti.so.13"));
        // A stand-in Python that answers the sys.path question.
        let python = dir.join("bin/python3");
        fs::create_dir_all(python.parent().unwrap()).unwrap();
        fs::write(
            &python,
            format!(
                "#!/bin/sh\necho\necho /nonexistent\necho {}\n",
                site.display()
            ),
        )
        .unwrap();
        fs::set_permissions(&python, fs::Permissions::from_mode(0o755)).unwrap();
        let env = [(OsString::from("PATH"), dir.join("bin").into_os_string())];
        let roots = [toolkit.as_path()];
        let found = find(&search(&env, &roots)).unwrap();
        assert_eq!(found.path, site.join("nvidia/cu13/lib/libcupti.so.13"));
        assert_eq!(
            found.from,
            format!("the NVIDIA wheels of {}", python.display())
        );
        // The command's own Python, named by a script's #! line, wins over PATH's.
        let other = dir.join("other/python3.9");
        fs::create_dir_all(other.parent().unwrap()).unwrap();
        fs::write(&other, "#!/bin/sh\nexit 1\n").unwrap();
        fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
        let script = dir.join("tool");
        fs::write(&script, format!("#!{}\n", other.display())).unwrap();
        let mut with_script = search(&env, &roots);
        with_script.program = Some(&script);
        // That Python fails to answer and has no lib/python3*: the toolkit is next.
        assert_eq!(
            find(&with_script).unwrap().path,
            toolkit.join("cuda/extras/CUPTI/lib64/libcupti.so.13")
        );
    }

    #[test]
    fn the_library_path_comes_last_and_nothing_found_says_where_it_looked() {
        let dir = scratch("loader");
        let empty = dir.join("empty");
        fs::create_dir_all(&empty).unwrap();
        let roots = [empty.as_path()];
        let env = [(OsString::from("PATH"), empty.clone().into_os_string())];
        let error = find(&search(&env, &roots)).unwrap_err().to_string();
        assert!(
            error.starts_with("no libcupti found for --gpu (looked in "),
            "{error}"
        );
        assert!(
            error.contains("the ldconfig cache and LD_LIBRARY_PATH"),
            "{error}"
        );
        assert!(
            error.ends_with(
                "pass --cupti PATH, or install CUPTI (PyTorch's NVIDIA wheels, or the CUDA toolkit)"
            ),
            "{error}"
        );
        touch(&dir.join("lib/libcupti.so"));
        let env = [
            (OsString::from("PATH"), empty.clone().into_os_string()),
            (
                OsString::from("LD_LIBRARY_PATH"),
                dir.join("lib").into_os_string(),
            ),
        ];
        let found = find(&search(&env, &roots)).unwrap();
        assert_eq!(
            (found.path, found.from.as_str()),
            (dir.join("lib/libcupti.so"), "LD_LIBRARY_PATH")
        );
        let missing = Path::new("/nonexistent/libcupti.so.13");
        let mut explicit = search(&env, &roots);
        explicit.explicit = Some(missing);
        assert_eq!(
            find(&explicit).unwrap_err().to_string(),
            "--cupti /nonexistent/libcupti.so.13: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn ldconfig_lines_are_ranked() {
        let text = "\tlibcupti.so (libc6,x86-64) => /usr/lib/libcupti.so\n\
                    \tlibcupti.so.13 (libc6,x86-64) => /usr/lib/libcupti.so.13\n\
                    \tlibcupti.so.13 (libc6) => /usr/lib32/libcupti.so.13\n";
        assert_eq!(
            parse_ldconfig(text),
            [
                PathBuf::from("/usr/lib/libcupti.so.13"),
                PathBuf::from("/usr/lib/libcupti.so")
            ]
        );
    }
}
