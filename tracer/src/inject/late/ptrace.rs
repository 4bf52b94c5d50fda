//! Getting in: one thread of the process is seized (`PTRACE_SEIZE`, then
//! `PTRACE_INTERRUPT`), and, if it stopped at a safe point, its registers are pointed at
//! the trampoline and it is let go at once; otherwise it is let go unchanged and another
//! thread (or the same one later) is tried, within a bound. Everything runs on a thread of
//! cudatrace's own that ends when done: should cudatrace die, the kernel lets its tracees
//! go (a seized thread is never left stopped).
//!
//! A safe point: the thread waits in a blocking system call that neither malloc nor the
//! dynamic loader makes (sleeping, polling, reading, waiting on a futex), and no return
//! address into the loader is on the top of its stack (it is not inside a `dlopen` of its
//! own: the loader's lock is recursive, and a second `dlopen` inside the first would break
//! it). A thread stopped anywhere else might hold malloc's or the loader's lock, and the
//! trampoline's `dlopen` would then wait for it forever.

use std::{
    fs,
    os::unix::fs::FileExt,
    time::{Duration, Instant},
};

pub use super::injected::{InjectError, Injected};
use super::{
    target::{Mapping, Target},
    trampoline::{self, Call},
};

/// System calls a thread may be stopped in for the trampoline to run on it (x86-64).
const SAFE_SYSCALLS: [(u64, &str); 27] = [
    (0, "read"),
    (1, "write"),
    (7, "poll"),
    (17, "pread64"),
    (19, "readv"),
    (20, "writev"),
    (23, "select"),
    (34, "pause"),
    (35, "nanosleep"),
    (43, "accept"),
    (44, "sendto"),
    (45, "recvfrom"),
    (46, "sendmsg"),
    (47, "recvmsg"),
    (61, "wait4"),
    (128, "rt_sigtimedwait"),
    (130, "rt_sigsuspend"),
    (202, "futex"),
    (230, "clock_nanosleep"),
    (232, "epoll_wait"),
    (247, "waitid"),
    (270, "pselect6"),
    (271, "ppoll"),
    (281, "epoll_pwait"),
    (288, "accept4"),
    (299, "recvmmsg"),
    (441, "epoll_pwait2"),
];

/// Bytes of the stack, from the stack pointer up, searched for return addresses into the
/// loader.
const STACK_SCAN: usize = 4096;

/// Tests only: `PHASE:MS` makes the injection wait MS milliseconds at PHASE (`stopped`: a
/// thread is stopped, not yet changed; `pointed`: its registers point at the trampoline,
/// not yet let go; `handover`: the trampoline made its files, nothing written into them),
/// so a test can kill cudatrace there.
const PAUSE_VAR: &str = "CUDATRACE_TEST_ATTACH_PAUSE";

/// Waits where [`PAUSE_VAR`] asks to.
pub(super) fn test_pause(phase: &str) {
    let Ok(value) = std::env::var(PAUSE_VAR) else {
        return;
    };
    if let Some((at, ms)) = value.split_once(':')
        && at == phase
        && let Ok(ms) = ms.parse()
    {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// Stack a thread must have below its stack pointer for the trampoline: its block, the
/// vector state (up to about 11 KiB with AMX), `dlopen` and the library's constructors.
/// The main thread's `[stack]` grows on demand and is not measured.
const STACK_ROOM: u64 = 128 * 1024;

/// How long a seized thread may take to stop.
const STOP_WAIT: Duration = Duration::from_millis(200);

/// Starts the trampoline on a thread of `target`, within `bound`; runs on a thread of its
/// own, so that whatever happens no thread of the target stays seized.
pub fn inject(
    target: &Target,
    library_name: &[u8],
    bound: Duration,
) -> Result<Injected, InjectError> {
    let (pid, maps, code_at) = (target.pid, target.maps.clone(), target.code_at);
    let (dlopen, dlsym) = (target.dlopen, target.dlsym);
    let attach = target.injected.as_ref().map_or(0, |loaded| loaded.attach);
    let library_fd_floor = target.library_fd_floor;
    let library_name = library_name.to_vec();
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                let call = Call {
                    dlopen,
                    dlsym,
                    attach,
                    library_name: &library_name,
                    library_fd_floor,
                };
                inject_here(pid, &maps, code_at, &call, bound)
            })
            .join()
            .unwrap_or_else(|_| Err(InjectError::Trampoline("the injection panicked".into())))
    })
}

