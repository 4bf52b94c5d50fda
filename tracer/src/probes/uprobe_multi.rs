//! uprobe_multi links (Linux >= 6.6): one BPF link attaches a program to many offsets of
//! one file and detaches them all at once.
//!
//! Why by hand: closing one classic uprobe perf link costs a whole RCU-tasks-trace grace
//! period (about 0.1 s in our VMs) and the kernel serialises them, so hundreds of
//! per-symbol links take tens of seconds to detach. A uprobe_multi link pays that wait
//! once. aya 0.14 can neither load a program with the `BPF_TRACE_UPROBE_MULTI` expected
//! attach type nor create that link, so this module loads a second copy of the program
//! from the object itself (relocated against the maps aya already created, so both share
//! state and the globals aya patched) and issues `BPF_LINK_CREATE` directly.

use std::{
    collections::HashSet,
    ffi::CString,
    io,
    mem::size_of,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
    sync::OnceLock,
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::{Map, MapData},
};
use aya_obj::{
    Object, ProgramSection,
    btf::Btf,
    generated::{
        BPF_ALU64, BPF_EXIT, BPF_F_SLEEPABLE, BPF_F_UPROBE_MULTI_RETURN, BPF_JMP, BPF_K, BPF_MOV,
        bpf_attach_type, bpf_attr, bpf_cmd, bpf_insn, bpf_prog_type,
    },
};

/// License handed to the kernel when the object carries none: the probes call GPL-only
/// helpers (`bpf_probe_read_user`), so it must be GPL-compatible.
const FALLBACK_LICENSE: &std::ffi::CStr = c"Dual MIT/GPL";

/// Verifier log kept for a failed load; the kernel keeps the tail when it overflows.
const VERIFIER_LOG_BYTES: usize = 4 << 20;

/// A uprobe_multi link; dropping it detaches all its probes at once.
#[derive(Debug)]
pub struct MultiLink {
    // Declared first so it closes first: the link is what holds the probes.
    _link: OwnedFd,
    // The kernel link keeps its own reference to the program; holding the fd as well
    // keeps the program inspectable (bpftool) for as long as the link lives.
    _program: OwnedFd,
    #[cfg_attr(not(test), expect(dead_code, reason = "read by the tests"))]
    probes: usize,
}

impl MultiLink {
    /// How many offsets this link attached.
    #[cfg(test)]
    pub fn probes(&self) -> usize {
        self.probes
    }
}

/// Whether this kernel supports uprobe_multi links (probed once, then cached).
pub fn supported() -> bool {
    static SUPPORTED: OnceLock<bool> = OnceLock::new();
    *SUPPORTED.get_or_init(|| probe_support().unwrap_or(false))
}

/// Loads a trivial uprobe_multi program and asks for a link on "/". A kernel that knows
/// uprobe_multi validates the program and arguments, then fails the path lookup with
/// EBADF (a directory is not a regular file); older kernels reject the attach type with
/// EINVAL, kernels without uprobes say EOPNOTSUPP. No probe is ever registered, so there
/// is no grace period to wait for.
fn probe_support() -> io::Result<bool> {
    // r0 = 0; exit
    // SAFETY: bpf_insn is plain data; zero is a valid value of every field.
    let mut insns: [bpf_insn; 2] = unsafe { std::mem::zeroed() };
    insns[0].code = (BPF_ALU64 | BPF_MOV | BPF_K) as u8;
    insns[0].set_dst_reg(0);
    insns[1].code = (BPF_JMP | BPF_EXIT) as u8;
    let program = prog_load(c"uprobe_multi_pr", &insns, FALLBACK_LICENSE, 0, 0, None)?;
    let offsets = [0u64];
    match link_create(program.as_fd(), c"/", &offsets, &[], false) {
        Ok(_link) => Ok(false),
        Err(error) => Ok(error.raw_os_error() == Some(libc::EBADF)),
    }
}

