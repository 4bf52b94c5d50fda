//! What a call probe reads from the registers, by the calling convention of the
//! architecture this object is built for (`tracer_common::arch::TARGET`, chosen by
//! `--cfg bpf_target_arch`): every offset is a constant of that table, so the verifier sees
//! fixed-offset reads of `struct pt_regs`.

use aya_ebpf::{
    helpers::bpf_probe_read_user,
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{
    MAX_ARGS, REGISTER_ARGS, STACK_ARGS,
    arch::{ReturnAddress, TARGET},
};

/// The register word at byte `offset` of `pt_regs` (a constant).
#[inline(always)]
fn word(regs: *const u8, offset: u16) -> u64 {
    // SAFETY: `regs` is the program's context, `offset` a constant from the table inside
    // the target's `pt_regs`; the verifier checks the access.
    unsafe { *(regs.add(offset as usize) as *const u64) }
}

/// What a call's entry needs: its arguments in C order (registers, then stack words), the
/// stack pointer and the return address.
pub struct Entry {
    pub args: [u64; MAX_ARGS],
    pub sp: u64,
    /// 0 where it was not asked for, or could not be read.
    pub ret_addr: u64,
    /// The stack words were asked for and could not be read.
    pub read_failed: bool,
}

/// Reads a call's entry. `stack_args`: the function has arguments on the stack (read
/// [`STACK_ARGS`] words); `want_ret_addr`: the return address is needed (a read on x86-64,
/// a register on arm64).
#[inline(always)]
pub fn entry(ctx: &ProbeContext, stack_args: bool, want_ret_addr: bool) -> Entry {
    let regs = ctx.regs as *const u8;
    let sp = word(regs, TARGET.stack_pointer);
    // Not `[0; MAX_ARGS]`: that is a call to a byte-loop memset (`zero.rs`).
    let mut args = crate::zero::zeros::<MAX_ARGS>();
    for (i, arg) in args.iter_mut().enumerate().take(REGISTER_ARGS) {
        *arg = word(regs, TARGET.arg_reg(i));
    }
    let mut ret_addr = 0;
    let mut read_failed = false;
    match TARGET.return_address {
        ReturnAddress::AtStackPointer => {
            // [sp] is the return address and the stack arguments follow it: one read.
            if stack_args {
                match unsafe { bpf_probe_read_user(sp as *const [u64; 1 + STACK_ARGS]) } {
                    Ok(words) => {
                        ret_addr = words[0];
                        args[REGISTER_ARGS..].copy_from_slice(&words[1..]);
                    }
                    Err(_) => read_failed = true,
                }
            } else if want_ret_addr
                && let Ok(word) = unsafe { bpf_probe_read_user(sp as *const u64) }
            {
                ret_addr = word;
            }
        }
        ReturnAddress::InRegister(offset) => {
            ret_addr = word(regs, offset);
            if stack_args {
                let first = sp + u64::from(TARGET.first_stack_arg);
                match unsafe { bpf_probe_read_user(first as *const [u64; STACK_ARGS]) } {
                    Ok(words) => args[REGISTER_ARGS..].copy_from_slice(&words),
                    Err(_) => read_failed = true,
                }
            }
        }
    }
    Entry {
        args,
        sp,
        ret_addr,
        read_failed,
    }
}

/// The integer return value at a return probe.
#[inline(always)]
pub fn return_value(ctx: &RetProbeContext) -> u64 {
    word(ctx.regs as *const u8, TARGET.return_value)
}

/// The probed address, at a uprobe.
#[inline(always)]
pub fn instruction_pointer(ctx: &ProbeContext) -> u64 {
    word(ctx.regs as *const u8, TARGET.instruction_pointer)
}

/// The stack pointer at a uprobe.
#[inline(always)]
pub fn stack_pointer(ctx: &ProbeContext) -> u64 {
    word(ctx.regs as *const u8, TARGET.stack_pointer)
}

/// The stack pointer the call had at its entry, read at its return probe.
#[inline(always)]
pub fn entry_sp_at_return(ctx: &RetProbeContext) -> u64 {
    word(ctx.regs as *const u8, TARGET.stack_pointer).wrapping_sub(u64::from(TARGET.return_pops))
}
