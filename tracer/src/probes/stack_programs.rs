//! `--stacks`: the stack programs (`tracer-ebpf/src/stacks/`) loaded and put in the program
//! array the call programs tail-call into. The kernel lets a program tail-call only
//! programs of its own attach type, so each kind of call program has its array: the
//! uprobe_multi copies use `STACK_PROGS_MULTI` (their loader relocates `STACK_PROGS` to
//! it), aya's copies (per-symbol perf links) `STACK_PROGS`. Without `--stacks` both stay
//! empty and the tail call fails at once: the call program goes on as before.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    maps::{Map, ProgramArray},
    programs::UProbe,
};
use tracer_common::stacks::stack_prog;

use super::{object::PROBES_OBJECT, uprobe_multi};

/// The stack programs, by their index in the program array.
const PROGRAMS: [(&str, u32); 5] = [
    ("stack_walk", stack_prog::WALK),
    ("stack_codes", stack_prog::CODES),
    ("stack_capture", stack_prog::CAPTURE),
    ("stack_threads", stack_prog::THREADS),
    ("stack_walk_ident", stack_prog::WALK_IDENT),
];

/// The stack programs loaded for one kind of call program.
pub struct StackPrograms {
    /// The uprobe_multi copies' fds (the array holds the programs too).
    _multi: Vec<OwnedFd>,
    /// `py_code_freed`, linked per process at `PyCode_Type`'s deallocator (uprobe_multi
    /// only: a link for one process's memory; without it, identities are read per frame).
    pub code_freed: Option<OwnedFd>,
}

impl StackPrograms {
    /// Loads the stack programs for the call programs in use: the uprobe_multi copies when
    /// `multi`, else aya's. The maps they use must still be in `bpf`.
    pub fn load(bpf: &mut Ebpf, multi: bool) -> Result<Self> {
        let mut fds = Vec::new();
        if multi {
            // Each load is the verifier's work on one program (the walk's are large: 0.2 to
            // 0.5 s each on the build VM): on threads of their own, attach waits for the
            // slowest, not for their sum.
            let bpf_ref = &*bpf;
            let (loaded, code_freed) = std::thread::scope(|scope| {
                let loads: Vec<_> = PROGRAMS
                    .iter()
                    .map(|&(name, _)| {
                        scope.spawn(move || {
                            uprobe_multi::load_program(bpf_ref, PROBES_OBJECT, name, false)
                                .with_context(|| format!("loading {name}"))
                        })
                    })
                    .collect();
                let code_freed =
                    uprobe_multi::load_program(bpf_ref, PROBES_OBJECT, "py_code_freed", false)
                        .context("loading py_code_freed");
                let loaded: Vec<Result<OwnedFd>> = loads
                    .into_iter()
                    .map(|load| load.join().expect("a stack program's load panicked"))
                    .collect();
                (loaded, code_freed)
            });
            let map = bpf
                .map("STACK_PROGS_MULTI")
                .context("map STACK_PROGS_MULTI missing")?;
            for ((_, index), fd) in PROGRAMS.iter().zip(loaded) {
                let fd = fd?;
                set_raw(map, *index, &fd)?;
                fds.push(fd);
            }
            return Ok(StackPrograms {
                _multi: fds,
                code_freed: Some(code_freed?),
            });
        } else {
            for (name, index) in PROGRAMS {
                let program: &mut UProbe = bpf
                    .program_mut(name)
                    .with_context(|| format!("program {name} missing"))?
                    .try_into()?;
                program.load().with_context(|| format!("loading {name}"))?;
                let fd = program.fd()?.try_clone()?;
                let mut array: ProgramArray<_> = ProgramArray::try_from(
                    bpf.map_mut("STACK_PROGS")
                        .context("map STACK_PROGS missing")?,
                )?;
                array.set(index, &fd, 0)?;
            }
        }
        Ok(StackPrograms {
            _multi: fds,
            code_freed: None,
        })
    }
}

/// `array[index] = program`, for a program aya did not load (a raw fd).
fn set_raw(array: &Map, index: u32, program: &OwnedFd) -> Result<()> {
    let Map::ProgramArray(data) = array else {
        bail!("STACK_PROGS_MULTI is not a program array");
    };
    let value = program.as_raw_fd() as u32;
    // SAFETY: bpf_attr is plain data; zero is "unset" for every field.
    let mut attr: aya_obj::generated::bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the BPF_MAP_UPDATE_ELEM member; key and value outlive the call.
    let update = unsafe { &mut attr.__bindgen_anon_2 };
    update.map_fd = data.fd().as_fd().as_raw_fd() as u32;
    update.key = std::ptr::from_ref(&index) as u64;
    update.__bindgen_anon_1.value = std::ptr::from_ref(&value) as u64;
    // SAFETY: a valid bpf_attr for BPF_MAP_UPDATE_ELEM.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            aya_obj::generated::bpf_cmd::BPF_MAP_UPDATE_ELEM as libc::c_long,
            std::ptr::from_mut(&mut attr),
            std::mem::size_of::<aya_obj::generated::bpf_attr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error())
            .context("putting a stack program in STACK_PROGS_MULTI");
    }
    Ok(())
}