/// Loads program `program_name` from `object` (an aya-built eBPF ELF) as a
/// BPF_PROG_TYPE_KPROBE with expected_attach_type BPF_TRACE_UPROBE_MULTI, relocating its
/// map references against the maps already created by `bpf` (an [`Ebpf`] loaded from the
/// same object, so globals set with `override_global` and map contents are shared), and
/// attaches it to every `offsets[i]` of `path` with one BPF_LINK_CREATE, `cookies[i]`
/// being what `bpf_get_attach_cookie` returns there (`cookies` may be empty: all zero).
/// Return probes when `retprobe`. All processes (pid 0).
///
/// The maps the program uses must still be in `bpf` (attach before `take_map`).
/// One bad offset fails the whole link: nothing is attached then.
pub fn attach(
    bpf: &Ebpf,
    object: &[u8],
    program_name: &str,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    retprobe: bool,
) -> Result<MultiLink> {
    check_counts(program_name, offsets, cookies)?;
    let program = load(bpf, object, program_name, retprobe)?;
    let c_path = CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("{}: path contains a NUL byte", path.display()))?;
    let link =
        link_create(program.as_fd(), &c_path, offsets, cookies, retprobe).with_context(|| {
            format!(
                "creating a uprobe_multi link for {program_name} on {} offsets of {}",
                offsets.len(),
                path.display()
            )
        })?;
    Ok(MultiLink {
        _link: link,
        _program: program,
        probes: offsets.len(),
    })
}

/// The kernel wants at least one offset, a u32 count, and one cookie per offset if any.
fn check_counts(program_name: &str, offsets: &[u64], cookies: &[u64]) -> Result<()> {
    if offsets.is_empty() {
        bail!("uprobe_multi {program_name}: no offsets to attach");
    }
    if !cookies.is_empty() && cookies.len() != offsets.len() {
        bail!(
            "uprobe_multi {program_name}: {} cookies for {} offsets",
            cookies.len(),
            offsets.len()
        );
    }
    if u32::try_from(offsets.len()).is_err() {
        bail!(
            "uprobe_multi {program_name}: {} offsets is too many",
            offsets.len()
        );
    }
    Ok(())
}

/// Parses, relocates and loads one program of the object for uprobe_multi.
fn load(bpf: &Ebpf, object: &[u8], program_name: &str, retprobe: bool) -> Result<OwnedFd> {
    let mut obj = Object::parse(object).context("parsing the eBPF object")?;
    let program = obj
        .programs
        .get(program_name)
        .with_context(|| format!("program {program_name} not in the eBPF object"))?;
    let sleepable = match program.section {
        ProgramSection::UProbe { sleepable } if !retprobe => sleepable,
        ProgramSection::URetProbe { sleepable } if retprobe => sleepable,
        ref other => bail!(
            "program {program_name} is a {other:?} program, not a {}",
            if retprobe { "uretprobe" } else { "uprobe" }
        ),
    };
    let key = program.function_key();
    let license = if program.license.as_bytes().is_empty() {
        FALLBACK_LICENSE.to_owned()
    } else {
        program.license.clone()
    };
    let kernel_version = program.kernel_version.unwrap_or(0);

    // CO-RE relocations need the running kernel's BTF; aya did the same for its copy.
    if obj.has_btf_relocations() {
        let target = Btf::from_sys_fs().context("reading the kernel BTF for CO-RE")?;
        obj.relocate_btf(&target).context("CO-RE relocation")?;
    }

    // Same rule as aya (taken before trimming): a section holding functions is code, not
    // a map.
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();

    // Keep only this program and the shared subprograms: the other programs may use maps
    // the caller has already taken out of `bpf`, which would fail their relocation.
    let other_programs: HashSet<(usize, u64)> = obj
        .programs
        .iter()
        .filter(|(name, _)| name.as_str() != program_name)
        .map(|(_, p)| p.function_key())
        .collect();
    obj.programs.retain(|name, _| name == program_name);
    obj.functions.retain(|k, _| !other_programs.contains(k));

    let definitions = std::mem::take(&mut obj.maps);
    let mut maps = Vec::with_capacity(definitions.len());
    for (name, definition) in &definitions {
        if let Some(map) = bpf.map(name) {
            maps.push((
                name.as_str(),
                map_data(map).fd().as_fd().as_raw_fd(),
                definition,
            ));
        }
    }
    obj.relocate_maps(maps.into_iter(), &text_sections)
        .with_context(|| {
            format!("relocating {program_name}'s maps (were some taken out of the Ebpf already?)")
        })?;
    obj.relocate_calls(&text_sections)
        .with_context(|| format!("linking {program_name}'s subprograms"))?;

    let function = obj
        .functions
        .get(&key)
        .context("program function vanished")?;
    let name = kernel_name(program_name);
    let flags = if sleepable { BPF_F_SLEEPABLE } else { 0 };
    let load = |log: Option<&mut [u8]>| {
        prog_load(
            &name,
            &function.instructions,
            &license,
            kernel_version,
            flags,
            log,
        )
    };
    load(None).or_else(|first| {
        // Load again with the verifier log on, only to explain the failure.
        let mut log = vec![0u8; VERIFIER_LOG_BYTES];
        load(Some(&mut log)).map_err(|_| {
            anyhow::anyhow!(
                "loading {program_name} as a uprobe_multi program: {first}\n\
                 verifier log (tail):\n{}",
                log_tail(&log, 40)
            )
        })
    })
}

