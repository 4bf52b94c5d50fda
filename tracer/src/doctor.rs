//! `cudatrace doctor`: what this machine allows, and why. Every check that can be tried
//! is tried for real (a program loaded and attached), not guessed from config files.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Btf, Ebpf, EbpfLoader,
    programs::{FEntry, KProbe, TracePoint, uprobe::UProbeScope},
};
use clap::Args;
use serde::Serialize;

use crate::{
    exit::Failure,
    inject, kernel_hooks, privileges,
    probes::{
        helpers,
        library::{self, Library},
        plan::Plan,
        probe_set::LIBCUDA,
        programs::{CHILD_HOOK_ENV, ChildHook, program},
        tracefs::tracefs,
        uprobe_multi,
    },
    selftest::{SELFTEST_OBJECT, SelftestProbe, Target},
};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The libcuda to check (default: the same search as `run`).
    #[arg(long, value_name = "PATH")]
    pub libcuda: Option<std::path::PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Also say whether `cudatrace run -p PID --gpu` can attach to this process, and why
    /// not (nothing is done to it: its files under /proc are read).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pid: Option<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    /// What was found, or the kernel's reason for refusing.
    pub detail: String,
    /// Whether cudatrace needs this for `run` (without --kernel).
    pub required: bool,
}

fn check(name: &'static str, required: bool, result: Result<String>) -> Check {
    match result {
        Ok(detail) => Check {
            name,
            ok: true,
            detail,
            required,
        },
        Err(error) => Check {
            name,
            ok: false,
            detail: format!("{error:#}"),
            required,
        },
    }
}

/// A function in this binary for the uprobe check to probe.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn cudatrace_doctor_target(a: u64, b: u64) -> u64 {
    std::hint::black_box(a.wrapping_mul(3).wrapping_add(b))
}

/// The file mapped at `address` in this process and the address's offset in it: where a
/// uprobe on the code there attaches. Needs no symbol table, so it works on a stripped
/// binary too.
fn mapped_file_offset(address: u64) -> Result<(PathBuf, u64)> {
    let maps = fs::read_to_string("/proc/self/maps").context("reading /proc/self/maps")?;
    for line in maps.lines() {
        // start-end perms offset dev inode path
        let fields: Vec<&str> = line.splitn(6, ' ').collect();
        let [range, _perms, offset, _dev, _inode, path] = fields[..] else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let hex = |text: &str| u64::from_str_radix(text, 16).ok();
        let (Some(start), Some(end), Some(offset)) = (hex(start), hex(end), hex(offset)) else {
            continue;
        };
        if (start..end).contains(&address) {
            let path = path.trim_start();
            if !path.starts_with('/') {
                bail!("{address:#x} is in {range}, which maps no file ({path:?})");
            }
            return Ok((PathBuf::from(path), address - start + offset));
        }
    }
    bail!("{address:#x} is in no mapping of /proc/self/maps")
}

/// uprobe + uretprobe on this binary, ring buffer, aya-log: the whole data path. The
/// target is found by its address, not its name, so a stripped binary passes too.
fn uprobe_check() -> Result<String> {
    let target = cudatrace_doctor_target as extern "C" fn(u64, u64) -> u64;
    let (exe, offset) = mapped_file_offset(target as usize as u64)?;
    let probe = SelftestProbe::attach(&exe, Target::Offset(offset), UProbeScope::CallingProcess)?;
    for i in 0..3 {
        std::hint::black_box(cudatrace_doctor_target(i, 100 + i));
    }
    let seen = probe.collect()?;
    let counts = (seen.entries.len(), seen.returns.len(), seen.logs.len());
    if counts != (3, 3, 3) {
        return Err(anyhow!(
            "3 calls gave {} entry events, {} return events, {} log lines",
            counts.0,
            counts.1,
            counts.2
        ));
    }
    Ok("3 calls seen at entry and return through the ring buffer; aya-log works".into())
}

fn kprobe_check(bpf: &mut Ebpf) -> Result<String> {
    let program: &mut KProbe = program(bpf, "doctor_kprobe")?;
    program.load()?;
    program.attach("do_sys_openat2", 0).map_err(|e| {
        anyhow!("{e:#}: the kernel has no kprobes (CONFIG_KPROBES unset?); --kernel uses the syscall tracepoints instead")
    })?;
    Ok("attached a kprobe to do_sys_openat2".into())
}

