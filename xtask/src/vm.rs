//! `cargo xtask vm-test`: the root tests on a second kernel, Debian's 6.1 cloud kernel, which
//! (unlike the 6.18 kernel of our machines) has kprobes but no `uprobe_multi`.
//!
//! The host root is exported read-only into a QEMU (TCG) guest through virtiofs, so the test
//! binaries, cudatrace, gcc and the sources sit at the same absolute paths as on the host; an
//! overlay with a tmpfs upper layer takes the guest's writes, which never reach the host. The
//! guest's test output comes back on a second serial port. docs/vm-test.md has the details.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::fs;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    cmd::{self, run},
    ebpf,
};

/// Test targets of the `cudatrace` package run in the guest, in this order: those whose
/// paths differ on 6.1 (per-symbol perf links instead of uprobe_multi, host-wide probes,
/// kprobes, the 6.1 verifier on every program). A name whose test target does not exist
/// (yet) is skipped with a note. [`HOST_ONLY`] are not run there.
pub const TEST_TARGETS: &[&str] = &[
    "selftest",
    "run",
    "run_modes",
    "functions",
    "discovery",
    "kernel_hooks",
    "doctor",
    "gpu_transport",
];

/// Test targets run on the host only, with the reason. The guest has 900 s and all of them
/// took about 950 s on the loaded build machine; these exercise what no kernel changes.
pub const HOST_ONLY: &[(&str, &str)] = &[
    (
        "fidelity",
        "string and argument decoding; its probes load in every guest run",
    ),
    (
        "limits",
        "map-full counting, the same eBPF on every kernel (gpu_transport and run load it)",
    ),
    (
        "gpu_run",
        "GPU records linked in userspace; their transport is gpu_transport's",
    ),
    ("signals", "its 1 s bound is for real hardware, not TCG"),
];

/// Tests left out in the guest (libtest `--skip`) unless `--no-skip`, with the reason. None is
/// a difference of 6.1: the guest is much slower than the host (gcc about 40 times), which
/// turns timing assumptions and small races into failures. Remove an entry once its cause is fixed;
/// docs/vm-test.md lists them.
pub const SKIPPED: &[(&str, &str)] = &[];

/// Kernel arguments: expedited RCU grace periods make each uprobe attach and detach (a grace
/// period apiece on 6.1) about 40% faster under TCG.
const KERNEL_ARGS: &str = "console=ttyS0 quiet panic=-1 rcupdate.rcu_expedited=1";

/// Debian packages installed when missing.
const PACKAGES: &[&str] = &["qemu-system-x86", "busybox-static"];
/// The kernel package: `linux-image-6.1.0-<abi>-cloud-amd64`, the highest ABI available.
const KERNEL_PREFIX: &str = "linux-image-6.1.0-";
const KERNEL_SUFFIX: &str = "-cloud-amd64";
/// The guest's modules for virtiofs and overlayfs (the cloud kernel has no 9p); their
/// dependencies are added from each module's `depends=`.
const GUEST_MODULES: &[&str] = &["virtio_pci", "virtiofs", "overlay"];

const QEMU: &str = "qemu-system-x86_64";
/// QEMU 7.2's virtiofsd (package qemu-system-common).
const VIRTIOFSD: &str = "/usr/lib/qemu/virtiofsd";
/// busybox-static's binary.
const BUSYBOX: &str = "/bin/busybox";
/// The virtiofs tag of the host root.
const ROOT_TAG: &str = "hostroot";
/// The line the guest ends its results with.
const EXIT_MARK: &str = "VMTEST-EXIT";