/// Kernel program names are at most 15 bytes of `[A-Za-z0-9_.]`.
fn kernel_name(name: &str) -> CString {
    let cleaned: Vec<u8> = name
        .bytes()
        .filter(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')
        .take(15)
        .collect();
    CString::new(cleaned).unwrap_or_default()
}

fn log_tail(log: &[u8], lines: usize) -> String {
    let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The map behind any aya map variant (aya keeps them all as `MapData`).
fn map_data(map: &Map) -> &MapData {
    match map {
        Map::Array(m)
        | Map::ArrayOfMaps(m)
        | Map::BloomFilter(m)
        | Map::CgroupArray(m)
        | Map::CgroupStorage(m)
        | Map::CgrpStorage(m)
        | Map::CpuMap(m)
        | Map::DevMap(m)
        | Map::DevMapHash(m)
        | Map::HashMap(m)
        | Map::HashOfMaps(m)
        | Map::InodeStorage(m)
        | Map::LpmTrie(m)
        | Map::LruHashMap(m)
        | Map::PerCpuArray(m)
        | Map::PerCpuCgroupStorage(m)
        | Map::PerCpuHashMap(m)
        | Map::PerCpuLruHashMap(m)
        | Map::PerfEventArray(m)
        | Map::ProgramArray(m)
        | Map::Queue(m)
        | Map::ReusePortSockArray(m)
        | Map::RingBuf(m)
        | Map::SockHash(m)
        | Map::SockMap(m)
        | Map::SkStorage(m)
        | Map::Stack(m)
        | Map::StackTraceMap(m)
        | Map::Unsupported(m)
        | Map::XskMap(m) => m,
    }
}

/// bpf(2) for the commands that return a new file descriptor.
fn sys_bpf_fd(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: `attr` is a zero-initialised bpf_attr whose pointer fields point at
        // buffers the caller keeps alive across the call; the size is the struct's.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd as libc::c_long,
                std::ptr::from_mut(attr),
                size_of::<bpf_attr>(),
            )
        };
        if rc >= 0 {
            // SAFETY: on success these commands return a new fd that nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) });
        }
        let error = io::Error::last_os_error();
        // The verifier can give up transiently (EAGAIN) on a loaded machine; libbpf and
        // aya retry too.
        if matches!(error.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
            continue;
        }
        return Err(error);
    }
}

fn prog_load(
    name: &std::ffi::CStr,
    insns: &[bpf_insn],
    license: &std::ffi::CStr,
    kernel_version: u32,
    flags: u32,
    log: Option<&mut [u8]>,
) -> io::Result<OwnedFd> {
    // SAFETY: bpf_attr is plain data; all-zero is the kernel's "unset" for every field.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing plain integer fields of the BPF_PROG_LOAD member of the union.
    let u = unsafe { &mut attr.__bindgen_anon_3 };
    u.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
    u.expected_attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
    u.insns = insns.as_ptr() as u64;
    u.insn_cnt = insns.len() as u32;
    u.license = license.as_ptr() as u64;
    u.kern_version = kernel_version;
    u.prog_flags = flags;
    for (dst, src) in u.prog_name.iter_mut().zip(name.to_bytes()) {
        *dst = *src as libc::c_char;
    }
    if let Some(log) = log {
        u.log_level = 1;
        u.log_buf = log.as_mut_ptr() as u64;
        u.log_size = log.len() as u32;
    }
    sys_bpf_fd(bpf_cmd::BPF_PROG_LOAD, &mut attr)
}

