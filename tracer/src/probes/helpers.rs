//! BPF helpers that cudatrace's programs call and older kernels lack, probed by loading a
//! two-instruction program that calls each one. Distribution kernels backport helpers, so
//! the kernel's own verifier is asked rather than its version number.
//!
//! Debian bullseye's 5.10 has neither helper below: there `run`'s uprobe programs tell their
//! probe by the address it fired at instead of the attach cookie (`cookies_missing`), and
//! `--kernel`'s kprobes are refused with the kernel and helper named (doctor says so too).

use std::{
    io,
    os::fd::{FromRawFd, OwnedFd},
    sync::OnceLock,
};

use aya_obj::generated::{
    BPF_EXIT, BPF_JMP, bpf_attr, bpf_cmd, bpf_func_id, bpf_insn, bpf_prog_type,
};

/// A BPF helper some cudatrace feature needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Helper {
    pub name: &'static str,
    id: bpf_func_id,
    /// The Linux release that added it.
    pub since: &'static str,
    /// The feature that calls it, as doctor and the refusals name it.
    pub needed_by: &'static str,
}

/// `run`'s uprobe programs tell their probe by the cookie where the kernel has it.
pub const ATTACH_COOKIE: Helper = Helper {
    name: "bpf_get_attach_cookie",
    id: bpf_func_id::BPF_FUNC_get_attach_cookie,
    since: "5.15",
    needed_by: "telling uprobes apart by their attach cookies",
};

/// `--kernel`'s kprobes name their kernel function by its address.
pub const FUNC_IP: Helper = Helper {
    name: "bpf_get_func_ip",
    id: bpf_func_id::BPF_FUNC_get_func_ip,
    since: "5.15",
    needed_by: "--kernel kprobes, which name their function by address",
};

pub const HELPERS: [Helper; 2] = [ATTACH_COOKIE, FUNC_IP];

/// Whether this kernel lets a kprobe-type program call `helper` (probed once, then cached):
/// the verifier refuses an unknown helper with EINVAL; another error (EPERM without
/// privileges) leaves the answer unknown.
pub fn supported(helper: Helper) -> Result<bool, String> {
    static ANSWERS: OnceLock<[Result<bool, String>; 2]> = OnceLock::new();
    let answers = ANSWERS.get_or_init(|| {
        HELPERS.map(|h| match probe(h.id) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            Err(e) => Err(format!("{} could not be probed: {e}", h.name)),
        })
    });
    let index = HELPERS
        .iter()
        .position(|h| *h == helper)
        .expect("every helper is in HELPERS");
    answers[index].clone()
}

/// Whether this kernel surely lacks attach cookies: `run` then tells probes apart by the
/// address they fired at (unknown is taken as having them: the loader's error says why).
pub fn cookies_missing() -> bool {
    supported(ATTACH_COOKIE) == Ok(false)
}

/// The refusal for a feature whose helper kernel `release` lacks.
pub fn refusal(helper: Helper, release: &str) -> String {
    format!(
        "kernel {release} lacks the BPF helper {} (Linux {}), needed by {}: use a {} or newer \
         kernel",
        helper.name, helper.since, helper.needed_by, helper.since
    )
}

/// This kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain data; uname fills it with NUL-terminated fields.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::uname(&mut uts) };
    let release: Vec<u8> = uts
        .release
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| u8::from_ne_bytes(c.to_ne_bytes()))
        .collect();
    String::from_utf8_lossy(&release).into_owned()
}

/// `call helper; r0 = 0; exit` as a kprobe program (r1 is the context, as both helpers want).
fn probe(helper: bpf_func_id) -> io::Result<()> {
    // SAFETY: bpf_insn is plain data; zero is a valid value of every field.
    let mut insns: [bpf_insn; 3] = unsafe { std::mem::zeroed() };
    insns[0].code = (BPF_JMP | aya_obj::generated::BPF_CALL) as u8;
    insns[0].imm = helper as i32;
    insns[1].code = (aya_obj::generated::BPF_ALU64
        | aya_obj::generated::BPF_MOV
        | aya_obj::generated::BPF_K) as u8;
    insns[2].code = (BPF_JMP | BPF_EXIT) as u8;
    // SAFETY: bpf_attr is plain data; all-zero is the kernel's "unset" for every field.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing plain integer fields of the BPF_PROG_LOAD member of the union.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.prog_type = bpf_prog_type::BPF_PROG_TYPE_KPROBE as u32;
    load.insns = insns.as_ptr() as u64;
    load.insn_cnt = insns.len() as u32;
    load.license = c"GPL".as_ptr() as u64;
    // SAFETY: BPF_PROG_LOAD reads attr and the instructions it points to, which outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_PROG_LOAD as libc::c_long,
            &mut attr as *mut bpf_attr,
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us; the OwnedFd closes it.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_kernel_the_helper_and_the_feature() {
        assert_eq!(
            refusal(FUNC_IP, "5.10.0-32-cloud-amd64"),
            "kernel 5.10.0-32-cloud-amd64 lacks the BPF helper bpf_get_func_ip (Linux 5.15), \
             needed by --kernel kprobes, which name their function by address: use a 5.15 or \
             newer kernel"
        );
    }

    #[test]
    fn the_helpers_are_the_kernels_numbers() {
        // The numbers in the guest's verifier refusals ("invalid func unknown#174").
        assert_eq!(ATTACH_COOKIE.id as u32, 174);
        assert_eq!(FUNC_IP.id as u32, 173);
    }
}
