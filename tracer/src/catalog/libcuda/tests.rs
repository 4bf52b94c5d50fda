//! The libcuda catalog's own tests: what each probe reads.

use super::*;
use tracer_common::{ProbeSpec, capture};

#[test]
fn launch_kernel_reads_stack_arguments_and_no_memory() {
    let spec = lookup("cuLaunchKernel_ptsz").unwrap().probe_spec();
    assert_eq!(
        spec,
        ProbeSpec {
            nargs: 9,
            ..ProbeSpec::default()
        }
    );
}

#[test]
fn cooperative_launches_read_what_plain_launches_read() {
    let plain = lookup("cuLaunchKernel").unwrap().probe_spec();
    assert_eq!(
        lookup("cuLaunchCooperativeKernel_ptsz")
            .unwrap()
            .probe_spec(),
        plain
    );
    let data = lookup("cuLibraryLoadData").unwrap().probe_spec();
    assert_eq!(
        (data.nargs, data.out_args, data.capture),
        (8, [1, 0], capture::NONE)
    );
    let file = lookup("cuLibraryLoadFromFile").unwrap().probe_spec();
    assert_eq!(
        (file.nargs, file.capture, file.capture_arg),
        (8, capture::CSTR, 1)
    );
}

#[test]
fn launch_kernel_ex_captures_its_config() {
    let spec = lookup("cuLaunchKernelEx").unwrap().probe_spec();
    assert_eq!(spec.capture, capture::STRUCT);
    assert_eq!(spec.capture_arg, 0);
    assert_eq!(spec.capture_len, 56);
}

/// An entry-only launch has no return probe: nothing of it may be read at return (an
/// output), and what it captures (`cuLaunchKernelEx`'s config, the caller's memory) is
/// read at entry.
#[test]
fn entry_only_launches_are_launches_with_nothing_to_read_at_return() {
    let entry_only: Vec<&str> = CATALOG
        .iter()
        .filter(|spec| spec.is_entry_only_launch())
        .map(|spec| spec.name())
        .collect();
    assert_eq!(entry_only, crate::catalog::ENTRY_ONLY_LAUNCHES);
    for name in entry_only {
        let spec = lookup(name).unwrap();
        assert_eq!(spec.family, Family::Launch, "{name}");
        assert!(!spec.args.iter().any(Arg::is_output), "{name}");
        let probe = spec.probe_spec();
        assert_eq!(probe.out_args, [0, 0], "{name}");
        assert!(
            probe.capture == capture::NONE
                || (probe.capture == capture::STRUCT && spec.args.contains(&LaunchConfig)),
            "{name}"
        );
        assert!(
            lookup(&format!("{name}_ptsz"))
                .unwrap()
                .is_entry_only_launch()
        );
    }
    for name in [
        "cuGraphInstantiateWithFlags",
        "cuGraphExecUpdate_v2",
        "cuMemAlloc_v2",
    ] {
        assert!(!lookup(name).unwrap().is_entry_only_launch(), "{name}");
    }
}

#[test]
fn get_function_captures_name_and_reads_handle_at_return() {
    let spec = lookup("cuModuleGetFunction").unwrap().probe_spec();
    assert_eq!(spec.capture, capture::CSTR);
    assert_eq!(spec.capture_arg, 2);
    assert_eq!(spec.out_args, [1, 0]);
    let pitch = lookup("cuMemAllocPitch_v2").unwrap().probe_spec();
    assert_eq!(pitch.out_args, [1, 2]);
}

#[test]
fn stream_variants_resolve_to_their_function() {
    assert_eq!(
        lookup("cuMemcpyHtoDAsync_v2_ptsz").unwrap().name(),
        "cuMemcpyHtoDAsync_v2"
    );
    assert_eq!(
        lookup("cuMemcpyHtoD_v2_ptds").unwrap().name(),
        "cuMemcpyHtoD_v2"
    );
    assert!(lookup("cuNotAFunction").is_none());
}

/// arm64 passes the 64-byte handle as a pointer to a copy in the second register (AAPCS64
/// B.4): the row reads 32 bytes through it, and Flags moves to the third register.
#[test]
fn ipc_open_reads_its_handle_through_a_pointer_on_arm64() {
    let arm64 = FnSpec {
        args: IPC_OPEN_AAPCS64,
        ..f(&["cuIpcOpenMemHandle"], Family::Memory, &[])
    };
    let spec = arm64.probe_spec();
    assert_eq!(
        (spec.nargs, spec.capture, spec.capture_arg, spec.capture_len),
        (3, capture::STRUCT, 1, 32)
    );
    assert_eq!(spec.out_args, [1, 0]);
    assert!(spec.nargs as usize <= tracer_common::arch::AARCH64.register_args());
    let ours = lookup("cuIpcOpenMemHandle").unwrap();
    if cfg!(target_arch = "aarch64") {
        assert!(std::ptr::eq(ours.args, IPC_OPEN_AAPCS64));
    } else {
        assert_eq!(ours.args[6], IpcHandleOnStack);
        assert_eq!(ours.args[1], U32(Flags));
    }
}
