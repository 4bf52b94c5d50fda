//! The trampoline: machine code a thread of the running program runs instead of going on
//! from where cudatrace stopped it. It saves the thread's vector state (`xsave`, the size
//! CPUID gives), calls the program's own `dlopen(library, RTLD_NOW)`, `dlsym(handle,
//! "cudatrace_attach")` and `cudatrace_attach(settings)`, restores the vector state, the
//! flags and every register, and jumps back to where the thread was. cudatrace is gone
//! from the process by then: it lets the thread go as soon as the registers point here.
//!
//! The code goes into the unused tail of the last page of a library's executable segment
//! (mapped, executable, never run; written through `/proc/PID/mem`, which copies the page
//! for this process alone), with the saved `r15` and `rip` after it. The rest (the other
//! registers, the addresses, the names and the settings) goes in a data block on the
//! thread's own stack, below its red zone; `r15` points at it. `trampoline.S` is the
//! source.

/// The code; [`SAVED_R15`] and [`SAVED_RIP`] follow it.
pub const CODE: [u8; 0x108] = [
    0xb8, 0x0d, 0x00, 0x00, 0x00, 0x31, 0xc9, 0x0f, 0xa2, 0x49, 0x89, 0xe4, 0x48, 0x29, 0xdc, 0x48,
    0x83, 0xe4, 0xc0, 0x49, 0x89, 0xe5, 0x31, 0xc0, 0x48, 0x89, 0x84, 0x24, 0x00, 0x02, 0x00, 0x00,
    0x48, 0x89, 0x84, 0x24, 0x08, 0x02, 0x00, 0x00, 0x48, 0x89, 0x84, 0x24, 0x10, 0x02, 0x00, 0x00,
    0x48, 0x89, 0x84, 0x24, 0x18, 0x02, 0x00, 0x00, 0x48, 0x89, 0x84, 0x24, 0x20, 0x02, 0x00, 0x00,
    0x48, 0x89, 0x84, 0x24, 0x28, 0x02, 0x00, 0x00, 0x48, 0x89, 0x84, 0x24, 0x30, 0x02, 0x00, 0x00,
    0x48, 0x89, 0x84, 0x24, 0x38, 0x02, 0x00, 0x00, 0xb8, 0xff, 0xff, 0xff, 0xff, 0xba, 0xff, 0xff,
    0xff, 0xff, 0x49, 0x0f, 0xae, 0x65, 0x00, 0x49, 0x8d, 0xbf, 0x00, 0x01, 0x00, 0x00, 0xbe, 0x02,
    0x00, 0x00, 0x00, 0x41, 0xff, 0x97, 0xe0, 0x00, 0x00, 0x00, 0x48, 0x85, 0xc0, 0x74, 0x1f, 0x48,
    0x89, 0xc7, 0x49, 0x8d, 0xb7, 0xc0, 0x00, 0x00, 0x00, 0x41, 0xff, 0x97, 0xe8, 0x00, 0x00, 0x00,
    0x48, 0x85, 0xc0, 0x74, 0x09, 0x49, 0x8d, 0xbf, 0x00, 0x02, 0x00, 0x00, 0xff, 0xd0, 0xb8, 0xff,
    0xff, 0xff, 0xff, 0xba, 0xff, 0xff, 0xff, 0xff, 0x49, 0x0f, 0xae, 0x6d, 0x00, 0x4c, 0x89, 0xe4,
    0x41, 0xff, 0xb7, 0x90, 0x00, 0x00, 0x00, 0x9d, 0x49, 0x8b, 0x07, 0x49, 0x8b, 0x5f, 0x08, 0x49,
    0x8b, 0x4f, 0x10, 0x49, 0x8b, 0x57, 0x18, 0x49, 0x8b, 0x77, 0x20, 0x49, 0x8b, 0x7f, 0x28, 0x49,
    0x8b, 0x6f, 0x30, 0x4d, 0x8b, 0x47, 0x38, 0x4d, 0x8b, 0x4f, 0x40, 0x4d, 0x8b, 0x57, 0x48, 0x4d,
    0x8b, 0x5f, 0x50, 0x4d, 0x8b, 0x67, 0x58, 0x4d, 0x8b, 0x6f, 0x60, 0x4d, 0x8b, 0x77, 0x68, 0x49,
    0x8b, 0xa7, 0x80, 0x00, 0x00, 0x00, 0x4c, 0x8b, 0x3d, 0x0b, 0x00, 0x00, 0x00, 0xff, 0x25, 0x0d,
    0x00, 0x00, 0x00, 0x0f, 0x1f, 0x44, 0x00, 0x00,
];

/// Where, after the code, the thread's `r15` and `rip` are kept (the last two loads).
pub const SAVED_R15: usize = 0x108;
pub const SAVED_RIP: usize = 0x110;
/// Bytes written into the library's page: the code and the two saved registers.
pub const CODE_LEN: usize = 0x118;

