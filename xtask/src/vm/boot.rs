//! Booting the guest under QEMU with virtiofsd, and reading its results back.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use super::{
    Accel, Arch, EXIT_MARK, KERNEL_ARGS, Kernel, Share, VIRTIOFSD, VmTestOptions, qemu::Qemu,
};

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

pub(super) struct Outcome {
    /// The guest's exit mark: the number of failed test binaries, 125 for a setup failure.
    pub(super) exit: Option<i32>,
    pub(super) timed_out: bool,
    pub(super) results: String,
    pub(super) guest_time: Duration,
    pub(super) first_output: Option<Duration>,
}

pub(super) struct Machine<'a> {
    pub(super) qemu: &'a Qemu,
    pub(super) accel: Accel,
    pub(super) arch: Arch,
    /// The folders the guest mounts over virtiofs, each served by a virtiofsd of its own.
    pub(super) shares: Vec<Share>,
    /// The statically linked busybox of the guest's architecture, its initramfs's shell.
    pub(super) busybox: std::path::PathBuf,
    /// Guests of several kernels run at once: each line a guest prints starts with its
    /// kernel's name.
    pub(super) parallel: bool,
}

impl Machine<'_> {
    /// QEMU's board, accelerator and CPU arguments.
    fn cpu_args(&self) -> Vec<&'static str> {
        match (self.arch, self.accel) {
            (Arch::X86_64, accel) => accel.qemu_args().to_vec(),
            (Arch::Arm64, _) => self.arch.tcg_machine().to_vec(),
        }
    }
}

pub(super) fn boot(
    machine: &Machine<'_>,
    vm_dir: &Path,
    kernel: &Kernel,
    initramfs: &Path,
    console: &Path,
    opts: &VmTestOptions,
) -> Result<Outcome> {
    let label = &kernel.label;
    // Every file of a boot is named by its kernel: guests of several kernels run at once.
    let results_path = vm_dir.join(format!("results-{label}.log"));
    for stale in [&results_path, console] {
        let _ = fs::remove_file(stale);
    }
    let log = |name: &str| -> Result<(Stdio, Stdio)> {
        let file = fs::File::create(vm_dir.join(name))?;
        Ok((file.try_clone()?.into(), file.into()))
    };
    let (qemu_out, qemu_err) = log(&format!("qemu-{label}.log"))?;

    // The guest mounts each share read-only and puts an overlay on it; it has no write path
    // back. The default sandbox pivot_roots into the source, which fails (EBUSY) for "/".
    let mut virtiofsds = Vec::new();
    let mut sockets = Vec::new();
    for share in &machine.shares {
        let socket = vm_dir.join(format!("virtiofsd-{label}-{}.sock", share.tag));
        let _ = fs::remove_file(&socket);
        let (out, err) = log(&format!("virtiofsd-{label}-{}.log", share.tag))?;
        virtiofsds.push(Reaped::spawn(
            Command::new(VIRTIOFSD)
                .arg(format!("--socket-path={}", socket.display()))
                .arg("-o")
                .arg(format!(
                    "source={},sandbox=chroot,cache=always",
                    share.source.display()
                ))
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err),
            VIRTIOFSD,
        )?);
        sockets.push((share.tag, socket));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (tag, socket) in &sockets {
        while !socket.exists() {
            ensure!(
                Instant::now() < deadline,
                "virtiofsd made no socket: see target/vm/virtiofsd-{label}-{tag}.log"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut share_args: Vec<String> = Vec::new();
    for (index, (tag, socket)) in sockets.iter().enumerate() {
        share_args.extend([
            "-chardev".to_owned(),
            format!("socket,id=vfs{index},path={}", socket.display()),
            "-device".to_owned(),
            format!("vhost-user-fs-pci,chardev=vfs{index},tag={tag},queue-size=1024"),
        ]);
    }

    let memory = format!("{}M", opts.memory);
    let mut append = format!("console={}0 {KERNEL_ARGS}", machine.arch.serial());
    if !opts.append.is_empty() {
        append.push(' ');
        append.push_str(&opts.append);
    }
    let started = Instant::now();
    let mut qemu = Reaped::spawn(
        Command::new(&machine.qemu.binary)
            .args(
                machine
                    .qemu
                    .firmware
                    .iter()
                    .flat_map(|dir| [std::ffi::OsStr::new("-L"), dir.as_os_str()]),
            )
            .args(machine.cpu_args())
            .args(["-smp", &opts.cpus.to_string()])
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
            .args(&share_args)
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
        &machine.qemu.binary.display().to_string(),
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
            let mut out = std::io::stdout().lock();
            for line in results[printed..complete].split_inclusive('\n') {
                if machine.parallel {
                    write!(out, "[{label}] ")?;
                }
                out.write_all(line.as_bytes())?;
            }
            out.flush()?;
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
pub(super) struct Summary {
    pub(super) passed: u64,
    pub(super) failed: u64,
    pub(super) failed_names: Vec<String>,
    /// Each suite the guest started (`vm-test: === NAME`), in order, with its tests passed.
    pub(super) suites: Vec<(String, u64)>,
}

impl Summary {
    pub(super) fn of(results: &str) -> Self {
        let mut summary = Summary {
            passed: 0,
            failed: 0,
            failed_names: Vec::new(),
            suites: Vec::new(),
        };
        let mut binary = "";
        // The names after the last `failures:` line: libtest lists the failed tests there,
        // indented, just before `test result:` (an earlier `failures:` holds their output).
        let mut listed: Vec<String> = Vec::new();
        for line in results.lines() {
            if let Some(name) = line.strip_prefix("vm-test: === ") {
                if !name.contains(" took ") {
                    binary = name;
                    summary.suites.push((name.trim().to_owned(), 0));
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
                let passed = count("passed");
                summary.passed += passed;
                if let Some(suite) = summary.suites.last_mut() {
                    suite.1 += passed;
                }
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

pub(super) fn print_tail(path: &Path, lines: usize) {
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
}