fn inject_here(
    pid: u32,
    maps: &[Mapping],
    code_at: u64,
    call: &Call,
    bound: Duration,
) -> Result<Injected, InjectError> {
    let start = Instant::now();
    let loader: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| m.executable() && m.file_name().starts_with("ld-"))
        .map(|m| (m.start, m.end))
        .collect();
    // Thread stacks that cannot grow: (start, end) of the mappings that are not `[stack]`.
    let fixed: Vec<(u64, u64)> = maps
        .iter()
        .filter(|m| m.path != "[stack]")
        .map(|m| (m.start, m.end))
        .collect();
    let mut passed_over = 0;
    let mut rounds = 0;
    let mut last = String::from("none tried");
    loop {
        rounds += 1;
        let tids = threads_of(pid);
        let threads = tids.len();
        for tid in tids {
            let seized = Seized::new(tid)?;
            let Some(regs) = seized.stop()? else {
                last = format!("thread {tid} did not stop within {STOP_WAIT:?}");
                passed_over += 1;
                continue;
            };
            match safe_point(pid, &regs, &loader)
                .and_then(|syscall| room_below(regs.rsp, &fixed).map(|()| syscall))
            {
                Ok(syscall) => {
                    test_pause("stopped");
                    let block_at = seized.run_trampoline(pid, regs, code_at, call)?;
                    test_pause("pointed");
                    return Ok(Injected {
                        block_at,
                        tid,
                        syscall,
                        stopped: seized.since.elapsed(),
                        passed_over,
                        rounds,
                    });
                }
                Err(why) => {
                    last = format!("thread {tid} {why}");
                    passed_over += 1;
                }
            }
        }
        if start.elapsed() >= bound {
            return Err(InjectError::NoSafePoint {
                pid,
                waited: bound,
                threads,
                tries: passed_over,
                last,
            });
        }
        std::thread::sleep(Duration::from_millis(3));
    }
}

/// The threads of `pid`, the main thread first.
fn threads_of(pid: u32) -> Vec<u32> {
    let mut tids: Vec<u32> = fs::read_dir(format!("/proc/{pid}/task"))
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_by_key(|&tid| (tid != pid, tid));
    tids
}

/// Whether a thread stopped with `regs` is at a safe point: the system call it waits in,
/// or why not.
fn safe_point(
    pid: u32,
    regs: &libc::user_regs_struct,
    loader: &[(u64, u64)],
) -> Result<&'static str, String> {
    if (regs.orig_rax as i64) < 0 {
        return Err("was running, not in a system call".into());
    }
    let Some(&(_, name)) = SAFE_SYSCALLS.iter().find(|(nr, _)| *nr == regs.orig_rax) else {
        return Err(format!("was in system call {}", regs.orig_rax));
    };
    if loader.iter().any(|&(s, e)| (s..e).contains(&regs.rip)) {
        return Err("was inside the dynamic loader".into());
    }
    let mut stack = vec![0u8; STACK_SCAN];
    let read = read_memory(pid, regs.rsp, &mut stack);
    let words = stack[..read]
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()));
    for word in words {
        if loader.iter().any(|&(s, e)| (s..e).contains(&word)) {
            return Err(format!("was in {name} called from the dynamic loader"));
        }
    }
    Ok(name)
}

/// Whether the stack below `rsp` has room for the trampoline ([`STACK_ROOM`]), where the
/// mapping it is in cannot grow.
fn room_below(rsp: u64, fixed: &[(u64, u64)]) -> Result<(), String> {
    match fixed
        .iter()
        .find(|&&(start, end)| start <= rsp && rsp < end)
    {
        Some(&(start, _)) if rsp - start < STACK_ROOM => Err(format!(
            "has {} KiB of stack left, less than the {} KiB the trampoline needs",
            (rsp - start) / 1024,
            STACK_ROOM / 1024
        )),
        _ => Ok(()),
    }
}

/// Reads what it can of the process's memory at `at`; the bytes read.
pub(super) fn read_memory(pid: u32, at: u64, buffer: &mut [u8]) -> usize {
    let local = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    let remote = libc::iovec {
        iov_base: at as *mut libc::c_void,
        iov_len: buffer.len(),
    };
    // SAFETY: reads into our own buffer of that length.
    let read = unsafe { libc::process_vm_readv(pid as i32, &local, 1, &remote, 1, 0) };
    read.max(0) as usize
}

/// A seized thread; let go when dropped (unchanged, unless the trampoline was set up).
struct Seized {
    tid: u32,
    since: Instant,
}

