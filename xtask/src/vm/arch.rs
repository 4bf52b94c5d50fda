//! The guest's architecture: x86-64 (the host's own, its root shared whole) or arm64
//! (emulated `virt` board, a Debian arm64 root of its own beside the shared workspace).

/// `--arch`: which machine the guests are.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Arch {
    /// The host's own: Debian's amd64 cloud kernels, the host's root, KVM where it can.
    #[default]
    #[value(name = "x86-64")]
    X86_64,
    /// aarch64 under TCG on QEMU's `virt` board: Debian's arm64 cloud kernel, a debootstrapped
    /// bookworm arm64 root, test binaries cross-compiled for aarch64-unknown-linux-gnu.
    Arm64,
}

impl Arch {
    /// Debian's name of the architecture: the suffix of its cloud kernel packages.
    pub(super) fn debian(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The kernels the guests boot, by `major.minor`, and the Debian suite each comes from.
    pub(super) fn kernels(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Arch::X86_64 => &[
                ("5.10", "bullseye"),
                ("6.1", "bookworm-security"),
                ("6.12", "bookworm-backports"),
            ],
            // The arm64 hosts the issue names (GH200, GB200) run 6.x: 6.1 takes the
            // per-symbol path, 6.12 uprobe_multi's (per-process probes, fork children
            // stopped for theirs).
            Arch::Arm64 => &[("6.1", "bookworm-security"), ("6.12", "bookworm-backports")],
        }
    }

    /// What names a kernel of this architecture in the suite tables and the log files:
    /// `6.1` for x86-64, `6.1-arm64` for arm64.
    pub(super) fn label(self, version: &str) -> String {
        match self {
            Arch::X86_64 => version.to_owned(),
            Arch::Arm64 => format!("{version}-arm64"),
        }
    }

    /// The bookworm-backports package of QEMU's emulator for this architecture, and the
    /// binary in it.
    pub(super) fn qemu(self) -> (&'static str, &'static str) {
        match self {
            Arch::X86_64 => ("qemu-system-x86", "qemu-system-x86_64"),
            Arch::Arm64 => ("qemu-system-arm", "qemu-system-aarch64"),
        }
    }

    /// The board and CPU under TCG. `pauth-impdef=on`: the CPU's pointer authentication with
    /// QEMU's own cheap hash instead of the architected QARMA, which costs TCG much time in
    /// every function that signs its return address.
    pub(super) fn tcg_machine(self) -> &'static [&'static str] {
        match self {
            Arch::X86_64 => &["-accel", "tcg", "-cpu", "max"],
            Arch::Arm64 => &["-M", "virt", "-accel", "tcg", "-cpu", "max,pauth-impdef=on"],
        }
    }

    /// The guest's serial ports (the console is the first, the results port the second).
    pub(super) fn serial(self) -> &'static str {
        match self {
            Arch::X86_64 => "ttyS",
            // QEMU 10's `virt` board has a second PL011 when given a second -serial.
            Arch::Arm64 => "ttyAMA",
        }
    }

    /// The Rust target the test binaries are cross-compiled for, if not the host's.
    pub(super) fn rust_target(self) -> Option<&'static str> {
        match self {
            Arch::X86_64 => None,
            Arch::Arm64 => Some(crate::arm64::TARGET),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arm64_kernels_are_labelled_apart_from_x86_64s() {
        assert_eq!(Arch::X86_64.label("6.1"), "6.1");
        assert_eq!(Arch::Arm64.label("6.1"), "6.1-arm64");
        assert!(
            Arch::Arm64
                .kernels()
                .iter()
                .all(|(v, _)| Arch::X86_64.kernels().iter().any(|(x, _)| x == v))
        );
    }
}
