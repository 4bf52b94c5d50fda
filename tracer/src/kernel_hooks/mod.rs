//! `--kernel`: what the NVIDIA kernel module does for the traced processes.
//!
//! Two mechanisms, chosen per kernel: kprobes and kretprobes on the module's functions
//! where the kernel has kprobes, and everywhere the syscall tracepoints, which see the
//! ioctls and mmaps of `/dev/nvidia*` files (the driver's whole user interface, launches
//! aside: those are doorbell writes that never enter the kernel). `nvidia:nvidia_dev_xid`
//! adds Xid errors when the module provides it.
//!
//! | file | |
//! |---|---|
//! | `choice.rs` | `--kernel-hooks`: which mechanism, which functions, and why |
//! | `attach.rs` | attaching them; kallsyms; a `-p` target's open device files |
//!
//! Decoding what they report is `events/driver.rs`'s.

mod attach;
mod choice;

pub use attach::{INTERRUPT_FUNCTIONS, attach, kallsyms, seed_open_fds};
pub use choice::{HookChoice, KernelSupport, plan};

/// The default device path prefix.
pub const DEVICE_PREFIX: &str = "/dev/nvidia";
