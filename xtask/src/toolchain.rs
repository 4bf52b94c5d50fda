//! Prepares what a build for bpfel-unknown-none needs: a bpf-linker and a `core` for the target.
//!
//! Where rustup's rust-src component is installed, cargo's `-Z build-std=core` builds `core`.
//! Without it, `core` is rebuilt from the rust-docs component's HTML source pages into a
//! sysroot cached under `target/ebpf-toolchain/`, next to a bpf-linker built against rustc's
//! own libLLVM. Both caches carry a stamp and are reused only while the stamp matches.

mod core_pages;

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, TryLockError};
use std::io::ErrorKind;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use std::{env, process};

use anyhow::{Context, Result, bail, ensure};

use crate::cmd;

pub const BPF_TARGET: &str = "bpfel-unknown-none";
const BPF_LINKER_VERSION: &str = "0.13.0";
/// Bump when the cached toolchain would differ for the same rustc (extractor, flags, layout).
const STAMP_SCHEMA: u32 = 1;
const STAMP_FILE: &str = ".xtask-stamp";

pub struct PrepareOptions {
    /// Rebuild the cached bpf-linker and sysroot even when their stamps match.
    pub force: bool,
    /// Pass `-v` to the cargo commands run.
    pub verbose: bool,
}

/// How the eBPF crate gets its `core`.
pub enum CoreSource {
    /// rust-src is installed: `cargo -Z build-std=core`.
    BuildStd,
    /// A sysroot holding a prebuilt `core` and `compiler_builtins` for the target.
    Sysroot {
        path: PathBuf,
        /// Built by this run: crates compiled against an earlier one no longer link with it.
        rebuilt: bool,
    },
}

pub struct Toolchain {
    pub linker: PathBuf,
    pub core: CoreSource,
    /// Held until the toolchain's user is done, so no other run replaces the sysroot meanwhile.
    _cache_lock: File,
}

/// The rustc that cargo will use, as far as the cached toolchain depends on it.
struct Rustc {
    program: OsString,
    /// `rustc -vV`, verbatim: part of every stamp.
    version_verbose: String,
    commit_hash: String,
    llvm_major: u32,
    sysroot: PathBuf,
}

impl Rustc {
    fn detect() -> Result<Self> {
        let program = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        let version_verbose =
            cmd::stdout(Command::new(&program).arg("-vV")).context("running `rustc -vV`")?;
        let field = |name: &str| {
            version_verbose
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(str::trim)
                .with_context(|| format!("`rustc -vV` has no `{name}` line"))
        };
        let commit_hash = field("commit-hash:")?.to_owned();
        ensure!(
            commit_hash.len() >= 12 && commit_hash != "unknown",
            "rustc reports no commit hash, so its cached toolchain cannot be keyed"
        );
        let llvm_version = field("LLVM version:")?;
        let llvm_major = llvm_version
            .split('.')
            .next()
            .and_then(|major| major.parse().ok())
            .with_context(|| format!("unexpected LLVM version `{llvm_version}` from rustc"))?;
        let sysroot = cmd::stdout(Command::new(&program).args(["--print", "sysroot"]))
            .context("running `rustc --print sysroot`")?;
        Ok(Self {
            program,
            version_verbose,
            commit_hash,
            llvm_major,
            sysroot: PathBuf::from(sysroot.trim()),
        })
    }

    /// Short commit hash that names the cache directories, like rustc's own `rustc -V`.
    fn hash12(&self) -> &str {
        &self.commit_hash[..12]
    }

    fn has_rust_src(&self) -> bool {
        self.sysroot
            .join("lib/rustlib/src/rust/library/core")
            .is_dir()
    }

    fn core_pages_dir(&self) -> PathBuf {
        self.sysroot.join("share/doc/rust/html/src/core")
    }
}