#[derive(clap::Args, Debug, Clone)]
pub struct VmTestOptions {
    /// Run only the tests whose names contain this (passed to the test binaries).
    #[arg(long)]
    pub filter: Option<String>,
    /// Kill the guest after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Guest CPUs.
    #[arg(long, default_value_t = 2)]
    pub cpus: u32,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 2048)]
    pub memory: u32,
    /// Extra kernel command line arguments.
    #[arg(long, default_value = "")]
    pub append: String,
    /// Also run the tests that SKIPPED leaves out (races and timing assumptions under TCG).
    #[arg(long)]
    pub no_skip: bool,
    /// Run this shell command in the guest (in the workspace root) instead of the tests.
    #[arg(long)]
    pub exec: Option<String>,
}

impl Default for VmTestOptions {
    /// The same values as the command line's defaults.
    fn default() -> Self {
        VmTestOptions {
            filter: None,
            timeout: 900,
            cpus: 2,
            memory: 2048,
            append: String::new(),
            no_skip: false,
            exec: None,
        }
    }
}

/// An unpacked kernel package.
struct Kernel {
    package: String,
    vmlinuz: PathBuf,
    /// `lib/modules/<release>`.
    modules: PathBuf,
}

/// One test executable and the directory cargo would run it in.
struct TestBinary {
    name: String,
    exe: PathBuf,
    cwd: PathBuf,
}

pub fn vm_test(opts: &VmTestOptions) -> Result<()> {
    let start = Instant::now();
    ensure!(
        cmd::is_root(),
        "vm-test runs virtiofsd and root tests: run `sudo -E cargo xtask vm-test`"
    );
    let root = cmd::workspace_root();
    let vm_dir = root.join("target/vm");
    fs::create_dir_all(&vm_dir).with_context(|| format!("creating {}", vm_dir.display()))?;
    let _lock = lock(&vm_dir.join("lock"))?;

    ensure_packages()?;
    let kernel = kernel(&vm_dir)?;
    ebpf::build_ebpf(&ebpf::BuildEbpfOptions::default())?;
    let tests = build_tests(&root)?;
    ensure!(!tests.is_empty(), "no test binary to run");

    if !opts.no_skip && opts.exec.is_none() {
        for (name, why) in SKIPPED {
            eprintln!("xtask: vm-test: skipping {name}: {why} (--no-skip runs it)");
        }
    }
    if opts.exec.is_none() {
        for (name, why) in HOST_ONLY {
            eprintln!("xtask: vm-test: {name} runs on the host only: {why}");
        }
    }
    let modules = guest_modules(&kernel.modules, GUEST_MODULES)?;
    let initramfs = vm_dir.join("initramfs.cpio");
    write_initramfs(&initramfs, &modules, &guest_script(&root, &tests, opts))?;
    eprintln!(
        "xtask: vm-test: booting {} with {} test binaries (prepared in {:.1} s)",
        kernel.package,
        tests.len(),
        start.elapsed().as_secs_f64()
    );
    let outcome = boot(&vm_dir, &kernel, &initramfs, opts)?;

    let summary = Summary::of(&outcome.results);
    eprintln!(
        "xtask: vm-test: {} in {:.1} s (guest {:.1} s, first output after {:.1} s)",
        kernel.package,
        start.elapsed().as_secs_f64(),
        outcome.guest_time.as_secs_f64(),
        outcome.first_output.map_or(f64::NAN, |d| d.as_secs_f64()),
    );
    for failure in &summary.failed_names {
        eprintln!("xtask: vm-test: FAILED {failure}");
    }
    println!(
        "vm-test: {} passed, {} failed",
        summary.passed, summary.failed
    );
    match outcome.exit {
        Some(0) if summary.failed == 0 => Ok(()),
        Some(code) => {
            print_tail(&vm_dir.join("console.log"), 30);
            bail!(
                "tests failed in the guest ({} failed, {code} failing binaries); guest console: \
                 target/vm/console.log",
                summary.failed
            )
        }
        None => {
            print_tail(&vm_dir.join("console.log"), 60);
            bail!(
                "the guest did not report an exit status ({}); guest console: target/vm/console.log",
                if outcome.timed_out {
                    format!("killed after {} s", opts.timeout)
                } else {
                    "qemu exited".to_owned()
                }
            )
        }
    }
}