/// The data block's layout (offsets from `r15`), as `trampoline.S` reads it.
pub mod data {
    /// rax, rbx, rcx, rdx, rsi, rdi, rbp, r8 ... r14: 8 bytes each from 0, in that order.
    pub const REGISTERS: usize = 0x00;
    pub const RSP: usize = 0x80;
    pub const RFLAGS: usize = 0x90;
    /// `"cudatrace_attach\0"`.
    pub const SYMBOL: usize = 0xc0;
    pub const DLOPEN: usize = 0xe0;
    pub const DLSYM: usize = 0xe8;
    /// The library's path, NUL-terminated.
    pub const PATH: usize = 0x100;
    /// The settings (`KEY=VALUE` lines), NUL-terminated.
    pub const SETTINGS: usize = 0x200;
    /// The whole block.
    pub const LEN: usize = 0x1000;
}

/// The red zone below a thread's stack pointer, which the code it was running may use.
const RED_ZONE: u64 = 128;

/// Linux's restart codes, as a syscall interrupted by a stop leaves them in `rax`.
const ERESTARTSYS: i64 = 512;
const ERESTARTNOINTR: i64 = 513;
const ERESTARTNOHAND: i64 = 514;
const ERESTART_RESTARTBLOCK: i64 = 516;
/// `restart_syscall(2)`.
const SYS_RESTART_SYSCALL: u64 = 219;

/// The registers the thread is to go on with after the trampoline: those it was stopped
/// with, except that a system call the stop interrupted is made again, as the kernel
/// would have (the trampoline's own registers keep the kernel from doing it).
pub fn resume_registers(mut regs: libc::user_regs_struct) -> libc::user_regs_struct {
    let in_syscall = (regs.orig_rax as i64) >= 0;
    if in_syscall {
        match -(regs.rax as i64) {
            ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND => {
                regs.rax = regs.orig_rax;
                regs.rip -= 2;
            }
            ERESTART_RESTARTBLOCK => {
                regs.rax = SYS_RESTART_SYSCALL;
                regs.rip -= 2;
            }
            _ => {}
        }
    }
    regs
}

/// Where the data block goes on the thread's stack, and the stack pointer the trampoline
/// starts with (below the block, 16-byte aligned).
pub fn stack_places(rsp: u64) -> (u64, u64) {
    let block = (rsp - RED_ZONE - data::LEN as u64) & !63;
    (block, block - 64)
}

/// What the data block holds, besides the registers.
pub struct Call<'a> {
    pub dlopen: u64,
    pub dlsym: u64,
    pub library: &'a [u8],
    pub settings: &'a [u8],
}

/// Why a data block cannot be made.
#[derive(Debug, PartialEq, Eq)]
pub enum TooLong {
    Path(usize),
    Settings(usize),
}

/// The data block for `resume` (the registers to go on with) and `call`.
pub fn data_block(resume: &libc::user_regs_struct, call: &Call) -> Result<Vec<u8>, TooLong> {
    if call.library.len() >= data::SETTINGS - data::PATH {
        return Err(TooLong::Path(call.library.len()));
    }
    if call.settings.len() >= data::LEN - data::SETTINGS {
        return Err(TooLong::Settings(call.settings.len()));
    }
    let mut block = vec![0u8; data::LEN];
    let mut put = |at: usize, value: u64| block[at..at + 8].copy_from_slice(&value.to_le_bytes());
    let registers = [
        resume.rax, resume.rbx, resume.rcx, resume.rdx, resume.rsi, resume.rdi, resume.rbp,
        resume.r8, resume.r9, resume.r10, resume.r11, resume.r12, resume.r13, resume.r14,
    ];
    for (index, value) in registers.into_iter().enumerate() {
        put(data::REGISTERS + 8 * index, value);
    }
    put(data::RSP, resume.rsp);
    put(data::RFLAGS, resume.eflags);
    put(data::DLOPEN, call.dlopen);
    put(data::DLSYM, call.dlsym);
    let symbol = b"cudatrace_attach";
    block[data::SYMBOL..data::SYMBOL + symbol.len()].copy_from_slice(symbol);
    block[data::PATH..data::PATH + call.library.len()].copy_from_slice(call.library);
    block[data::SETTINGS..data::SETTINGS + call.settings.len()].copy_from_slice(call.settings);
    Ok(block)
}

/// The code with the thread's `r15` and `rip` to go on with.
pub fn code(resume: &libc::user_regs_struct) -> [u8; CODE_LEN] {
    let mut code = [0u8; CODE_LEN];
    code[..CODE.len()].copy_from_slice(&CODE);
    code[SAVED_R15..SAVED_R15 + 8].copy_from_slice(&resume.r15.to_le_bytes());
    code[SAVED_RIP..SAVED_RIP + 8].copy_from_slice(&resume.rip.to_le_bytes());
    code
}

