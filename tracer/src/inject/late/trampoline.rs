//! The trampoline: machine code a thread of the running program runs instead of going on
//! from where cudatrace stopped it. It saves the thread's vector state (`xsave`, the size
//! CPUID gives), makes two anonymous files (`memfd_create`: the library's and the control
//! file's), moves the library's to a high descriptor (at or above the floor cudatrace
//! gave, `F_DUPFD_CLOEXEC`) and waits (yielding) for cudatrace to fill them and say go;
//! then calls the program's own `dlopen("/proc/self/fd/N", RTLD_NOW)`,
//! `dlsym(handle, "cudatrace_attach")` and `cudatrace_attach(settings)` (or
//! `cudatrace_attach` straight away, where an earlier attach loaded the library), says what
//! it returned, waits for cudatrace to see the library's thread map the control file (it
//! opens it by its `/proc/self/fd` path, on its own thread), closes the control file's
//! descriptor (and the library's, unless `dlopen` loaded it: the loader names the library
//! `/proc/self/fd/N` for as long as it is loaded, so N must stay the library), restores
//! the vector state, the flags and every register, and jumps back to where the thread was.
//! cudatrace is gone from the process by then: it lets the thread go as soon as the
//! registers point here, and speaks to the trampoline through the data block alone.
//!
//! The library comes as an anonymous file so that a process in another mount namespace (a
//! container) loads it too: nothing is written into any filesystem, and no path has to be
//! reachable from the process's root but its own `/proc`.
//!
//! The code goes into the unused tail of the last page of a library's executable segment
//! (mapped, executable, never run; written through `/proc/PID/mem`, which copies the page
//! for this process alone), with the saved `r15` and `rip` after it. The rest (the other
//! registers, the addresses, the names and the settings) goes in a data block on the
//! thread's own stack, below its red zone; `r15` points at it. `trampoline.S` is the
//! source.