fn fentry_check(bpf: &mut Ebpf) -> Result<String> {
    let btf = Btf::from_sys_fs().context("reading /sys/kernel/btf/vmlinux")?;
    let program: &mut FEntry = program(bpf, "doctor_fentry")?;
    program
        .load("do_sys_openat2", &btf)
        .map_err(|e| anyhow!("{e:#} (cudatrace does not need fentry)"))?;
    program.attach()?;
    Ok("loaded and attached an fentry program on do_sys_openat2".into())
}

fn tracepoint_check(bpf: &mut Ebpf) -> Result<String> {
    let program: &mut TracePoint = program(bpf, "doctor_tracepoint")?;
    program.load()?;
    program.attach("syscalls", "sys_enter_ioctl")?;
    Ok("attached to syscalls:sys_enter_ioctl".into())
}

fn helper_check(helper: helpers::Helper, release: &str) -> Result<String> {
    match helpers::supported(helper) {
        Ok(true) => Ok(format!("{}, for {}", helper.name, helper.needed_by)),
        Ok(false) => Err(anyhow!(helpers::refusal(helper, release))),
        Err(unknown) => Err(anyhow!(unknown)),
    }
}

/// Without cookies `run` still works, by another path: says which.
fn cookie_check(release: &str) -> Result<String> {
    let helper = helpers::ATTACH_COOKIE;
    match helpers::supported(helper) {
        Ok(true) => Ok(format!("{}, for {}", helper.name, helper.needed_by)),
        Ok(false) => Err(anyhow!(
            "kernel {release} lacks the BPF helper {} (Linux {}): run tells its uprobes apart \
             by the address they fire at instead, within the library mappings recorded at mmap",
            helper.name,
            helper.since
        )),
        Err(unknown) => Err(anyhow!(unknown)),
    }
}

/// How a traced process's fork child is caught before its first instruction, where it
/// gets its own probes (`probes::programs::ChildHook`).
fn fork_child_check() -> Result<String> {
    let tracefs = tracefs()?;
    let hook = ChildHook::chosen()?;
    let available = hook.available(&tracefs);
    match hook {
        ChildHook::SyscallExit if available => {
            Ok("caught at its clone's return (syscalls:sys_exit_clone)".into())
        }
        ChildHook::Rseq if available => Ok(
            "caught at its first rseq:rseq_update (arm64's way: a fork child there returns \
             without the syscall exit); a child whose parent registered no restartable \
             sequence (glibc before 2.35) is not, and is counted as lost child_unseen"
                .into(),
        ),
        ChildHook::None => Err(anyhow!(
            "not caught ({CHILD_HOOK_ENV}=none): children are counted as lost child_unseen"
        )),
        hook => Err(anyhow!(
            "this kernel lacks the tracepoint of {hook:?}: a fork child that calls the \
             driver without an exec may miss calls, counted as lost child_unseen"
        )),
    }
}

fn exists(path: &str) -> Result<String> {
    if Path::new(path).exists() {
        Ok(path.into())
    } else {
        Err(anyhow!("{path} is missing"))
    }
}