/// Finds or builds a bpf-linker, and `core` for [`BPF_TARGET`] unless cargo can build it.
pub fn prepare(root: &Path, opts: &PrepareOptions) -> Result<Toolchain> {
    let rustc = Rustc::detect()?;
    let build_std = rustc.has_rust_src();
    // Checked first so that a missing component does not surface after a minute of building.
    if !build_std && !rustc.core_pages_dir().join("lib.rs.html").is_file() {
        bail!(
            "the rust-docs component is missing (core's source pages are needed to build core for \
             {BPF_TARGET}): run `rustup component add rust-docs`, or `rustup component add rust-src` \
             and install bpf-linker"
        );
    }

    let cache = root.join("target/ebpf-toolchain");
    fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let cache_lock = lock_cache(&cache)?;

    let linker = match find_on_path("bpf-linker") {
        Some(linker) => {
            eprintln!("using bpf-linker from PATH: {}", linker.display());
            linker
        }
        None => ensure_bpf_linker(&cache, &rustc, opts)?,
    };
    let linker_version = bpf_linker_version(&linker)?;

    let core = if build_std {
        eprintln!("rust-src is installed: cargo builds core with -Z build-std");
        CoreSource::BuildStd
    } else {
        let (path, rebuilt) = ensure_sysroot(&cache, &rustc, &linker_version, opts)?;
        CoreSource::Sysroot { path, rebuilt }
    };
    Ok(Toolchain {
        linker,
        core,
        _cache_lock: cache_lock,
    })
}

/// Serialises concurrent `build-ebpf` runs over the cache; released when the file is dropped.
fn lock_cache(cache: &Path) -> Result<File> {
    let path = cache.join(".lock");
    let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            eprintln!("waiting for another build-ebpf to finish...");
            file.lock()
                .with_context(|| format!("locking {}", path.display()))?;
        }
        Err(TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    Ok(file)
}

fn stamp_text(rustc: &Rustc, linker_version: &str) -> String {
    format!(
        "cudatrace xtask ebpf-toolchain schema {STAMP_SCHEMA}\n{}\nbpf-linker: {linker_version}\n",
        rustc.version_verbose.trim_end()
    )
}

fn read_stamp(dir: &Path) -> Option<String> {
    fs::read_to_string(dir.join(STAMP_FILE)).ok()
}

/// Written through a rename so that a torn stamp never matches.
fn write_stamp(dir: &Path, text: &str) -> Result<()> {
    let staging = dir.join(format!("{STAMP_FILE}.tmp"));
    fs::write(&staging, text).with_context(|| format!("writing {}", staging.display()))?;
    fs::rename(&staging, dir.join(STAMP_FILE))
        .with_context(|| format!("writing the stamp in {}", dir.display()))
}

fn bpf_linker_version(linker: &Path) -> Result<String> {
    let out = cmd::stdout(Command::new(linker).arg("--version"))
        .with_context(|| format!("running `{} --version`", linker.display()))?;
    Ok(out.trim().to_owned())
}

