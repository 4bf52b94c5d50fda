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
/// The verifier's log levels: every instruction (to explain a refusal), statistics alone.
const LOG_VERBOSE: u32 = 1;
const LOG_STATS: u32 = 4;
/// `CUDATRACE_VERIFIER_STATS=1` (hidden, for developers and a root test): each uprobe_multi
/// program's verifier statistics on stderr as it loads, one line each, `verifier-stats
/// NAME processed=N limit=L total_states=S peak_states=P`. The walk came within 4% of the
/// limit of instructions once without anyone seeing it.
pub const VERIFIER_STATS_ENV: &str = "CUDATRACE_VERIFIER_STATS";

/// A uprobe_multi link; dropping it detaches all its probes at once.
#[derive(Debug)]
pub struct MultiLink {
    // Declared first so it closes first: the link is what holds the probes.
    _link: OwnedFd,
    // The kernel link keeps its own reference to the program; holding the fd as well
    // keeps the program inspectable (bpftool) for as long as the link lives. Links made
    // from a program loaded once ([`load_program`]) leave it to the program's owner.
    _program: Option<OwnedFd>,
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
    match link_create(program.as_fd(), c"/", &offsets, &[], false, 0) {
        Ok(_link) => Ok(false),
        Err(error) => Ok(error.raw_os_error() == Some(libc::EBADF)),
    }
}

/// Loads program `program_name` from `object` (an aya-built eBPF ELF) and attaches it to
/// every `offsets[i]` of `path` for all processes: [`load_program`], then [`link`].
#[cfg(test)]
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
    let program = load_program(bpf, object, program_name, retprobe)?;
    let mut link = link(
        program.as_fd(),
        program_name,
        path,
        path,
        offsets,
        cookies,
        retprobe,
        0,
    )?;
    link._program = Some(program);
    Ok(link)
}

/// Loads program `program_name` from `object` (an aya-built eBPF ELF) as a
/// BPF_PROG_TYPE_KPROBE with expected_attach_type BPF_TRACE_UPROBE_MULTI, relocating its
/// map references against the maps already created by `bpf` (an [`Ebpf`] loaded from the
/// same object, so globals set with `override_global` and map contents are shared). One
/// loaded program serves any number of links.
///
/// The maps the program uses must still be in `bpf` (load before `take_map`).
pub fn load_program(
    bpf: &Ebpf,
    object: &[u8],
    program_name: &str,
    retprobe: bool,
) -> Result<OwnedFd> {
    load(bpf, object, program_name, retprobe)
}

/// Attaches `program` (from [`load_program`]) to every `offsets[i]` of `path` with one
/// BPF_LINK_CREATE, `cookies[i]` being what `bpf_get_attach_cookie` returns there
/// (`cookies` may be empty: all zero). Return probes when `retprobe`. `pid` 0: every
/// process; otherwise only that process (its pid as this process sees it): breakpoints
/// are installed in its memory only, and the program runs for its threads only.
///
/// One bad offset fails the whole link: nothing is attached then. Errors name the file as
/// `shown_as` (`path` may be a `/proc/self/fd` link).
#[expect(clippy::too_many_arguments, reason = "one BPF_LINK_CREATE's fields")]
pub fn link(
    program: BorrowedFd<'_>,
    program_name: &str,
    path: &Path,
    shown_as: &Path,
    offsets: &[u64],
    cookies: &[u64],
    retprobe: bool,
    pid: u32,
) -> Result<MultiLink> {
    check_counts(program_name, offsets, cookies)?;
    let c_path = CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("{}: path contains a NUL byte", path.display()))?;
    let link =
        link_create(program, &c_path, offsets, cookies, retprobe, pid).with_context(|| {
            let whose = match pid {
                0 => String::new(),
                own if own == std::process::id() => " (mapped by cudatrace itself)".into(),
                pid => format!(" for pid {pid}"),
            };
            format!(
                "creating a uprobe_multi link for {program_name} on {} offsets of {}{whose}",
                offsets.len(),
                shown_as.display()
            )
        })?;
    Ok(MultiLink {
        _link: link,
        _program: None,
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

/// Maps these copies use in place of the one the code names: the kernel lets a program
/// tail-call only into programs of its own attach type, so the uprobe_multi programs have
/// their own program array (`--stacks`).
const MAP_ALIASES: &[(&str, &str)] = &[("STACK_PROGS", "STACK_PROGS_MULTI")];

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
        let source = MAP_ALIASES
            .iter()
            .find(|(alias, _)| alias == name)
            .map_or(name.as_str(), |(_, instead)| instead);
        if let Some(map) = bpf.map(source) {
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
    let load = |log: Option<(&mut [u8], u32)>| {
        prog_load(
            &name,
            &function.instructions,
            &license,
            kernel_version,
            flags,
            log,
        )
    };
    if std::env::var_os(VERIFIER_STATS_ENV).is_some() {
        let mut log = vec![0u8; 4096];
        if let Ok(program) = load(Some((&mut log, LOG_STATS))) {
            eprintln!("verifier-stats {program_name} {}", stats_line(&log));
            return Ok(program);
        }
    }
    load(None).or_else(|first| {
        // Load again with the verifier log on, only to explain the failure.
        let mut log = vec![0u8; VERIFIER_LOG_BYTES];
        load(Some((&mut log, LOG_VERBOSE))).map_err(|_| {
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

/// The verifier's statistics line ("processed N insns (limit L) max_states_per_insn ...
/// total_states S ...") as `processed=N limit=L total_states=S peak_states=P`.
fn stats_line(log: &[u8]) -> String {
    let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    let Some(line) = text.lines().find(|line| line.starts_with("processed ")) else {
        return "processed=? (no statistics in the log)".into();
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| {
        words
            .iter()
            .position(|word| *word == key)
            .and_then(|at| words.get(at + 1))
            .map_or("?", |value| {
                value.trim_matches(|c: char| !c.is_ascii_digit())
            })
    };
    format!(
        "processed={} limit={} total_states={} peak_states={}",
        after("processed"),
        after("(limit"),
        after("total_states"),
        after("peak_states")
    )
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
    log: Option<(&mut [u8], u32)>,
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
    if let Some((log, level)) = log {
        u.log_level = level;
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
    pid: u32,
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
    multi.pid = pid;
    sys_bpf_fd(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

#[cfg(test)]
mod tests;