/// The code; [`SAVED_R15`] and [`SAVED_RIP`] follow it.
pub const CODE: [u8; 0x240] = [
    0xb8, 0x0d, 0x00, 0x00, 0x00, 0x31, 0xc9, 0x0f, 0xa2, 0x49, 0x89, 0xe4, 0x48, 0x29, 0xdc, 0x48,
    0x83, 0xe4, 0xc0, 0x49, 0x89, 0xe5, 0x31, 0xc0, 0x48, 0x89, 0x84, 0x24, 0x00, 0x02, 0x00, 0x00,
    0x48, 0x89, 0x84, 0x24, 0x08, 0x02, 0x00, 0x00, 0x48, 0x89, 0x84, 0x24, 0x10, 0x02, 0x00, 0x00,
    0x48, 0x89, 0x84, 0x24, 0x18, 0x02, 0x00, 0x00, 0x48, 0x89, 0x84, 0x24, 0x20, 0x02, 0x00, 0x00,
    0x48, 0x89, 0x84, 0x24, 0x28, 0x02, 0x00, 0x00, 0x48, 0x89, 0x84, 0x24, 0x30, 0x02, 0x00, 0x00,
    0x48, 0x89, 0x84, 0x24, 0x38, 0x02, 0x00, 0x00, 0xb8, 0xff, 0xff, 0xff, 0xff, 0xba, 0xff, 0xff,
    0xff, 0xff, 0x49, 0x0f, 0xae, 0x65, 0x00, 0xb8, 0x3f, 0x01, 0x00, 0x00, 0x49, 0x8d, 0xbf, 0x80,
    0x01, 0x00, 0x00, 0xbe, 0x03, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x49, 0x89, 0x87, 0x98, 0x00, 0x00,
    0x00, 0x48, 0x85, 0xc0, 0x78, 0x2c, 0x48, 0x89, 0xc7, 0xb8, 0x48, 0x00, 0x00, 0x00, 0xbe, 0x06,
    0x04, 0x00, 0x00, 0x49, 0x8b, 0x97, 0xb0, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x85, 0xc0, 0x78,
    0x11, 0x49, 0x87, 0x87, 0x98, 0x00, 0x00, 0x00, 0x48, 0x89, 0xc7, 0xb8, 0x03, 0x00, 0x00, 0x00,
    0x0f, 0x05, 0xb8, 0x3f, 0x01, 0x00, 0x00, 0x49, 0x8d, 0xbf, 0xc0, 0x01, 0x00, 0x00, 0xbe, 0x03,
    0x00, 0x00, 0x00, 0x0f, 0x05, 0x49, 0x89, 0x87, 0xa0, 0x00, 0x00, 0x00, 0x0f, 0x31, 0x48, 0xc1,
    0xe2, 0x20, 0x48, 0x09, 0xd0, 0x48, 0xbb, 0x00, 0x50, 0xd6, 0xdc, 0x01, 0x00, 0x00, 0x00, 0x48,
    0x01, 0xc3, 0x41, 0x8b, 0x87, 0xa8, 0x00, 0x00, 0x00, 0x83, 0xf8, 0x01, 0x74, 0x23, 0x83, 0xf8,
    0x02, 0x0f, 0x84, 0xb7, 0x00, 0x00, 0x00, 0xb8, 0x18, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x0f, 0x31,
    0x48, 0xc1, 0xe2, 0x20, 0x48, 0x09, 0xd0, 0x48, 0x39, 0xd8, 0x72, 0xd6, 0xe9, 0x9d, 0x00, 0x00,
    0x00, 0x49, 0x8b, 0x87, 0xf0, 0x00, 0x00, 0x00, 0x48, 0x85, 0xc0, 0x75, 0x47, 0x49, 0x8d, 0xbf,
    0x00, 0x01, 0x00, 0x00, 0xbe, 0x02, 0x00, 0x00, 0x00, 0x41, 0xff, 0x97, 0xe0, 0x00, 0x00, 0x00,
    0x48, 0xc7, 0xc1, 0xff, 0xff, 0xff, 0xff, 0x48, 0x85, 0xc0, 0x74, 0x34, 0x49, 0xc7, 0x87, 0x98,
    0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0x48, 0x89, 0xc7, 0x49, 0x8d, 0xb7, 0xc0, 0x00, 0x00,
    0x00, 0x41, 0xff, 0x97, 0xe8, 0x00, 0x00, 0x00, 0x48, 0xc7, 0xc1, 0xfe, 0xff, 0xff, 0xff, 0x48,
    0x85, 0xc0, 0x74, 0x0c, 0x49, 0x8d, 0xbf, 0x00, 0x02, 0x00, 0x00, 0xff, 0xd0, 0x48, 0x63, 0xc8,
    0x49, 0x89, 0x8f, 0xf8, 0x00, 0x00, 0x00, 0x0f, 0x31, 0x48, 0xc1, 0xe2, 0x20, 0x48, 0x09, 0xd0,
    0x48, 0xbb, 0x00, 0x50, 0xd6, 0xdc, 0x01, 0x00, 0x00, 0x00, 0x48, 0x01, 0xc3, 0x41, 0x8b, 0x87,
    0xa8, 0x00, 0x00, 0x00, 0x83, 0xf8, 0x03, 0x74, 0x15, 0xb8, 0x18, 0x00, 0x00, 0x00, 0x0f, 0x05,
    0x0f, 0x31, 0x48, 0xc1, 0xe2, 0x20, 0x48, 0x09, 0xd0, 0x48, 0x39, 0xd8, 0x72, 0xdf, 0x49, 0x8b,
    0xbf, 0x98, 0x00, 0x00, 0x00, 0x48, 0x85, 0xff, 0x78, 0x07, 0xb8, 0x03, 0x00, 0x00, 0x00, 0x0f,
    0x05, 0x49, 0x8b, 0xbf, 0xa0, 0x00, 0x00, 0x00, 0x48, 0x85, 0xff, 0x78, 0x07, 0xb8, 0x03, 0x00,
    0x00, 0x00, 0x0f, 0x05, 0xb8, 0xff, 0xff, 0xff, 0xff, 0xba, 0xff, 0xff, 0xff, 0xff, 0x49, 0x0f,
    0xae, 0x6d, 0x00, 0x4c, 0x89, 0xe4, 0x41, 0xff, 0xb7, 0x90, 0x00, 0x00, 0x00, 0x9d, 0x49, 0x8b,
    0x07, 0x49, 0x8b, 0x5f, 0x08, 0x49, 0x8b, 0x4f, 0x10, 0x49, 0x8b, 0x57, 0x18, 0x49, 0x8b, 0x77,
    0x20, 0x49, 0x8b, 0x7f, 0x28, 0x49, 0x8b, 0x6f, 0x30, 0x4d, 0x8b, 0x47, 0x38, 0x4d, 0x8b, 0x4f,
    0x40, 0x4d, 0x8b, 0x57, 0x48, 0x4d, 0x8b, 0x5f, 0x50, 0x4d, 0x8b, 0x67, 0x58, 0x4d, 0x8b, 0x6f,
    0x60, 0x4d, 0x8b, 0x77, 0x68, 0x49, 0x8b, 0xa7, 0x80, 0x00, 0x00, 0x00, 0x4c, 0x8b, 0x3d, 0x0d,
    0x00, 0x00, 0x00, 0xff, 0x25, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00,
];