/// Builds bpf-linker into `bpf-linker-<version>-<rustc hash>/`, or reuses it there.
fn ensure_bpf_linker(cache: &Path, rustc: &Rustc, opts: &PrepareOptions) -> Result<PathBuf> {
    let dir = cache.join(format!(
        "bpf-linker-{BPF_LINKER_VERSION}-{}",
        rustc.hash12()
    ));
    let linker = dir.join("bin/bpf-linker");
    let wanted_version = format!("bpf-linker {BPF_LINKER_VERSION}");
    let stamp = stamp_text(rustc, &wanted_version);

    if !opts.force && bpf_linker_version(&linker).is_ok_and(|v| v == wanted_version) {
        match read_stamp(&dir) {
            Some(found) if found == stamp => return Ok(linker),
            // `cargo install` copies the binary only after a successful build, so a working
            // binary without a stamp is a finished manual install of the same command: adopt it.
            None => {
                write_stamp(&dir, &stamp)?;
                return Ok(linker);
            }
            Some(_) => {
                eprintln!("the cached bpf-linker was built by another toolchain: rebuilding")
            }
        }
    }

    if find_on_path("cc").is_none() {
        bail!(
            "no C compiler (`cc`), which building bpf-linker needs: install a C compiler \
             (apt-get install gcc), or put a bpf-linker on PATH"
        );
    }
    let libllvm = rustc_libllvm(&rustc.sysroot)?;
    eprintln!(
        "building bpf-linker {BPF_LINKER_VERSION} against rustc's LLVM {} (about a minute)...",
        rustc.llvm_major
    );
    let started = Instant::now();

    // The stamp goes first and comes back last, so an interrupted build is never taken as valid.
    // No staging directory here: the binary's RUNPATH is the absolute path of `llvm/lib` below.
    remove_if_exists(&dir.join(STAMP_FILE))?;
    let llvm_prefix = dir.join("llvm");
    remove_if_exists(&llvm_prefix)?;
    let llvm_lib = llvm_prefix.join("lib");
    fs::create_dir_all(&llvm_lib).with_context(|| format!("creating {}", llvm_lib.display()))?;
    // llvm-sys looks for `libLLVM.so`; the binary then loads libLLVM by its own versioned name.
    let versioned_name = libllvm
        .file_name()
        .expect("a file in rustc's lib directory");
    for name in [OsStr::new("libLLVM.so"), versioned_name] {
        let link = llvm_lib.join(name);
        symlink(&libllvm, &link).with_context(|| format!("linking {}", link.display()))?;
    }

    let mut install = cmd::cargo();
    install
        .args(["install", &format!("bpf-linker@{BPF_LINKER_VERSION}")])
        .args(["--locked", "--force", "--no-default-features", "--features"])
        .arg(format!("llvm-{}", rustc.llvm_major))
        .arg("--root")
        .arg(&dir)
        .env("LLVM_PREFIX", &llvm_prefix)
        // Only silences cargo's "add .../bin to your PATH" advice: xtask calls it by path.
        .env("PATH", path_with(&dir.join("bin")));
    if opts.verbose {
        install.arg("-v");
    }
    clean_cargo_env(&mut install);
    cmd::run_quietly(&mut install).with_context(|| {
        format!(
            "building bpf-linker {BPF_LINKER_VERSION} with LLVM {} failed",
            rustc.llvm_major
        )
    })?;

    let built_version = bpf_linker_version(&linker)?;
    ensure!(
        built_version == wanted_version,
        "the bpf-linker just built reports `{built_version}`, not `{wanted_version}`"
    );
    write_stamp(&dir, &stamp)?;
    eprintln!(
        "bpf-linker ready in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        linker.display()
    );
    Ok(linker)
}

/// rustc's shared libLLVM under its versioned name (`libLLVM.so.<version>-rust-<release>`).
fn rustc_libllvm(sysroot: &Path) -> Result<PathBuf> {
    let lib = sysroot.join("lib");
    let mut candidates: Vec<PathBuf> = fs::read_dir(&lib)
        .with_context(|| format!("reading {}", lib.display()))?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(OsStr::to_str)
                .is_some_and(|name| name.starts_with("libLLVM.so."))
        })
        .collect();
    candidates.sort();
    candidates.into_iter().next().with_context(|| {
        format!(
            "rustc ships no libLLVM.so.* in {} to build bpf-linker against: install bpf-linker \
             yourself (`cargo install bpf-linker`) and put it on PATH",
            lib.display()
        )
    })
}

/// Builds `sysroot-<rustc hash>/` with `core` and `compiler_builtins` for [`BPF_TARGET`],
/// or reuses it; the flag says whether it was built now.
fn ensure_sysroot(
    cache: &Path,
    rustc: &Rustc,
    linker_version: &str,
    opts: &PrepareOptions,
) -> Result<(PathBuf, bool)> {
    let sysroot = cache.join(format!("sysroot-{}", rustc.hash12()));
    let stamp = stamp_text(rustc, linker_version);
    if !opts.force && read_stamp(&sysroot).is_some_and(|found| found == stamp) {
        return Ok((sysroot, false));
    }

    eprintln!("building core for {BPF_TARGET} from rust-docs' source pages (about 15 s)...");
    let started = Instant::now();
    // Built in a staging directory and renamed into place whole, stamp included.
    let staging_prefix = format!(".sysroot-{}.tmp-", rustc.hash12());
    remove_stale_staging(cache, &staging_prefix)?;
    let staging = cache.join(format!("{staging_prefix}{}", process::id()));
    let src = staging.join("src");
    let summary = core_pages::extract(&rustc.core_pages_dir(), &src)
        .context("rebuilding core's sources from rust-docs")?;
    eprintln!(
        "  extracted {} source files ({} lines), {} placeholder include files",
        summary.files,
        summary.lines,
        summary.placeholders.len()
    );
    if opts.verbose {
        for placeholder in &summary.placeholders {
            eprintln!("  placeholder: {}", placeholder.display());
        }
    }

    compile_sysroot_crate(
        rustc,
        &staging,
        "core",
        &src.join("library/core/src/lib.rs"),
    )?;
    let builtins = src.join("compiler_builtins/lib.rs");
    fs::create_dir_all(builtins.parent().expect("a file path"))?;
    fs::write(&builtins, COMPILER_BUILTINS_STUB)
        .with_context(|| format!("writing {}", builtins.display()))?;
    compile_sysroot_crate(rustc, &staging, "compiler_builtins", &builtins)?;

    write_stamp(&staging, &stamp)?;
    remove_if_exists(&sysroot)?;
    fs::rename(&staging, &sysroot)
        .with_context(|| format!("moving the new sysroot to {}", sysroot.display()))?;
    eprintln!(
        "core sysroot ready in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        sysroot.display()
    );
    Ok((sysroot, true))
}

