//! What a probe reads where, per CPU architecture, as data: the function arguments and
//! stack pointer in the kernel's `struct pt_regs` at a uprobe, where the return address
//! and the first stack argument are at entry, and the `task_struct` member that holds a
//! thread's thread pointer (its `pthread_self()`, where the stack walk finds the Python
//! thread state).
//!
//! [`TARGET`] is the row of the architecture this crate is built for: the host's for
//! `cudatrace`, the one named by `--cfg bpf_target_arch` for the eBPF object (built once per
//! architecture by `cargo xtask build-ebpf --arch`, since `struct pt_regs` differs). The
//! eBPF call probes read their arguments, stack pointer, return address and return value at
//! the offsets of that row (`tracer-ebpf/src/regs.rs`), and the loader finds the thread
//! pointer's `task_struct` member by its path in the kernel's BTF.

/// Where the return address is at a function's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReturnAddress {
    /// In memory at the stack pointer (x86-64's `call` pushes it).
    AtStackPointer,
    /// In a register: this byte offset in `pt_regs` (arm64's link register x30).
    InRegister(u16),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    /// Rust's `target_arch`.
    pub name: &'static str,
    /// Byte offsets in `struct pt_regs` of the integer arguments passed in registers, in
    /// order (System V x86-64: rdi, rsi, rdx, rcx, r8, r9; AAPCS64: x0-x7).
    pub arg_regs: &'static [u16],
    /// Byte offset of the stack pointer in `pt_regs`.
    pub stack_pointer: u16,
    /// Byte offset of the integer return value in `pt_regs` (rax, x0).
    pub return_value: u16,
    /// Byte offset of the instruction pointer in `pt_regs` (rip, pc): at a uprobe, the
    /// probed address (the kernel sets it before the handlers run).
    pub instruction_pointer: u16,
    /// Bytes the return takes off the stack: at a return probe the stack pointer is the
    /// entry's plus this (x86-64's `ret` pops the return address; arm64's takes nothing).
    pub return_pops: u16,
    pub return_address: ReturnAddress,
    /// Bytes from the stack pointer at entry to the first argument passed on the stack.
    pub first_stack_arg: u16,
    /// The `task_struct` member path holding the user thread pointer: x86-64's `fs` base,
    /// arm64's `tpidr_el0` as the kernel saves it.
    pub thread_pointer: &'static [&'static str],
    /// Whether glibc's `pthread_self()` (what CPython stores as a thread state's
    /// `thread_id`) is the thread pointer itself. x86-64 (TLS variant II) puts the thread
    /// descriptor at the thread pointer; AArch64 (variant I) puts it below, by the size of
    /// glibc's `struct pthread`, which differs between glibc releases. Where it is not, the
    /// stack walk tells a thread's state by its `native_thread_id` alone (CPython 3.11+).
    pub pthread_self_is_thread_pointer: bool,
    /// The ABI `ldconfig -p` names for this architecture's libraries (`(libc6,x86-64)`).
    pub ldconfig_abi: &'static str,
    /// Debian's multiarch tuple: libraries in `/usr/lib/<tuple>`.
    pub multiarch: &'static str,
    /// Whether a fork child's first return to user space passes the `sys_exit` tracepoints
    /// (its `clone` returning 0). x86-64's `ret_from_fork` ends through the syscall exit
    /// path; arm64's goes to `ret_to_user` directly, so there the child is caught on its
    /// first `rseq:rseq_update` instead (the kernel marks a new task's restartable
    /// sequence for update when it is first woken, if its parent had registered one).
    pub fork_child_passes_syscall_exit: bool,
}

pub const X86_64: Arch = Arch {
    name: "x86_64",
    // struct pt_regs: r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax
    // rip cs eflags rsp ss, 8 bytes each.
    arg_regs: &[112, 104, 96, 88, 72, 64],
    stack_pointer: 152,
    return_value: 80,
    instruction_pointer: 128,
    return_pops: 8,
    return_address: ReturnAddress::AtStackPointer,
    first_stack_arg: 8,
    thread_pointer: &["thread", "fsbase"],
    pthread_self_is_thread_pointer: true,
    ldconfig_abi: "x86-64",
    multiarch: "x86_64-linux-gnu",
    fork_child_passes_syscall_exit: true,
};

pub const AARCH64: Arch = Arch {
    name: "aarch64",
    // struct pt_regs begins with user_pt_regs: regs[31] (x0-x30), sp, pc, pstate.
    arg_regs: &[0, 8, 16, 24, 32, 40, 48, 56],
    stack_pointer: 31 * 8,
    return_value: 0,
    instruction_pointer: 32 * 8,
    return_pops: 0,
    return_address: ReturnAddress::InRegister(30 * 8),
    first_stack_arg: 0,
    thread_pointer: &["thread", "uw", "tp_value"],
    pthread_self_is_thread_pointer: false,
    ldconfig_abi: "AArch64",
    multiarch: "aarch64-linux-gnu",
    fork_child_passes_syscall_exit: false,
};

pub const ARCHES: [Arch; 2] = [X86_64, AARCH64];

/// The architecture this crate is built for: `cudatrace`'s host, or the eBPF object's
/// `bpf_target_arch`.
#[cfg(any(target_arch = "aarch64", bpf_target_arch = "aarch64"))]
pub const TARGET: Arch = AARCH64;
/// The architecture this crate is built for: `cudatrace`'s host, or the eBPF object's
/// `bpf_target_arch`.
#[cfg(not(any(target_arch = "aarch64", bpf_target_arch = "aarch64")))]
pub const TARGET: Arch = X86_64;