/// The registers the thread runs the trampoline with: `code_at` the code, `r15` the
/// data block, `rsp` below it; `orig_rax` -1, so the kernel restarts no system call.
pub fn trampoline_registers(
    stopped: &libc::user_regs_struct,
    code_at: u64,
) -> libc::user_regs_struct {
    let (block, rsp) = stack_places(stopped.rsp);
    libc::user_regs_struct {
        rip: code_at,
        r15: block,
        rsp,
        orig_rax: u64::MAX,
        rax: 0,
        ..*stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs() -> libc::user_regs_struct {
        // SAFETY: a plain struct of integers.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn an_interrupted_system_call_is_made_again() {
        let mut stopped = regs();
        stopped.orig_rax = 35; // nanosleep
        stopped.rax = -ERESTART_RESTARTBLOCK as u64;
        stopped.rip = 0x1002;
        let resume = resume_registers(stopped);
        assert_eq!((resume.rax, resume.rip), (SYS_RESTART_SYSCALL, 0x1000));
        stopped.orig_rax = 202; // futex
        stopped.rax = -ERESTARTSYS as u64;
        let resume = resume_registers(stopped);
        assert_eq!((resume.rax, resume.rip), (202, 0x1000));
        // Not in a system call: nothing changes.
        stopped.orig_rax = u64::MAX;
        let resume = resume_registers(stopped);
        assert_eq!((resume.rax, resume.rip), (-ERESTARTSYS as u64, 0x1002));
        // A call that returned: its result stays.
        stopped.orig_rax = 0;
        stopped.rax = 5;
        assert_eq!(resume_registers(stopped).rax, 5);
    }

    #[test]
    fn the_block_sits_below_the_red_zone_and_holds_what_the_code_reads() {
        let (block, rsp) = stack_places(0x7fff_0000_1238);
        assert!(block + data::LEN as u64 <= 0x7fff_0000_1238 - 128);
        assert_eq!((block % 64, rsp % 16, block - rsp), (0, 0, 64));
        let mut resume = regs();
        resume.rbx = 0xb;
        resume.r14 = 0xe;
        resume.rsp = 0x5;
        resume.eflags = 0x246;
        resume.r15 = 0xf;
        resume.rip = 0x1234;
        let call = Call {
            dlopen: 0xd1,
            dlsym: 0xd2,
            library: b"/run/cudatrace/lib.so",
            settings: b"A=1\n",
        };
        let block = data_block(&resume, &call).unwrap();
        let at = |offset: usize| u64::from_le_bytes(block[offset..offset + 8].try_into().unwrap());
        assert_eq!(
            (
                at(0x08),
                at(0x68),
                at(data::RSP),
                at(data::RFLAGS),
                at(data::DLOPEN),
                at(data::DLSYM)
            ),
            (0xb, 0xe, 0x5, 0x246, 0xd1, 0xd2)
        );
        assert_eq!(
            &block[data::SYMBOL..data::SYMBOL + 17],
            b"cudatrace_attach\0"
        );
        assert_eq!(
            &block[data::PATH..data::PATH + 22],
            b"/run/cudatrace/lib.so\0"
        );
        assert_eq!(&block[data::SETTINGS..data::SETTINGS + 5], b"A=1\n\0");
        let code = code(&resume);
        assert_eq!(
            (
                u64::from_le_bytes(code[SAVED_R15..SAVED_R15 + 8].try_into().unwrap()),
                u64::from_le_bytes(code[SAVED_RIP..SAVED_RIP + 8].try_into().unwrap())
            ),
            (0xf, 0x1234)
        );
        let long = vec![b'x'; 300];
        assert_eq!(
            data_block(
                &resume,
                &Call {
                    library: &long,
                    ..call
                }
            )
            .unwrap_err(),
            TooLong::Path(300)
        );
    }

    /// The bytes are `trampoline.S` assembled (where binutils' `as` is installed).
    #[test]
    fn the_code_is_its_source_assembled() {
        let dir = std::env::temp_dir().join(format!("cudatrace-tramp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = concat!(env!("CARGO_MANIFEST_DIR"), "/src/inject/late/trampoline.S");
        let object = dir.join("t.o");
        let binary = dir.join("t.bin");
        let assembled = std::process::Command::new("as")
            .args(["--64", "-o"])
            .arg(&object)
            .arg(source)
            .status();
        let Ok(status) = assembled else {
            eprintln!("skipped: no `as` here");
            return;
        };
        assert!(status.success());
        let copied = std::process::Command::new("objcopy")
            .args(["-O", "binary", "-j", ".text"])
            .arg(&object)
            .arg(&binary)
            .status()
            .unwrap();
        assert!(copied.success());
        let bytes = std::fs::read(&binary).unwrap();
        assert_eq!(bytes.len(), CODE_LEN);
        assert_eq!(&bytes[..CODE.len()], &CODE[..]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