impl Seized {
    fn new(tid: u32) -> Result<Self, InjectError> {
        // SAFETY: PTRACE_SEIZE with no options.
        let rc = unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid as i32, 0, 0) };
        if rc != 0 {
            return Err(InjectError::Seize {
                tid,
                error: std::io::Error::last_os_error(),
            });
        }
        Ok(Seized {
            tid,
            since: Instant::now(),
        })
    }

    /// Stops the thread and reads its registers; `None` if it did not stop in time.
    fn stop(&self) -> Result<Option<libc::user_regs_struct>, InjectError> {
        // SAFETY: PTRACE_INTERRUPT of a thread we seized.
        unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, self.tid as i32, 0, 0) };
        let deadline = Instant::now() + STOP_WAIT;
        loop {
            let mut status = 0;
            // SAFETY: waits for our tracee without blocking.
            let waited = unsafe {
                libc::waitpid(self.tid as i32, &mut status, libc::__WALL | libc::WNOHANG)
            };
            if waited == self.tid as i32 {
                if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                    return Ok(None);
                }
                if libc::WIFSTOPPED(status) && (status >> 16) != libc::PTRACE_EVENT_STOP {
                    // A signal arrived first: let it be delivered, and stop again.
                    let signal = libc::WSTOPSIG(status);
                    // SAFETY: continue our tracee with its own signal.
                    unsafe { libc::ptrace(libc::PTRACE_CONT, self.tid as i32, 0, signal as usize) };
                    // SAFETY: as above.
                    unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, self.tid as i32, 0, 0) };
                    continue;
                }
                break;
            }
            if waited < 0 || Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        // SAFETY: a plain struct the kernel fills.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        // SAFETY: PTRACE_GETREGS into it.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_GETREGS,
                self.tid as i32,
                0,
                &mut regs as *mut libc::user_regs_struct,
            )
        };
        Ok((rc == 0).then_some(regs))
    }

    /// Writes the code and the data block, then points the thread at the code; returns
    /// where the block is. The code and the block are complete before the registers
    /// change: from then on the thread runs the trampoline whether or not cudatrace is
    /// still there (without cudatrace it waits its bound, closes its files and goes on).
    fn run_trampoline(
        &self,
        pid: u32,
        stopped: libc::user_regs_struct,
        code_at: u64,
        call: &Call,
    ) -> Result<u64, InjectError> {
        let resume = trampoline::resume_registers(stopped);
        let block = trampoline::data_block(&resume, call)
            .map_err(|e| InjectError::Trampoline(format!("the name does not fit: {e:?}")))?;
        let code = trampoline::code(&resume);
        let (block_at, _) = trampoline::stack_places(stopped.rsp);
        let memory = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|e| InjectError::Trampoline(format!("opening /proc/{pid}/mem: {e}")))?;
        let write = |bytes: &[u8], at: u64, what: &str| {
            memory
                .write_all_at(bytes, at)
                .map_err(|e| InjectError::Trampoline(format!("writing the {what} at {at:#x}: {e}")))
        };
        write(&block, block_at, "data block")?;
        write(&code, code_at, "trampoline")?;
        let regs = trampoline::trampoline_registers(&stopped, code_at);
        // SAFETY: PTRACE_SETREGS of our stopped tracee.
        let rc = unsafe {
            libc::ptrace(
                libc::PTRACE_SETREGS,
                self.tid as i32,
                0,
                &regs as *const libc::user_regs_struct,
            )
        };
        if rc != 0 {
            return Err(InjectError::Trampoline(format!(
                "setting the registers of thread {}: {}",
                self.tid,
                std::io::Error::last_os_error()
            )));
        }
        Ok(block_at)
    }
}

impl Drop for Seized {
    fn drop(&mut self) {
        // SAFETY: detaches our tracee (stopped or not: a running one is detached when it
        // stops, or when this thread ends).
        unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid as i32, 0, 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_blocking_calls_outside_malloc_and_the_loader_are_safe_points() {
        // SAFETY: a plain struct of integers.
        let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        regs.orig_rax = u64::MAX;
        assert_eq!(
            safe_point(1, &regs, &[]),
            Err("was running, not in a system call".into())
        );
        regs.orig_rax = 9; // mmap: malloc and the loader make it
        assert_eq!(
            safe_point(1, &regs, &[]),
            Err("was in system call 9".into())
        );
        regs.orig_rax = 230;
        regs.rip = 0x5000;
        assert_eq!(
            safe_point(1, &regs, &[(0x4000, 0x6000)]),
            Err("was inside the dynamic loader".into())
        );
        // This thread's own stack, read through process_vm_readv: a loader address on it.
        let fake_return = [0x4242u64; 4];
        regs.rip = 0x9000;
        regs.rsp = fake_return.as_ptr() as u64;
        assert_eq!(
            safe_point(std::process::id(), &regs, &[(0x4000, 0x5000)]),
            Err("was in clock_nanosleep called from the dynamic loader".into())
        );
        assert_eq!(
            safe_point(std::process::id(), &regs, &[(0x6000, 0x7000)]),
            Ok("clock_nanosleep")
        );
        assert_eq!(room_below(0x50000, &[(0x10000, 0x60000)]), Ok(()));
        assert_eq!(
            room_below(0x20000, &[(0x10000, 0x60000)]),
            Err("has 64 KiB of stack left, less than the 128 KiB the trampoline needs".into())
        );
        assert_eq!(room_below(0x20000, &[]), Ok(()), "a [stack] that grows");
        let mut numbers: Vec<u64> = SAFE_SYSCALLS.iter().map(|(nr, _)| *nr).collect();
        numbers.dedup();
        assert_eq!(numbers.len(), SAFE_SYSCALLS.len());
        assert!(!numbers.contains(&9) && !numbers.contains(&11) && !numbers.contains(&12));
    }
}