pub fn checks(args: &DoctorArgs) -> Vec<Check> {
    let mut checks = vec![check(
        "privileges",
        true,
        privileges::check()
            .map(|()| "root, or CAP_BPF and CAP_PERFMON".into())
            .map_err(Into::into),
    )];
    let uname = helpers::kernel_release();
    checks.push(Check {
        name: "kernel",
        ok: true,
        detail: uname.clone(),
        required: false,
    });
    checks.push(check("btf", false, exists("/sys/kernel/btf/vmlinux")));
    checks.push(check(
        "tracefs",
        true,
        tracefs().map(|p| p.display().to_string()),
    ));
    let mut bpf = EbpfLoader::new()
        .load(SELFTEST_OBJECT)
        .context("loading the self-test object");
    match &mut bpf {
        Ok(bpf) => {
            checks.push(check("uprobes", true, uprobe_check()));
            checks.push(check(
                "uprobe_multi",
                false,
                if uprobe_multi::supported() {
                    Ok("one link per program: fast attach and detach".into())
                } else {
                    Err(anyhow!(
                        "kernel before 6.6: one perf-event link per symbol (slower detach)"
                    ))
                },
            ));
            checks.push(check("attach_cookie", false, cookie_check(&uname)));
            checks.push(check("kprobes", false, kprobe_check(bpf)));
            checks.push(check(
                "func_ip",
                false,
                helper_check(helpers::FUNC_IP, &uname),
            ));
            checks.push(check("fentry", false, fentry_check(bpf)));
            checks.push(check("syscall_tracepoints", false, tracepoint_check(bpf)));
            checks.push(check("fork_children", false, fork_child_check()));
        }
        Err(error) => checks.push(Check {
            name: "ebpf",
            ok: false,
            detail: format!("{error:#}"),
            required: true,
        }),
    }
    let tracefs = tracefs().unwrap_or_else(|_| "/sys/kernel/tracing".into());
    let support = kernel_hooks::KernelSupport::probe(&tracefs);
    checks.push(check(
        "nvidia_module",
        false,
        support
            .nvidia_module
            .clone()
            .map(|version| {
                let btf = if Path::new("/sys/kernel/btf/nvidia").exists() {
                    ", module BTF"
                } else {
                    ""
                };
                format!("loaded, version {version}{btf}")
            })
            .ok_or_else(|| anyhow!("not loaded (no /sys/module/nvidia)")),
    ));
    checks.push(check(
        "xid_tracepoint",
        false,
        if support.xid_tracepoint {
            Ok("nvidia:nvidia_dev_xid".into())
        } else {
            Err(anyhow!("nvidia:nvidia_dev_xid not present"))
        },
    ));
    let hooks = kernel_hooks::plan(&kernel_hooks::HookChoice::Auto, &support)
        .map(|plan| format!("--kernel would use {}: {}", plan.mechanism, plan.reason));
    checks.push(check("kernel_hooks", false, hooks));
    let lib = library::find(&LIBCUDA, args.libcuda.as_deref())
        .map_err(anyhow::Error::from)
        .and_then(|path| Library::open(&LIBCUDA, &path).map_err(Into::into))
        .map(|lib| {
            let plan = Plan::new(&LIBCUDA, &lib, 0, &Default::default());
            format!(
                "{}; {} probe points, {} catalog functions missing",
                lib.file.describe(),
                plan.probes.len(),
                plan.missing.len()
            )
        });
    checks.push(check("libcuda", true, lib));
    if let Some(pid) = args.pid {
        checks.push(check("attach_gpu", true, attach_check(pid)));
    }
    checks
}

/// `doctor -p PID`: what `run -p PID --gpu` would find (the same checks, the process
/// untouched).
fn attach_check(pid: u32) -> Result<String> {
    let target = inject::late::check(pid)?;
    let cupti = match &target.libcupti {
        Some(path) => format!("its own libcupti {path} is used"),
        None => "no libcupti loaded: cudatrace loads one (--cupti, or as --gpu finds it)".into(),
    };
    let earlier = match &target.injected {
        Some(loaded) => format!(
            "; cudatrace's library from an earlier attach is there ({})",
            loaded.path
        ),
        None => String::new(),
    };
    Ok(format!(
        "process {pid} can be attached: libcuda {}; {cupti}; dlopen at {:#x}, the trampoline at \
         {:#x}{earlier}; the library goes in as an anonymous file, loaded through its \
         /proc/self/fd; at attach, one of its threads must wait in a blocking system call \
         (sleep, poll, read, futex) outside malloc and the loader within {:?}",
        target.libcuda,
        target.dlopen,
        target.code_at,
        inject::late::SAFE_POINT_BOUND
    ))
}

/// Prints the checks; exits 0 when `run` can work here, 1 otherwise.
pub fn run(args: DoctorArgs) -> Result<i32, Failure> {
    let checks = checks(&args);
    let ready = checks.iter().all(|c| c.ok || !c.required);
    if args.json {
        println!("{}", serde_json::json!({"ready": ready, "checks": checks}));
    } else {
        for c in &checks {
            let mark = if c.ok {
                "ok  "
            } else if c.required {
                "FAIL"
            } else {
                "no  "
            };
            println!("{mark} {:<20} {}", c.name, c.detail);
        }
        println!(
            "{}",
            if ready {
                "cudatrace run can trace here."
            } else {
                "cudatrace run cannot trace here: fix the FAIL lines."
            }
        );
    }
    Ok(if ready { 0 } else { 1 })
}