/// Holds an exclusive lock on `path` (one vm-test at a time in a checkout: they share
/// target/vm) until the file is dropped.
fn lock(path: &Path) -> Result<fs::File> {
    use std::os::fd::AsRawFd;
    let file = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!("xtask: vm-test: waiting for another vm-test in this checkout");
        // SAFETY: as above.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        ensure!(
            rc == 0,
            "locking {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(file)
}

// ---------------------------------------------------------------------------------------
// Debian packages and the kernel

static APT_UPDATED: AtomicBool = AtomicBool::new(false);

fn apt_update() -> Result<()> {
    if !APT_UPDATED.swap(true, Ordering::SeqCst) {
        run(
            Command::new("apt-get").args(["update", "-q"]),
            "apt-get update",
        )?;
    }
    Ok(())
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && o.stdout.ends_with(b" installed"))
}

/// Installs qemu and busybox-static with apt-get where they are missing.
fn ensure_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        apt_update()?;
        run(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
            &format!("apt-get install {}", missing.join(" ")),
        )?;
    }
    ensure!(
        Path::new(VIRTIOFSD).is_file(),
        "{VIRTIOFSD} not found (package qemu-system-common)"
    );
    Ok(())
}

/// The ABI number of a kernel package name, e.g. 56 for linux-image-6.1.0-56-cloud-amd64.
fn kernel_abi(package: &str) -> Option<u32> {
    package
        .strip_prefix(KERNEL_PREFIX)?
        .strip_suffix(KERNEL_SUFFIX)?
        .parse()
        .ok()
}

/// The unpacked kernel under target/vm/kernel/, downloaded and unpacked first if absent.
fn kernel(vm_dir: &Path) -> Result<Kernel> {
    let cache = vm_dir.join("kernel");
    if let Some(kernel) = cached_kernel(&cache)? {
        return Ok(kernel);
    }
    // Stale package lists name packages the mirror no longer has: update and try again.
    for _ in 0..2 {
        for package in kernel_packages()? {
            if download_kernel(vm_dir, &package)? {
                return cached_kernel(&cache)?
                    .context("the unpacked kernel package has no vmlinuz");
            }
        }
        if APT_UPDATED.load(Ordering::SeqCst) {
            break;
        }
        apt_update()?;
    }
    bail!("no {KERNEL_PREFIX}*{KERNEL_SUFFIX} package could be found and downloaded")
}

/// `apt-get download`s `package` and unpacks it into target/vm/kernel/PACKAGE; false when
/// it cannot be downloaded.
fn download_kernel(vm_dir: &Path, package: &str) -> Result<bool> {
    let download = vm_dir.join("download");
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download)?;
    eprintln!("xtask: vm-test: apt-get download {package}");
    let status = Command::new("apt-get")
        .args(["download", "-q", package])
        .current_dir(&download)
        .status()
        .context("running apt-get download")?;
    if !status.success() {
        eprintln!("xtask: vm-test: {package} could not be downloaded");
        return Ok(false);
    }
    let deb = fs::read_dir(&download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .with_context(|| format!("apt-get download left no .deb for {package}"))?;
    let cache = vm_dir.join("kernel");
    let partial = cache.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial)?;
    run(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial),
        &format!("dpkg-deb -x {}", deb.display()),
    )?;
    fs::rename(&partial, cache.join(package))?;
    fs::remove_dir_all(&download)?;
    Ok(true)
}

/// Matching package names known to apt, highest ABI first.
fn kernel_packages() -> Result<Vec<String>> {
    let output = Command::new("apt-cache")
        .args(["search", "--names-only", "^linux-image-6\\.1\\.0-"])
        .output()
        .context("running apt-cache search")?;
    ensure!(output.status.success(), "apt-cache search failed");
    let mut names: Vec<(u32, String)> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|name| Some((kernel_abi(name)?, name.to_owned())))
        .collect();
    names.sort_unstable_by(|a, b| b.cmp(a));
    names.dedup();
    Ok(names.into_iter().map(|(_, name)| name).collect())
}

