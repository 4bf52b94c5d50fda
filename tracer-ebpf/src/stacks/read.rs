//! Reading a traced process's memory into a map value, and fields out of it at offsets the
//! loader gives: each index is masked in assembly, so that the verifier sees it bounded
//! whatever the optimiser proved (older verifiers cannot follow its proofs).

use aya_ebpf::helpers::generated;
use tracer_common::stacks::stack_counter;

use super::bump;

/// Bytes of a read buffer: every read of the walk fits (`tracer_common::stacks::*_READ`).
pub const BUF: usize = 256;

/// Bytes a window read covers below the end of the frame it is for.
pub const WINDOW: usize = 4096;

/// The two window buffers, one after the other: the data stack's from 0, the C stack's from
/// [`UP`]. Each is twice [`WINDOW`], so that a masked length or offset is in it; a frame's
/// fields are read in place, at one masked offset into both.
#[repr(C, align(8))]
pub struct Windows(pub [u8; 4 * WINDOW]);

/// Where the C stack's window starts in [`Windows`].
pub const UP: u64 = 2 * WINDOW as u64;

impl Windows {
    /// The data stack's window (`2 * WINDOW` bytes).
    #[inline(always)]
    pub fn data(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }

    /// The C stack's window (`2 * WINDOW` bytes).
    #[inline(always)]
    pub fn up(&mut self) -> *mut u8 {
        // SAFETY: UP is within the buffer, and 2 * WINDOW bytes follow it.
        unsafe { self.0.as_mut_ptr().add(UP as usize) }
    }

    /// The u64 at byte `offset` (a multiple of 8: the low bits are masked off).
    #[inline(always)]
    pub fn u64_at(&self, offset: u64) -> u64 {
        let at = mask::<{ (4 * WINDOW - 8) as u64 & !7 }>(offset) as usize;
        // SAFETY: `at` is 8-aligned and at most 4 * WINDOW - 8.
        unsafe { core::ptr::read(self.0.as_ptr().add(at).cast::<u64>()) }
    }

    /// The u32 at byte `offset` (a multiple of 4).
    #[inline(always)]
    pub fn u32_at(&self, offset: u64) -> u32 {
        let at = mask::<{ (4 * WINDOW - 4) as u64 & !3 }>(offset) as usize;
        // SAFETY: `at` is 4-aligned and at most 4 * WINDOW - 4.
        unsafe { core::ptr::read(self.0.as_ptr().add(at).cast::<u32>()) }
    }

    /// The byte at `offset`.
    #[inline(always)]
    pub fn u8_at(&self, offset: u64) -> u8 {
        let at = mask::<{ (4 * WINDOW - 1) as u64 }>(offset) as usize;
        // SAFETY: `at` is below 4 * WINDOW.
        unsafe { *self.0.as_ptr().add(at) }
    }
}

/// A read buffer, aligned for the u64 fields read out of it.
#[repr(C, align(8))]
pub struct Buf(pub [u8; BUF]);

/// `x & M`, in assembly so that the mask stays for the verifier. `M` is a power of two
/// less one, its low bits perhaps cleared for alignment (checked at compile time): another
/// value would clear bits of a valid `x`.
#[inline(always)]
pub fn mask<const M: u64>(x: u64) -> u64 {
    const {
        assert!(
            (M | ((1 << M.trailing_zeros()) - 1))
                .wrapping_add(1)
                .is_power_of_two()
        )
    };
    let masked: u64;
    // SAFETY: register arithmetic only.
    unsafe {
        core::arch::asm!(
            "{r} = {x}",
            "{r} &= {m}",
            r = out(reg) masked,
            x = in(reg) x,
            m = const M,
        );
    }
    masked
}

/// Reads `len` bytes at `src` of the current process into `dst`; false when the read
/// failed (a page not resident: a probe cannot fault pages in).
#[inline(always)]
pub fn read_user(dst: *mut u8, len: u32, src: u64) -> bool {
    if src == 0 {
        return false;
    }
    bump(stack_counter::MEMORY_READS, 1);
    bump(stack_counter::MEMORY_READ_BYTES, u64::from(len));
    // SAFETY: the helper checks the source; `dst` is a map value at least `len` bytes long.
    let read =
        unsafe { generated::bpf_probe_read_user(dst.cast(), len, src as *const core::ffi::c_void) };
    if read != 0 {
        bump(stack_counter::READ_FAULTS, 1);
    }
    read == 0
}

/// One u64 of the current process at `src`.
#[inline(always)]
pub fn user_u64(src: u64) -> Option<u64> {
    if src == 0 {
        return None;
    }
    bump(stack_counter::MEMORY_READS, 1);
    bump(stack_counter::MEMORY_READ_BYTES, 8);
    // SAFETY: the helper checks the address.
    let read = unsafe { aya_ebpf::helpers::bpf_probe_read_user(src as *const u64) }.ok();
    if read.is_none() {
        bump(stack_counter::READ_FAULTS, 1);
    }
    read
}

/// One u32 of the current process at `src`.
#[inline(always)]
pub fn user_u32(src: u64) -> Option<u32> {
    if src == 0 {
        return None;
    }
    bump(stack_counter::MEMORY_READS, 1);
    bump(stack_counter::MEMORY_READ_BYTES, 4);
    // SAFETY: the helper checks the address.
    let read = unsafe { aya_ebpf::helpers::bpf_probe_read_user(src as *const u32) }.ok();
    if read.is_none() {
        bump(stack_counter::READ_FAULTS, 1);
    }
    read
}

impl Buf {
    /// The u64 at byte `offset` (a multiple of 8: the low bits are masked off).
    #[inline(always)]
    pub fn u64_at(&self, offset: u32) -> u64 {
        let at = mask::<{ (BUF - 8) as u64 & !7 }>(u64::from(offset)) as usize;
        // SAFETY: `at` is 8-aligned and at most BUF - 8.
        unsafe { core::ptr::read(self.0.as_ptr().add(at).cast::<u64>()) }
    }

    /// The u32 at byte `offset` (a multiple of 4).
    #[inline(always)]
    pub fn u32_at(&self, offset: u32) -> u32 {
        let at = mask::<{ (BUF - 4) as u64 & !3 }>(u64::from(offset)) as usize;
        // SAFETY: `at` is 4-aligned and at most BUF - 4.
        unsafe { core::ptr::read(self.0.as_ptr().add(at).cast::<u32>()) }
    }

    /// The byte at `offset`.
    #[inline(always)]
    pub fn u8_at(&self, offset: u32) -> u8 {
        let at = mask::<{ (BUF - 1) as u64 }>(u64::from(offset)) as usize;
        // SAFETY: `at` is below BUF.
        unsafe { *self.0.as_ptr().add(at) }
    }
}