fn link_create(
    program: BorrowedFd<'_>,
    path: &std::ffi::CStr,
    offsets: &[u64],
    cookies: &[u64],
    retprobe: bool,
) -> io::Result<OwnedFd> {
    // SAFETY: as in prog_load.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing plain integer fields of the BPF_LINK_CREATE member of the union.
    let link = unsafe { &mut attr.link_create };
    link.__bindgen_anon_1.prog_fd = program.as_raw_fd() as u32;
    link.attach_type = bpf_attach_type::BPF_TRACE_UPROBE_MULTI as u32;
    // SAFETY: writing plain integer fields of the uprobe_multi member of the union.
    let multi = unsafe { &mut link.__bindgen_anon_3.uprobe_multi };
    multi.path = path.as_ptr() as u64;
    multi.offsets = offsets.as_ptr() as u64;
    multi.cookies = if cookies.is_empty() {
        0
    } else {
        cookies.as_ptr() as u64
    };
    multi.cnt = offsets.len() as u32;
    multi.flags = if retprobe {
        BPF_F_UPROBE_MULTI_RETURN
    } else {
        0
    };
    multi.pid = 0;
    sys_bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

#[cfg(test)]
mod tests {
    use std::{
        path::PathBuf,
        process::Command,
        sync::{Mutex, MutexGuard},
        time::{Duration, Instant},
    };

    use aya::{
        maps::Array,
        programs::{
            UProbe,
            uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        },
    };
    use tracer_common::{ProbeSpec, kind};

    use super::*;
    use crate::{
        events::{RawEvent, decode},
        probes::{
            library::Library,
            maps,
            object::{self, LoadOptions, PROBES_OBJECT},
            plan::Plan,
            probe_set::LIBCUDA,
        },
    };

    /// Root tests here attach real probes; one at a time keeps the timings honest.
    static ROOT_LOCK: Mutex<()> = Mutex::new(());

    fn root() -> Option<MutexGuard<'static, ()>> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: uprobe_multi root test needs root");
            return None;
        }
        Some(ROOT_LOCK.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Builds the stand-in libcuda and driver (standin/README.md) into a scratch dir.
    fn standin() -> (PathBuf, PathBuf) {
        static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
        BUILT
            .get_or_init(|| {
                let dir = std::env::temp_dir()
                    .join(format!("cudatrace-uprobe-multi-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../standin");
                let lib = dir.join("libcuda.so.1");
                let driver = dir.join("cudatrace-driver");
                let gcc = |args: &[&std::ffi::OsStr]| {
                    let status = Command::new("gcc")
                        .args(args)
                        .status()
                        .expect("running gcc");
                    assert!(status.success(), "gcc {args:?} failed");
                };
                gcc(&[
                    "-shared".as_ref(),
                    "-fPIC".as_ref(),
                    "-O2".as_ref(),
                    "-fno-ipa-icf".as_ref(),
                    "-g".as_ref(),
                    "-Wl,-soname,libcuda.so.1".as_ref(),
                    "-o".as_ref(),
                    lib.as_os_str(),
                    src.join("libcuda_standin.c").as_os_str(),
                ]);
                let libdir = format!("-L{}", dir.display());
                gcc(&[
                    "-O2".as_ref(),
                    "-g".as_ref(),
                    "-o".as_ref(),
                    driver.as_os_str(),
                    src.join("cudatrace_driver.c").as_os_str(),
                    libdir.as_ref(),
                    "-l:libcuda.so.1".as_ref(),
                    "-Wl,-rpath,$ORIGIN".as_ref(),
                    "-lpthread".as_ref(),
                ]);
                (lib.canonicalize().unwrap(), driver)
            })
            .clone()
    }

    fn setup() -> (Ebpf, Library, Plan) {
        let (lib_path, _) = standin();
        let lib = Library::open(&LIBCUDA, &lib_path).unwrap();
        let plan = Plan::new(&LIBCUDA, &lib, 0);
        let mut bpf = object::load(&LoadOptions {
            trace_all: false,
            ring_bytes: 1 << 22,
            device_prefix: crate::kernel_hooks::DEVICE_PREFIX.into(),
        })
        .unwrap();
        let mut specs: Array<_, ProbeSpec> =
            Array::try_from(bpf.map_mut("SPECS").unwrap()).unwrap();
        for probe in &plan.probes {
            specs.set(probe.id, probe.spec.probe_spec(), 0).unwrap();
        }
        (bpf, lib, plan)
    }

    fn offsets_and_cookies(plan: &Plan) -> (Vec<u64>, Vec<u64>) {
        plan.probes
            .iter()
            .map(|p| (p.file_offset, u64::from(p.id)))
            .unzip()
    }

    #[test]
    fn kernel_names_are_short_and_clean() {
        assert_eq!(kernel_name("call_enter").as_bytes(), b"call_enter");
        assert_eq!(
            kernel_name("a-very/long:program_name").as_bytes(),
            b"averylongprogra"
        );
    }

    #[test]
    fn bad_counts_are_refused_before_the_kernel() {
        let err = check_counts("p", &[], &[]).unwrap_err();
        assert!(err.to_string().contains("no offsets"), "{err:#}");
        let err = check_counts("p", &[1, 2], &[1]).unwrap_err();
        assert!(
            err.to_string().contains("1 cookies for 2 offsets"),
            "{err:#}"
        );
        check_counts("p", &[1, 2], &[]).unwrap();
        check_counts("p", &[1, 2], &[3, 4]).unwrap();
    }

    #[test]
    fn a_refused_program_comes_with_the_verifier_log() {
        let Some(_guard) = root() else { return };
        // exit with r0 never written: the verifier refuses it.
        // SAFETY: bpf_insn is plain data.
        let mut insn: bpf_insn = unsafe { std::mem::zeroed() };
        insn.code = (BPF_JMP | BPF_EXIT) as u8;
        let mut log = vec![0u8; 1 << 16];
        let err = prog_load(c"bad", &[insn], FALLBACK_LICENSE, 0, 0, Some(&mut log)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
        assert!(
            log_tail(&log, 5).contains("R0 !read_ok"),
            "{}",
            log_tail(&log, 5)
        );
    }

    #[test]
    fn traces_the_sequence_with_cookies_and_detaches_at_once() {
        let Some(_guard) = root() else { return };
        assert!(
            supported(),
            "this kernel should support uprobe_multi (>= 6.6)"
        );
        let (lib_path, driver) = standin();
        let (mut bpf, _lib, plan) = setup();
        let (offsets, cookies) = offsets_and_cookies(&plan);
        assert!(
            offsets.len() >= 100,
            "only {} probes planned",
            offsets.len()
        );

        // Same order as attach_libcuda: returns first, so no entry lacks its return.
        let started = Instant::now();
        let ret = attach(
            &bpf,
            PROBES_OBJECT,
            "call_return",
            &lib_path,
            &offsets,
            &cookies,
            true,
        )
        .unwrap();
        let enter = attach(
            &bpf,
            PROBES_OBJECT,
            "call_enter",
            &lib_path,
            &offsets,
            &cookies,
            false,
        )
        .unwrap();
        let attach_time = started.elapsed();
        assert_eq!(
            (ret.probes(), enter.probes()),
            (offsets.len(), offsets.len())
        );

        // The shell waits so its pid is in TRACED before it execs the driver (same tgid).
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("sleep 0.3; exec {} sequence", driver.display()))
            .spawn()
            .unwrap();
        maps::trace_pid(&mut bpf, child.id()).unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "driver: {status}");

        let mut ring = maps::take_ring(&mut bpf).unwrap();
        let mut calls = Vec::new();
        while let Some(item) = ring.next() {
            if let Ok(RawEvent::Call { call, .. }) = decode(&item) {
                assert!(matches!(call.header.kind, kind::CALL | kind::CALL_DATA));
                calls.push(call);
            }
        }
        let symbols: Vec<&str> = calls
            .iter()
            .map(|c| plan.probes[c.probe_id as usize].symbol.as_str())
            .collect();
        let expected = [
            "cuInit",
            "cuDeviceGet",
            "cuDevicePrimaryCtxRetain",
            "cuCtxSetCurrent",
            "cuMemAlloc_v2",
            "cuMemAlloc_v2",
            "cuMemAlloc_v2",
            "cuMemcpyHtoD_v2",
            "cuStreamCreate",
            "cuMemcpyHtoDAsync_v2",
            "cuModuleLoadData",
            "cuModuleGetFunction",
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cuLibraryLoadData",
            "cuLibraryGetKernel",
            "cuKernelGetFunction",
            "cuLaunchKernel",
            "cuStreamSynchronize",
            "cuMemcpyDtoH_v2",
            "cuMemcpyDtoHAsync_v2",
            "cuMemcpyDtoD_v2",
            "cuMemcpy2D_v2",
            "cuMemsetD8_v2",
            "cuCtxSynchronize",
            "cuMemFree_v2",
            "cuMemFree_v2",
            "cuDevicePrimaryCtxRelease_v2",
        ];
        assert_eq!(symbols, expected);
        // Return-side reads use the spec the cookie selects: output pointer and result.
        assert_eq!(
            (calls[4].args[1], calls[4].outs[0], calls[4].ret),
            (1048576, 0x7f00_0000_0000, 0)
        );
        assert_eq!(
            (calls[5].args[1], calls[5].outs[0]),
            (4096, 0x7f00_0010_0000)
        );
        assert_eq!(calls[6].ret, 1);

        let started = Instant::now();
        drop(enter);
        drop(ret);
        let detach_time = started.elapsed();
        eprintln!(
            "uprobe_multi: {} offsets x 2 programs: attach {attach_time:?}, detach {detach_time:?}",
            offsets.len()
        );
        assert!(
            detach_time < Duration::from_secs(1),
            "detach took {detach_time:?}"
        );

        // Detached for real: the same traced run now produces nothing.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("sleep 0.3; exec {} sequence", driver.display()))
            .spawn()
            .unwrap();
        maps::trace_pid(&mut bpf, child.id()).unwrap();
        assert!(child.wait().unwrap().success());
        assert!(ring.next().is_none(), "events after the links were dropped");

        // One offset the kernel refuses (past the end of the file) fails the whole link.
        let size = std::fs::metadata(&lib_path).unwrap().len();
        let bad = [offsets[0], size + 0x10000];
        let err = attach(
            &bpf,
            PROBES_OBJECT,
            "call_enter",
            &lib_path,
            &bad,
            &[0, 1],
            false,
        )
        .unwrap_err();
        eprintln!("offset past the end: {err:#}");
    }

    /// Timings of both ways for the report: `cargo test -- --ignored --nocapture timing`.
    /// Slow (the per-link detach is about 0.1 s per link).
    #[test]
    #[ignore]
    fn timing_multi_vs_per_link() {
        let Some(_guard) = root() else { return };
        let (lib_path, _) = standin();
        let (mut bpf, _lib, plan) = setup();
        let (offsets, cookies) = offsets_and_cookies(&plan);
        let n = offsets.len();

        let started = Instant::now();
        let program = load(&bpf, PROBES_OBJECT, "call_enter", false).unwrap();
        eprintln!(
            "parse + relocate + verify call_enter: {:?}",
            started.elapsed()
        );
        drop(program);

        for copies in [1usize, 3, 10] {
            // The same offsets several times over: more probes than the library has symbols.
            let offsets: Vec<u64> = offsets.iter().copied().cycle().take(n * copies).collect();
            let cookies: Vec<u64> = cookies.iter().copied().cycle().take(n * copies).collect();
            let started = Instant::now();
            let ret = attach(
                &bpf,
                PROBES_OBJECT,
                "call_return",
                &lib_path,
                &offsets,
                &cookies,
                true,
            )
            .unwrap();
            let enter = attach(
                &bpf,
                PROBES_OBJECT,
                "call_enter",
                &lib_path,
                &offsets,
                &cookies,
                false,
            )
            .unwrap();
            let attached = started.elapsed();
            let started = Instant::now();
            drop(enter);
            drop(ret);
            eprintln!(
                "uprobe_multi: {} offsets x 2 links: attach {attached:?}, detach {:?}",
                offsets.len(),
                started.elapsed()
            );
        }

        let started = Instant::now();
        let mut links = Vec::new();
        for program_name in ["call_return", "call_enter"] {
            let program: &mut UProbe = bpf.program_mut(program_name).unwrap().try_into().unwrap();
            program.load().unwrap();
            for (offset, cookie) in offsets.iter().zip(&cookies) {
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(*offset),
                    cookie: Some(*cookie),
                };
                let id = program
                    .attach(point, &lib_path, UProbeScope::AllProcesses)
                    .unwrap();
                links.push(program.take_link(id).unwrap());
            }
        }
        let attached = started.elapsed();
        let started = Instant::now();
        let count = links.len();
        for link in links {
            drop(link);
        }
        eprintln!(
            "per-symbol perf links: {count} links: attach {attached:?}, serial detach {:?}",
            started.elapsed()
        );
    }
}