/// rustc links `compiler_builtins` into every `no_std` crate; BPF has no libcalls to put in it,
/// and crates.io's compiler_builtins does not build against this core.
const COMPILER_BUILTINS_STUB: &str = "\
//! Empty stand-in: BPF has no libcalls, and aya-ebpf defines memcpy, memset and memmove.
#![feature(compiler_builtins)]
#![expect(internal_features, reason = \"compiler_builtins is the one crate meant to use it\")]
#![compiler_builtins]
#![no_builtins]
#![no_std]
";

/// Compiles one sysroot crate with the flags cargo's `-Z build-std` would use for it.
fn compile_sysroot_crate(rustc: &Rustc, sysroot: &Path, name: &str, lib_rs: &Path) -> Result<()> {
    let out_dir = sysroot.join("lib/rustlib").join(BPF_TARGET).join("lib");
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    // Debug info names sources as rustc's own std does, not by the staging path that is renamed.
    let mut remap = OsString::from(sysroot.join("src"));
    remap.push(format!("=/rustc/{}", rustc.commit_hash));
    let mut rustc_command = Command::new(&rustc.program);
    rustc_command
        .args([
            "--crate-name",
            name,
            "--edition=2024",
            "--crate-type",
            "lib",
        ])
        .args(["--target", BPF_TARGET])
        .args([
            "-C",
            "opt-level=3",
            "-C",
            "panic=abort",
            "-C",
            "embed-bitcode=yes",
        ])
        .args(["-C", "debuginfo=2", "-Z", "force-unstable-if-unmarked"])
        .arg("--sysroot")
        .arg(sysroot)
        .arg("--remap-path-prefix")
        .arg(remap)
        .arg(lib_rs)
        .arg("--out-dir")
        .arg(&out_dir)
        .env("RUSTC_BOOTSTRAP", "1");
    cmd::run_quietly(&mut rustc_command)
        .with_context(|| format!("compiling {name} for {BPF_TARGET} failed"))
}

/// Removes staging directories left by interrupted runs (the cache lock is held).
fn remove_stale_staging(cache: &Path, prefix: &str) -> Result<()> {
    for entry in fs::read_dir(cache).with_context(|| format!("reading {}", cache.display()))? {
        let path = entry?.path();
        if path
            .file_name()
            .and_then(OsStr::to_str)
            .is_some_and(|name| name.starts_with(prefix))
        {
            remove_if_exists(&path)?;
        }
    }
    Ok(())
}

fn remove_if_exists(path: &Path) -> Result<()> {
    let result = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    result.with_context(|| format!("removing {}", path.display()))
}

/// Drops inherited settings that would replace or wrap the flags set here.
pub fn clean_cargo_env(cmd: &mut Command) {
    const INHERITED: &[&str] = &[
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_RUSTC_WRAPPER",
        "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
    ];
    for name in INHERITED {
        cmd.env_remove(name);
    }
    let bpf_target_prefix = format!(
        "CARGO_TARGET_{}_",
        BPF_TARGET.to_uppercase().replace('-', "_")
    );
    for (name, _) in env::vars_os() {
        if name
            .to_str()
            .is_some_and(|name| name.starts_with(&bpf_target_prefix))
        {
            cmd.env_remove(name);
        }
    }
}

/// `PATH` with `dir` in front.
fn path_with(dir: &Path) -> OsString {
    let inherited = env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(dir.to_path_buf()).chain(env::split_paths(&inherited));
    env::join_paths(dirs).unwrap_or(inherited)
}

pub fn find_on_path(program: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| {
            fs::metadata(path)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}