/// The most argument registers of any architecture in the table (AArch64's eight).
pub const MAX_ARG_REGS: usize = 8;

/// The table of `target_arch` `name`, if cudatrace knows it.
pub fn by_name(name: &str) -> Option<Arch> {
    ARCHES.iter().copied().find(|a| a.name == name)
}

impl Arch {
    /// How many integer arguments it passes in registers.
    pub const fn register_args(&self) -> usize {
        self.arg_regs.len()
    }

    /// The `pt_regs` offset of argument register `index`, for a constant `index`
    /// below [`Arch::register_args`] (0 beyond: callers bound it).
    pub const fn arg_reg(&self, index: usize) -> u16 {
        if index < self.arg_regs.len() {
            self.arg_regs[index]
        } else {
            0
        }
    }

    /// Where argument `index` (0-based) is: a `pt_regs` offset, or an offset from the
    /// stack pointer at entry.
    pub fn arg(&self, index: usize) -> ArgPlace {
        match self.arg_regs.get(index) {
            Some(&offset) => ArgPlace::Register(offset),
            None => {
                ArgPlace::Stack(self.first_stack_arg + 8 * (index - self.arg_regs.len()) as u16)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgPlace {
    /// A byte offset in `pt_regs`.
    Register(u16),
    /// A byte offset from the stack pointer at entry.
    Stack(u16),
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;

    #[test]
    fn cu_launch_kernels_eleven_arguments_split_where_each_abi_puts_them() {
        // cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra).
        assert_eq!(X86_64.arg(5), ArgPlace::Register(64)); // blockY in r9
        assert_eq!(X86_64.arg(6), ArgPlace::Stack(8)); // blockZ at [rsp+8]
        assert_eq!(X86_64.arg(10), ArgPlace::Stack(40)); // extra at [rsp+40]
        assert_eq!(AARCH64.arg(7), ArgPlace::Register(56)); // sharedMemBytes in x7
        assert_eq!(AARCH64.arg(8), ArgPlace::Stack(0)); // hStream at [sp]
        assert_eq!(AARCH64.arg(10), ArgPlace::Stack(16)); // extra at [sp+16]
    }

    #[test]
    fn arm64_registers_are_x_n_at_eight_n() {
        for (n, offset) in AARCH64.arg_regs.iter().enumerate() {
            assert_eq!(usize::from(*offset), 8 * n);
        }
        assert_eq!(AARCH64.return_address, ReturnAddress::InRegister(240));
        assert_eq!(AARCH64.stack_pointer, 248);
        assert_eq!(AARCH64.instruction_pointer, 256);
    }

    /// The kernel's `pt_regs` begins with the layout ptrace gives user space
    /// (`user_regs_struct`), which libc declares per architecture: an independent check of
    /// the table of the architecture this test is built for.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn x86_64s_table_is_libcs_user_regs_layout() {
        use core::mem::offset_of;
        use libc::user_regs_struct as R;
        let offsets = [
            offset_of!(R, rdi),
            offset_of!(R, rsi),
            offset_of!(R, rdx),
            offset_of!(R, rcx),
            offset_of!(R, r8),
            offset_of!(R, r9),
        ];
        let table: Vec<usize> = X86_64.arg_regs.iter().map(|&o| usize::from(o)).collect();
        assert_eq!(table, offsets);
        assert_eq!(usize::from(X86_64.stack_pointer), offset_of!(R, rsp));
        assert_eq!(usize::from(X86_64.return_value), offset_of!(R, rax));
        assert_eq!(usize::from(X86_64.instruction_pointer), offset_of!(R, rip));
        assert_eq!(by_name(std::env::consts::ARCH), Some(X86_64));
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn aarch64s_table_is_libcs_user_regs_layout() {
        use core::mem::offset_of;
        use libc::user_regs_struct as R;
        assert_eq!(usize::from(AARCH64.stack_pointer), offset_of!(R, sp));
        assert_eq!(usize::from(AARCH64.instruction_pointer), offset_of!(R, pc));
        assert_eq!(offset_of!(R, regs), 0);
        assert_eq!(by_name(std::env::consts::ARCH), Some(AARCH64));
    }

    #[test]
    fn target_is_the_arch_this_is_built_for() {
        assert_eq!(by_name(std::env::consts::ARCH), Some(TARGET));
        assert!(TARGET.register_args() <= MAX_ARG_REGS);
        assert_eq!(AARCH64.register_args(), MAX_ARG_REGS);
        assert_eq!(X86_64.register_args(), 6);
        assert_eq!(X86_64.arg_reg(5), 64);
        assert_eq!(AARCH64.arg_reg(7), 56);
        let tells = |arch: Arch| arch.pthread_self_is_thread_pointer;
        assert_eq!((tells(X86_64), tells(AARCH64)), (true, false));
        let exits = |arch: Arch| arch.fork_child_passes_syscall_exit;
        assert_eq!((exits(X86_64), exits(AARCH64)), (true, false));
    }

    #[test]
    fn each_arch_is_found_by_its_rust_name() {
        assert_eq!(by_name("x86_64"), Some(X86_64));
        assert_eq!(by_name("aarch64"), Some(AARCH64));
        assert_eq!(by_name("riscv64"), None);
        assert_eq!(AARCH64.thread_pointer, ["thread", "uw", "tp_value"]);
    }
}