/// Where, after the code, the thread's `r15` and `rip` are kept (the last two loads).
pub const SAVED_R15: usize = 0x240;
pub const SAVED_RIP: usize = 0x248;
/// Bytes written into the library's page: the code and the two saved registers.
pub const CODE_LEN: usize = 0x250;

/// The data block's layout (offsets from `r15`), as `trampoline.S` reads it.
pub mod data {
    /// rax, rbx, rcx, rdx, rsi, rdi, rbp, r8 ... r14: 8 bytes each from 0, in that order.
    pub const REGISTERS: usize = 0x00;
    pub const RSP: usize = 0x80;
    pub const RFLAGS: usize = 0x90;
    /// What `memfd_create` returned for the library's file (moved to
    /// [`LIBRARY_FD_FLOOR`] or above) and the control file (a descriptor, or `-errno`);
    /// [`NOT_YET`] until then. Once `dlopen` returned the library, its slot is -1: that
    /// descriptor stays open.
    pub const LIBRARY_FD: usize = 0x98;
    pub const CONTROL_FD: usize = 0xa0;
    /// cudatrace's word: [`GO`] or [`GIVE_UP`], then [`CLOSE`]; 0 while the trampoline
    /// waits.
    pub const WORD: usize = 0xa8;
    /// The lowest descriptor the library's file is moved to (`F_DUPFD_CLOEXEC`).
    pub const LIBRARY_FD_FLOOR: usize = 0xb0;
    /// `"cudatrace_attach\0"`.
    pub const SYMBOL: usize = 0xc0;
    pub const DLOPEN: usize = 0xe0;
    pub const DLSYM: usize = 0xe8;
    /// `cudatrace_attach`'s address where the library is loaded already, else 0.
    pub const ATTACH: usize = 0xf0;
    /// What the trampoline did once told go ([`NOT_YET`] until then): what
    /// `cudatrace_attach` returned (0: started), or [`NO_LIBRARY`], [`NO_SYMBOL`].
    pub const STATUS: usize = 0xf8;
    /// The path `dlopen` is given (`/proc/self/fd/N`), NUL-terminated: written with [`GO`].
    pub const PATH: usize = 0x100;
    /// The anonymous files' names, NUL-terminated (what `/proc/PID/maps` shows).
    pub const LIBRARY_NAME: usize = 0x180;
    pub const CONTROL_NAME: usize = 0x1c0;
    /// The settings (`KEY=VALUE` lines), NUL-terminated: written with [`GO`].
    pub const SETTINGS: usize = 0x200;
    /// The whole block.
    pub const LEN: usize = 0x1000;
    /// A descriptor slot before `memfd_create` returned.
    pub const NOT_YET: u64 = i64::MIN as u64;
    /// The word's values: go, give up, and, after go, close the files (the library's
    /// thread has mapped the control file, or will not).
    pub const GO: u64 = 1;
    pub const GIVE_UP: u64 = 2;
    pub const CLOSE: u64 = 3;
    /// [`STATUS`]: `dlopen` returned NULL; `dlsym` did.
    pub const NO_LIBRARY: u64 = -1i64 as u64;
    pub const NO_SYMBOL: u64 = -2i64 as u64;
    /// How long the trampoline waits for go, and for close after the call, in
    /// time-stamp-counter ticks (2 s or more below 4 GHz): it yields meanwhile, with no
    /// sleeping system call, whose interruption would replace the restart of the call the
    /// thread was stopped in.
    pub const WAIT_TICKS: u64 = 8_000_000_000;
}

/// The name of the control file's anonymous file.
pub const CONTROL_NAME: &[u8] = b"cudatrace_control";

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

/// What the data block holds, besides the registers, when the thread is let go.
pub struct Call<'a> {
    pub dlopen: u64,
    pub dlsym: u64,
    /// `cudatrace_attach` where an earlier attach loaded the library; else 0.
    pub attach: u64,
    /// The library's anonymous file's name.
    pub library_name: &'a [u8],
    /// The lowest descriptor its file may be moved to.
    pub library_fd_floor: u64,
}

/// Why a data block cannot be made or completed.
#[derive(Debug, PartialEq, Eq)]
pub enum TooLong {
    Path(usize),
    Name(usize),
    Settings(usize),
}

