//! cudatrace's eBPF side: one generic uprobe/uretprobe pair that every libcuda symbol is
//! attached to (the attach cookie says which one, or before 5.15 the address it fired at:
//! `identity.rs`; the `SPECS` map says how to read its arguments), plus process-tree tracking from scheduler tracepoints, library discovery and
//! race-free stops for attaching (`discovery.rs`), the GPU activity records the
//! injection library hands over (`gpu.rs`), and the calls' Python stacks (`stacks/`).
//!
//! The probe catalog lives in userspace as data; nothing here knows a CUDA function by name.
#![no_std]
#![no_main]
// The atomic add in `maps.rs` (the crate is built with RUSTC_BOOTSTRAP=1, as aya-ebpf
// needs).
#![feature(asm_experimental_arch)]

mod call_event;
mod calls;
mod discovery;
mod driver;
mod gpu;
mod identity;
mod maps;
mod process;
mod regs;
mod stacks;
mod zero;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic path, so this is never executed.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