/// The highest-ABI kernel already unpacked in `cache`.
fn cached_kernel(cache: &Path) -> Result<Option<Kernel>> {
    let Ok(entries) = fs::read_dir(cache) else {
        return Ok(None);
    };
    let best = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            Some((kernel_abi(&name)?, name))
        })
        .max();
    let Some((_, package)) = best else {
        return Ok(None);
    };
    let dir = cache.join(&package);
    let single = |sub: &str, prefix: &str| -> Result<PathBuf> {
        fs::read_dir(dir.join(sub))
            .with_context(|| format!("reading {}", dir.join(sub).display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .with_context(|| format!("no {sub}/{prefix}* in {}", dir.display()))
    };
    Ok(Some(Kernel {
        vmlinuz: single("boot", "vmlinuz-")?,
        modules: single("lib/modules", "6.1.")?,
        package,
    }))
}

// ---------------------------------------------------------------------------------------
// Guest modules

/// `wanted` and their dependencies as (name, uncompressed .ko), dependencies first; built-in
/// ones are left out.
fn guest_modules(modules: &Path, wanted: &[&str]) -> Result<Vec<(String, Vec<u8>)>> {
    let mut files = HashMap::new();
    index_modules(&modules.join("kernel"), &mut files)?;
    let builtin: BTreeSet<String> = fs::read_to_string(modules.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| module_name(Path::new(l)))
        .collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for name in wanted {
        add_module(name, &files, &builtin, &mut seen, &mut order)?;
    }
    Ok(order)
}

fn add_module(
    name: &str,
    files: &HashMap<String, PathBuf>,
    builtin: &BTreeSet<String>,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<(String, Vec<u8>)>,
) -> Result<()> {
    if !seen.insert(name.to_owned()) || builtin.contains(name) {
        return Ok(());
    }
    let path = files
        .get(name)
        .with_context(|| format!("kernel module {name} is neither a file nor built in"))?;
    let ko = read_module(path)?;
    for dep in depends(&ko) {
        add_module(&dep, files, builtin, seen, order)?;
    }
    order.push((name.to_owned(), ko));
    Ok(())
}

/// The module name of `.../name.ko[.xz|.zst|.gz]`, with dashes as underscores.
fn module_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))?;
    Some(stem.replace('-', "_"))
}

fn index_modules(dir: &Path, files: &mut HashMap<String, PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            index_modules(&path, files)?;
        } else if let Some(name) = module_name(&path) {
            files.insert(name, path);
        }
    }
    Ok(())
}

/// A module's bytes, decompressed with xz, zstd or gzip where the kernel package compresses
/// them (Debian's 6.1 does not).
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = [(".xz", "xz"), (".zst", "zstd"), (".gz", "gzip")]
        .into_iter()
        .find_map(|(ext, tool)| name.ends_with(ext).then_some(tool));
    let Some(tool) = tool else {
        return fs::read(path).with_context(|| format!("reading {name}"));
    };
    let output = Command::new(tool)
        .arg("-dc")
        .arg(path)
        .output()
        .with_context(|| format!("running {tool} to decompress {name}"))?;
    ensure!(output.status.success(), "{tool} -dc {name} failed");
    Ok(output.stdout)
}

/// The `depends=` entry of a module's `.modinfo` strings.
fn depends(ko: &[u8]) -> Vec<String> {
    const KEY: &[u8] = b"\0depends=";
    let Some(at) = ko.windows(KEY.len()).position(|w| w == KEY) else {
        return Vec::new();
    };
    let value = &ko[at + KEY.len()..];
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end])
        .split(',')
        .filter(|d| !d.is_empty())
        .map(|d| d.replace('-', "_"))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Test binaries and the guest's scripts

