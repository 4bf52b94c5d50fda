//! uprobe_multi against the kernel: loading, refusals with the verifier log, and the
//! stand-in library traced through two links.

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
            let dir =
                std::env::temp_dir().join(format!("cudatrace-uprobe-multi-{}", std::process::id()));
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
    let plan = Plan::new(&LIBCUDA, &lib, 0, &Default::default());
    let mut bpf = object::load(&LoadOptions {
        trace_all: false,
        ring_bytes: 1 << 22,
        device_prefix: crate::kernel_hooks::DEVICE_PREFIX.into(),
        map_entries: Vec::new(),
        stacks: None,
    })
    .unwrap();
    let mut specs: Array<_, ProbeSpec> = Array::try_from(bpf.map_mut("SPECS").unwrap()).unwrap();
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
    let err = prog_load(
        c"bad",
        &[insn],
        FALLBACK_LICENSE,
        0,
        0,
        Some((log.as_mut_slice(), LOG_VERBOSE)),
    )
    .unwrap_err();
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

    // Same order as attach::attach: returns first, so no entry lacks its return.
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

    // Loaded while the ring is still in `bpf`: both programs write to it.
    let spare_enter = load_program(&bpf, PROBES_OBJECT, "call_enter", false).unwrap();
    let mut ring = maps::take_ring(&mut bpf).unwrap();
    let mut calls = Vec::new();
    while let Some(item) = ring.next() {
        if let Ok(RawEvent::Call { call, .. }) = decode(&item) {
            assert!(matches!(
                call.header.kind,
                kind::CALL | kind::CALL_DATA | kind::CALL_STRING
            ));
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
    let err = link(
        spare_enter.as_fd(),
        "call_enter",
        &lib_path,
        &lib_path,
        &bad,
        &[0, 1],
        false,
        0,
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
