//! Zeroes without `memset`. LLVM turns a zeroed array, or adjacent zero stores of 16 bytes
//! or more, into a `memset` (and it knows a zero written through a volatile store when it
//! copies the value on); bpf-linker has LLVM expand `memcpy` in order, which leaves every
//! `memset` a call to aya-ebpf's own, a loop of 5 instructions a byte. On a call's path
//! that was hundreds of instructions a call (`call_enter`: the arguments beyond the
//! registers, the outputs, the stack record's hash) and 80 a frame walked. A zero read
//! through a volatile load is a value LLVM cannot see: its stores stay one a word. The
//! tracer's `the_call_and_walk_programs_call_no_memset` reads the object for such calls.

/// A zero that LLVM cannot see as a constant.
#[inline(always)]
pub fn opaque() -> u64 {
    let zero = 0u64;
    // SAFETY: a read of a local.
    unsafe { core::ptr::read_volatile(&zero) }
}

/// `[0; N]`, a store a word.
#[inline(always)]
pub fn zeros<const N: usize>() -> [u64; N] {
    [opaque(); N]
}