fn build_tests(root: &Path) -> Result<Vec<TestBinary>> {
    eprintln!("xtask: vm-test: cargo test -p cudatrace --no-run");
    let mut child = cmd::cargo()
        .args([
            "test",
            "-p",
            "cudatrace",
            "--tests",
            "--no-run",
            "--locked",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(root)
        .stdout(Stdio::piped())
        .spawn()
        .context("starting cargo test --no-run")?;
    let mut found: HashMap<String, TestBinary> = HashMap::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let message: serde_json::Value = match serde_json::from_str(&line?) {
            Ok(v) => v,
            Err(_) => continue,
        };
        let target = &message["target"];
        let (Some(name), Some(exe), Some(manifest)) = (
            target["name"].as_str(),
            message["executable"].as_str(),
            message["manifest_path"].as_str(),
        ) else {
            continue;
        };
        let is_test = target["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "test"));
        if is_test && TEST_TARGETS.contains(&name) {
            found.insert(
                name.to_owned(),
                TestBinary {
                    name: name.to_owned(),
                    exe: exe.into(),
                    cwd: Path::new(manifest)
                        .parent()
                        .context("manifest path")?
                        .into(),
                },
            );
        }
    }
    let status = child.wait()?;
    ensure!(status.success(), "cargo test --no-run failed ({status})");
    let mut tests = Vec::new();
    for name in TEST_TARGETS {
        match found.remove(*name) {
            Some(test) => tests.push(test),
            None => eprintln!("xtask: vm-test: no test target {name} in cudatrace: skipped"),
        }
    }
    Ok(tests)
}

/// Single-quotes `s` for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// What the guest runs in its new root (the host's files, writes in memory). Its output goes
/// to the results port; the exit status is the number of failed test binaries.
fn guest_script(root: &Path, tests: &[TestBinary], opts: &VmTestOptions) -> String {
    let mut s = String::from(
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         export HOME=/root RUST_BACKTRACE=1 LANG=C.UTF-8\n\
         # --report-time is unstable in libtest: RUSTC_BOOTSTRAP lets a stable build print it.\n\
         export RUSTC_BOOTSTRAP=1\n\
         echo \"vm-test: guest $(uname -r) up after $(cut -d' ' -f1 /proc/uptime) s, $(nproc) cpus\"\n\
         failed=0\n",
    );
    if let Some(command) = &opts.exec {
        let _ = writeln!(
            s,
            "cd {} && sh -c {} || failed=$?",
            quote(&root.to_string_lossy()),
            quote(command)
        );
    }
    let mut filter = opts.filter.as_deref().map(quote).unwrap_or_default();
    for (name, _) in SKIPPED.iter().filter(|_| !opts.no_skip) {
        let _ = write!(filter, " --skip {}", quote(name));
    }
    for test in tests.iter().filter(|_| opts.exec.is_none()) {
        let _ = write!(
            s,
            "echo \"vm-test: === {name}\"\n\
             t0=$(cut -d' ' -f1 /proc/uptime)\n\
             (cd {cwd} && {exe} --test-threads=1 --color never -Z unstable-options --report-time {filter}) \
             || failed=$((failed + 1))\n\
             echo \"vm-test: === {name} took $(awk -v t0=$t0 '{{print $1 - t0}}' /proc/uptime) s\"\n",
            name = test.name,
            cwd = quote(&test.cwd.to_string_lossy()),
            exe = quote(&test.exe.to_string_lossy()),
        );
    }
    s.push_str("exit $failed\n");
    s
}

/// The guest's /init: modules, the read-only host root under an overlay, the kernel's
/// filesystems, then the test script chrooted into it.
fn init_script(modules: &[String]) -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The results port: raw, so the output arrives as written.
stty -F /dev/ttyS1 raw -echo 2>/dev/null
exec 3>/dev/ttyS1
die() {{ echo "vm-test: guest setup failed: $*" >&3; echo "{mark} 125" >&3; poweroff -f; }}
for m in {modules}; do insmod /lib/modules/$m.ko || die "insmod $m"; done
mkdir -p /lower /rw /newroot
mount -t virtiofs -o ro {tag} /lower || die "mount virtiofs {tag}"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot \
    || die "mount overlay"
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
mount -t tracefs tracefs /newroot/sys/kernel/tracing || die "mount tracefs"
mount -t debugfs debugfs /newroot/sys/kernel/debug
mount -t bpf bpf /newroot/sys/fs/bpf
# /tmp and the rest stay the host's, writable through the overlay: a checkout under /tmp works.
cp /vm-test.sh /newroot/.cudatrace-vm-test.sh
setsid chroot /newroot /bin/sh /.cudatrace-vm-test.sh >&3 2>&1
echo "{mark} $?" >&3
poweroff -f
"#,
        mark = EXIT_MARK,
        tag = ROOT_TAG,
        modules = modules.join(" "),
    )
}