/// The data block for `resume` (the registers to go on with) and `call`.
pub fn data_block(resume: &libc::user_regs_struct, call: &Call) -> Result<Vec<u8>, TooLong> {
    if call.library_name.len() >= data::CONTROL_NAME - data::LIBRARY_NAME {
        return Err(TooLong::Name(call.library_name.len()));
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
    put(data::LIBRARY_FD, data::NOT_YET);
    put(data::CONTROL_FD, data::NOT_YET);
    put(data::WORD, 0);
    put(data::LIBRARY_FD_FLOOR, call.library_fd_floor);
    put(data::DLOPEN, call.dlopen);
    put(data::DLSYM, call.dlsym);
    put(data::ATTACH, call.attach);
    put(data::STATUS, data::NOT_YET);
    let symbol = b"cudatrace_attach";
    block[data::SYMBOL..data::SYMBOL + symbol.len()].copy_from_slice(symbol);
    block[data::LIBRARY_NAME..data::LIBRARY_NAME + call.library_name.len()]
        .copy_from_slice(call.library_name);
    block[data::CONTROL_NAME..data::CONTROL_NAME + CONTROL_NAME.len()]
        .copy_from_slice(CONTROL_NAME);
    Ok(block)
}

/// What cudatrace writes into the block before it says go: the path `dlopen` is given
/// (at [`data::PATH`]) and the settings (at [`data::SETTINGS`]), each NUL-terminated.
pub fn go_strings(path: &[u8], settings: &[u8]) -> Result<(Vec<u8>, Vec<u8>), TooLong> {
    if path.len() >= data::LIBRARY_NAME - data::PATH {
        return Err(TooLong::Path(path.len()));
    }
    if settings.len() >= data::LEN - data::SETTINGS {
        return Err(TooLong::Settings(settings.len()));
    }
    let terminated = |bytes: &[u8]| [bytes, b"\0"].concat();
    Ok((terminated(path), terminated(settings)))
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
            attach: 0xa7,
            library_name: b"libcudatrace_inject-0123.so",
            library_fd_floor: 1000,
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
                at(data::DLSYM),
                at(data::ATTACH),
                at(data::LIBRARY_FD_FLOOR)
            ),
            (0xb, 0xe, 0x5, 0x246, 0xd1, 0xd2, 0xa7, 1000)
        );
        // The trampoline waits on the word, 1 ms at a time; the descriptors are unset.
        assert_eq!(
            (
                at(data::LIBRARY_FD),
                at(data::CONTROL_FD),
                at(data::WORD),
                at(data::STATUS)
            ),
            (1 << 63, 1 << 63, 0, 1 << 63)
        );
        assert_eq!(
            &block[data::SYMBOL..data::SYMBOL + 17],
            b"cudatrace_attach\0"
        );
        assert_eq!(
            &block[data::LIBRARY_NAME..data::LIBRARY_NAME + 28],
            b"libcudatrace_inject-0123.so\0"
        );
        assert_eq!(
            &block[data::CONTROL_NAME..data::CONTROL_NAME + 18],
            b"cudatrace_control\0"
        );
        assert_eq!(
            go_strings(b"/proc/self/fd/5", b"A=1\n").unwrap(),
            (b"/proc/self/fd/5\0".to_vec(), b"A=1\n\0".to_vec())
        );
        assert_eq!(
            go_strings(&[b'x'; 128], b"").unwrap_err(),
            TooLong::Path(128)
        );
        assert_eq!(
            go_strings(b"", &[b'x'; 0xe00]).unwrap_err(),
            TooLong::Settings(0xe00)
        );
        let code = code(&resume);
        assert_eq!(
            (
                u64::from_le_bytes(code[SAVED_R15..SAVED_R15 + 8].try_into().unwrap()),
                u64::from_le_bytes(code[SAVED_RIP..SAVED_RIP + 8].try_into().unwrap())
            ),
            (0xf, 0x1234)
        );
        let long = vec![b'x'; 64];
        assert_eq!(
            data_block(
                &resume,
                &Call {
                    library_name: &long,
                    ..call
                }
            )
            .unwrap_err(),
            TooLong::Name(64)
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
        // `movabs rbx, WAIT_TICKS`, once for each wait: the bound the Rust side knows.
        let bound = [&[0x48, 0xbb][..], &data::WAIT_TICKS.to_le_bytes()].concat();
        assert_eq!(CODE.windows(10).filter(|w| *w == bound).count(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