// ---------------------------------------------------------------------------------------
// The initramfs: an uncompressed newc cpio archive

struct Cpio<W: Write> {
    out: W,
    ino: u32,
}

impl<W: Write> Cpio<W> {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) -> Result<()> {
        self.ino += 1;
        let mut writer = cpio::newc::Builder::new(name)
            .ino(self.ino)
            .mode(mode)
            .nlink(if mode & 0o170000 == 0o040000 { 2 } else { 1 })
            .rdev_major(rdev.0)
            .rdev_minor(rdev.1)
            .write(&mut self.out, u32::try_from(data.len())?);
        writer.write_all(data)?;
        writer.finish()?;
        Ok(())
    }

    fn dir(&mut self, name: &str) -> Result<()> {
        self.entry(name, 0o040755, &[], (0, 0))
    }

    fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        self.entry(name, 0o100000 | mode, data, (0, 0))
    }

    fn finish(mut self) -> Result<W> {
        cpio::newc::trailer(&mut self.out)?;
        Ok(self.out)
    }
}

fn write_initramfs(path: &Path, modules: &[(String, Vec<u8>)], script: &str) -> Result<()> {
    let busybox = fs::read(BUSYBOX).with_context(|| format!("reading {BUSYBOX}"))?;
    let file = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut cpio = Cpio {
        out: std::io::BufWriter::new(file),
        ino: 0,
    };
    for dir in ["bin", "dev", "proc", "sys", "lib", "lib/modules"] {
        cpio.dir(dir)?;
    }
    // The kernel opens /dev/console for init before devtmpfs is mounted.
    cpio.entry("dev/console", 0o020600, &[], (5, 1))?;
    cpio.file("bin/busybox", 0o755, &busybox)?;
    for (name, ko) in modules {
        cpio.file(&format!("lib/modules/{name}.ko"), 0o644, ko)?;
    }
    let names: Vec<String> = modules.iter().map(|(n, _)| n.clone()).collect();
    cpio.file("init", 0o755, init_script(&names).as_bytes())?;
    cpio.file("vm-test.sh", 0o644, script.as_bytes())?;
    cpio.finish()?.flush()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Booting

/// A child process killed (and reaped) when dropped, and by the kernel if xtask dies.
struct Reaped(Child);

impl Reaped {
    fn spawn(command: &mut Command, what: &str) -> Result<Self> {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        Ok(Self(
            command
                .spawn()
                .with_context(|| format!("starting {what}"))?,
        ))
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Outcome {
    /// The guest's exit mark: the number of failed test binaries, 125 for a setup failure.
    exit: Option<i32>,
    timed_out: bool,
    results: String,
    guest_time: Duration,
    first_output: Option<Duration>,
}

fn boot(vm_dir: &Path, kernel: &Kernel, initramfs: &Path, opts: &VmTestOptions) -> Result<Outcome> {
    let socket = vm_dir.join("virtiofsd.sock");
    let results_path = vm_dir.join("results.log");
    let console = vm_dir.join("console.log");
    for stale in [&socket, &results_path, &console] {
        let _ = fs::remove_file(stale);
    }
    let log = |name: &str| -> Result<(Stdio, Stdio)> {
        let file = fs::File::create(vm_dir.join(name))?;
        Ok((file.try_clone()?.into(), file.into()))
    };
    let (virtiofsd_out, virtiofsd_err) = log("virtiofsd.log")?;
    let (qemu_out, qemu_err) = log("qemu.log")?;

    // The guest mounts this read-only and puts an overlay on it; it has no write path back.
    // The default sandbox pivot_roots into the source, which fails (EBUSY) for "/".
    let _virtiofsd = Reaped::spawn(
        Command::new(VIRTIOFSD)
            .arg(format!("--socket-path={}", socket.display()))
            .args(["-o", "source=/,sandbox=chroot,cache=always"])
            .stdin(Stdio::null())
            .stdout(virtiofsd_out)
            .stderr(virtiofsd_err),
        VIRTIOFSD,
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        ensure!(
            Instant::now() < deadline,
            "virtiofsd made no socket: see target/vm/virtiofsd.log"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let memory = format!("{}M", opts.memory);
    let mut append = String::from(KERNEL_ARGS);
    if !opts.append.is_empty() {
        append.push(' ');
        append.push_str(&opts.append);
    }
    let started = Instant::now();
    let mut qemu = Reaped::spawn(
        Command::new(QEMU)
            .args([
                "-accel",
                "tcg",
                "-cpu",
                "max",
                "-smp",
                &opts.cpus.to_string(),
            ])
            .args([
                "-m",
                &memory,
                "-nodefaults",
                "-no-user-config",
                "-no-reboot",
            ])
            .args(["-display", "none", "-monitor", "none"])
            // virtiofs needs the guest's memory shared with virtiofsd.
            .arg("-object")
            .arg(format!(
                "memory-backend-memfd,id=mem,size={memory},share=on"
            ))
            .args(["-numa", "node,memdev=mem"])
            .arg("-chardev")
            .arg(format!("socket,id=vfs,path={}", socket.display()))
            .arg("-device")
            .arg(format!(
                "vhost-user-fs-pci,chardev=vfs,tag={ROOT_TAG},queue-size=1024"
            ))
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-serial")
            .arg(format!("file:{}", results_path.display()))
            .arg("-kernel")
            .arg(&kernel.vmlinuz)
            .arg("-initrd")
            .arg(initramfs)
            .args(["-append", &append])
            .stdin(Stdio::null())
            .stdout(qemu_out)
            .stderr(qemu_err),
        QEMU,
    )?;

    // Follow the results port, printing whole lines as they come.
    let deadline = started + Duration::from_secs(opts.timeout);
    let mut results = String::new();
    let mut printed = 0;
    let mut offset = 0;
    let mut first_output = None;
    let mut timed_out = false;
    loop {
        let exited = qemu.0.try_wait()?.is_some();
        if let Ok(mut file) = fs::File::open(&results_path) {
            file.seek(SeekFrom::Start(offset))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            offset += bytes.len() as u64;
            if !bytes.is_empty() && first_output.is_none() {
                first_output = Some(started.elapsed());
            }
            results.push_str(&String::from_utf8_lossy(&bytes).replace('\r', ""));
        }
        let complete = if exited {
            results.len()
        } else {
            results.rfind('\n').map_or(0, |i| i + 1)
        };
        if complete > printed {
            print!("{}", &results[printed..complete]);
            std::io::stdout().flush()?;
            printed = complete;
        }
        if exited {
            break;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            eprintln!(
                "xtask: vm-test: timeout after {} s: killing qemu",
                opts.timeout
            );
            let _ = qemu.0.kill();
            let _ = qemu.0.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let guest_time = started.elapsed();
    let exit = results
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(EXIT_MARK))
        .and_then(|code| code.trim().parse().ok());
    Ok(Outcome {
        exit,
        timed_out,
        results,
        guest_time,
        first_output,
    })
}

/// Counts from libtest's `test result:` lines, and the names in its closing `failures:` lists.
struct Summary {
    passed: u64,
    failed: u64,
    failed_names: Vec<String>,
}

impl Summary {
    fn of(results: &str) -> Self {
        let mut summary = Summary {
            passed: 0,
            failed: 0,
            failed_names: Vec::new(),
        };
        let mut binary = "";
        // The names after the last `failures:` line: libtest lists the failed tests there,
        // indented, just before `test result:` (an earlier `failures:` holds their output).
        let mut listed: Vec<String> = Vec::new();
        for line in results.lines() {
            if let Some(name) = line.strip_prefix("vm-test: === ") {
                if !name.contains(" took ") {
                    binary = name;
                }
            } else if line == "failures:" {
                listed.clear();
            } else if let Some(name) = line.strip_prefix("    ") {
                if !name.is_empty() && !name.contains(char::is_whitespace) {
                    listed.push(format!("{binary}: {name}"));
                }
            } else if let Some(counts) = line.strip_prefix("test result: ") {
                let count = |what: &str| -> u64 {
                    counts
                        .split(';')
                        .filter_map(|part| {
                            part.trim()
                                .trim_start_matches(|c: char| !c.is_ascii_digit())
                                .strip_suffix(what)
                        })
                        .find_map(|n| n.trim().parse().ok())
                        .unwrap_or(0)
                };
                summary.passed += count("passed");
                let failed = count("failed");
                summary.failed += failed;
                if failed > 0 {
                    summary.failed_names.append(&mut listed);
                }
                listed.clear();
            }
        }
        summary
    }
}

fn print_tail(path: &Path, lines: usize) {
    let Ok(text) = fs::read_to_string(path) else {
        return;
    };
    let all: Vec<&str> = text.lines().collect();
    eprintln!("--- last lines of {} ---", path.display());
    for line in &all[all.len().saturating_sub(lines)..] {
        eprintln!("{}", line.trim_end_matches('\r'));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_abi_reads_only_cloud_6_1_images() {
        assert_eq!(kernel_abi("linux-image-6.1.0-56-cloud-amd64"), Some(56));
        assert_eq!(kernel_abi("linux-image-6.1.0-56-amd64"), None);
        assert_eq!(kernel_abi("linux-image-6.1.0-56-cloud-amd64-dbg"), None);
        assert_eq!(kernel_abi("linux-image-6.12.0-1-cloud-amd64"), None);
    }

    #[test]
    fn depends_reads_the_modinfo_entry() {
        let ko = b"\x7fELF...\0license=GPL\0depends=virtio_ring,virtio-pci-modern-dev\0name=x\0";
        assert_eq!(depends(ko), ["virtio_ring", "virtio_pci_modern_dev"]);
        assert_eq!(depends(b"\0depends=\0"), Vec::<String>::new());
    }

    #[test]
    fn summary_counts_libtest_lines() {
        let results = "vm-test: === selftest\ntest result: ok. 1 passed; 0 failed; 0 ignored\n\
                       vm-test: === run\ntest a ... ok <1.0s>\ntest b ... noise\nFAILED <2.0s>\n\
                       failures:\n\n---- b stdout ----\n    at x.rs:1\n\nfailures:\n    b\n\n\
                       test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured\n\
                       vm-test: === run took 3 s\n";
        let s = Summary::of(results);
        assert_eq!((s.passed, s.failed), (2, 1));
        assert_eq!(s.failed_names, ["run: b"]);
    }

    #[test]
    fn quote_survives_single_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
