//! Decoding calls of the catalog from hand-made events.

use super::*;
use crate::catalog::lookup;
use tracer_common::EventHeader;

fn call(args: &[u64], outs: [u64; 2], ret: u32) -> CallEvent {
    let mut words = [0u64; 10];
    words[..args.len()].copy_from_slice(args);
    CallEvent {
        header: EventHeader {
            kind: 1,
            flags: 0,
            ts_ns: 1000,
            pid: 10,
            tid: 11,
        },
        probe_id: 0,
        ret,
        dur_ns: 250,
        args: words,
        outs,
    }
}

fn json(record: &CallLine) -> String {
    serde_json::to_string(record).unwrap()
}

#[test]
fn mem_alloc_reports_bytes_and_the_returned_pointer() {
    let spec = lookup("cuMemAlloc_v2").unwrap();
    let record = decode_call(
        &call(&[0x7ffd_0000, 4096], [0x7f00_0010_0000, 0], 0),
        None,
        "cuMemAlloc_v2",
        spec,
    );
    assert_eq!(
        json(&record),
        r#"{"type":"call","name":"cuMemAlloc_v2","pid":10,"tid":11,"ts_ns":1000,"dur_ns":250,"ret":0,"bytes":4096,"dptr":"0x7f0000100000"}"#
    );
}

#[test]
fn errors_carry_their_name() {
    let spec = lookup("cuMemAlloc_v2").unwrap();
    let record = decode_call(
        &call(&[0x7ffd_0000, 0], [0, 0], 1),
        None,
        "cuMemAlloc_v2",
        spec,
    );
    assert_eq!(record.ret_name.as_deref(), Some("CUDA_ERROR_INVALID_VALUE"));
}

#[test]
fn launch_kernel_reads_all_eleven_arguments() {
    let spec = lookup("cuLaunchKernel").unwrap();
    let record = decode_call(
        &call(
            &[0x1030, 4096, 2, 1, 256, 1, 3, 1024, 0x1010, 0x7ffe],
            [0, 0],
            0,
        ),
        None,
        "cuLaunchKernel",
        spec,
    );
    assert_eq!(record.function, Some(Hex(0x1030)));
    assert_eq!(record.grid, Some([4096, 2, 1]));
    assert_eq!(record.block, Some([256, 1, 3]));
    assert_eq!(record.shared_mem, Some(1024));
    assert_eq!(record.stream, Some(Hex(0x1010)));
}

#[test]
fn a_call_seen_at_entry_alone_has_no_result_nor_duration() {
    let spec = lookup("cuLaunchKernel").unwrap();
    // The entry program leaves 0 in `ret` and `dur_ns`; a stray value must not show.
    let mut event = call(
        &[0x1030, 64, 1, 1, 128, 1, 1, 0, 0x1010, 0x7ffe],
        [0, 0],
        400,
    );
    event.header.flags = flags::NO_RETURN;
    let record = decode_call(&event, None, "cuLaunchKernel", spec);
    assert_eq!(
        json(&record),
        r#"{"type":"call","name":"cuLaunchKernel","pid":10,"tid":11,"ts_ns":1000,"grid":[64,1,1],"block":[128,1,1],"shared_mem":0,"stream":"0x1010","function":"0x1030"}"#
    );
    event.header.flags = 0;
    let returned = decode_call(&event, None, "cuLaunchKernel", spec);
    assert_eq!(
        (returned.ret, returned.dur_ns, returned.ret_name.as_deref()),
        (Some(400), Some(250), Some("CUDA_ERROR_INVALID_HANDLE"))
    );
}

#[test]
fn launch_kernel_ex_reads_its_config() {
    let spec = lookup("cuLaunchKernelEx").unwrap();
    let mut config = Vec::new();
    for value in [128u32, 64, 2, 32, 8, 4, 2048, 0] {
        config.extend_from_slice(&value.to_le_bytes());
    }
    config.extend_from_slice(&0x1010u64.to_le_bytes());
    config.extend_from_slice(&[0; 16]);
    let record = decode_call(
        &call(&[0x7ffc, 0x1030], [0, 0], 0),
        Some(&config),
        "cuLaunchKernelEx",
        spec,
    );
    assert_eq!(record.grid, Some([128, 64, 2]));
    assert_eq!(record.block, Some([32, 8, 4]));
    assert_eq!(record.shared_mem, Some(2048));
    assert_eq!(record.stream, Some(Hex(0x1010)));
    assert_eq!(record.function, Some(Hex(0x1030)));
    assert!(record.warnings.is_empty());
    let short = decode_call(
        &call(&[0, 0x1030], [0, 0], 0),
        Some(&[1, 2]),
        "cuLaunchKernelEx",
        spec,
    );
    assert_eq!(short.warnings, vec!["launch_config_unread"]);
}

#[test]
fn memcpy2d_gives_direction_and_bytes() {
    let spec = lookup("cuMemcpy2D_v2").unwrap();
    let mut data = vec![0u8; 128];
    data[16..20].copy_from_slice(&1u32.to_le_bytes()); // src host
    data[24..32].copy_from_slice(&0x5555u64.to_le_bytes());
    data[72..76].copy_from_slice(&2u32.to_le_bytes()); // dst device
    data[88..96].copy_from_slice(&0x7f00_0010_0000u64.to_le_bytes());
    data[112..120].copy_from_slice(&256u64.to_le_bytes());
    data[120..128].copy_from_slice(&16u64.to_le_bytes());
    let record = decode_call(
        &call(&[0x7ffc], [0, 0], 0),
        Some(&data),
        "cuMemcpy2D_v2",
        spec,
    );
    assert_eq!(record.kind.as_deref(), Some("HtoD"));
    assert_eq!(record.src, Some(Hex(0x5555)));
    assert_eq!(record.dst, Some(Hex(0x7f00_0010_0000)));
    assert_eq!(record.bytes, Some(4096));
}

#[test]
fn memset_bytes_scale_with_element_width() {
    let spec = lookup("cuMemsetD32_v2").unwrap();
    let record = decode_call(
        &call(&[0x7f00, 7, 100], [0, 0], 0),
        None,
        "cuMemsetD32_v2",
        spec,
    );
    assert_eq!(
        (record.count, record.bytes, record.value),
        (Some(100), Some(400), Some(7))
    );
}

#[test]
fn names_and_truncation_are_reported() {
    let spec = lookup("cuModuleGetFunction").unwrap();
    let mut event = call(&[0x7ffc, 0x1020, 0x4000], [0x1030, 0], 0);
    event.header.flags = flags::DATA_TRUNCATED;
    let record = decode_call(&event, Some(b"_Z3foov\0"), "cuModuleGetFunction", spec);
    assert_eq!(record.symbol.as_deref(), Some("_Z3foov"));
    assert_eq!(record.function, Some(Hex(0x1030)));
    assert_eq!(record.module, Some(Hex(0x1020)));
    assert_eq!(record.warnings, vec!["string_truncated"]);
}

const DIRTY: u64 = 0xdead_beef_0000_0000;

#[test]
fn narrow_arguments_ignore_the_upper_bits_of_their_slot() {
    let spec = lookup("cuLaunchKernel").unwrap();
    let words = [
        0x1030,
        DIRTY | 4096,
        DIRTY | 2,
        DIRTY | 1,
        DIRTY | 256,
        DIRTY | 1,
        DIRTY | 3,
        DIRTY | 1024,
        0x1010,
        0x7ffe,
    ];
    let record = decode_call(&call(&words, [0, 0], 0), None, "cuLaunchKernel", spec);
    assert_eq!(
        (record.grid, record.block, record.shared_mem),
        (Some([4096, 2, 1]), Some([256, 1, 3]), Some(1024))
    );
    let spec = lookup("cuLibraryLoadData").unwrap();
    let words = [0x7ffc, 0x5000, 0, 0, DIRTY | 3, 0, 0, DIRTY | 2];
    let record = decode_call(
        &call(&words, [0x1040, 0], 0),
        None,
        "cuLibraryLoadData",
        spec,
    );
    assert_eq!(
        (record.count, record.library_option_count, record.flags),
        (Some(3), Some(2), None)
    );
    let spec = lookup("cuMemsetD8_v2").unwrap();
    let words = [0x7f00, 0xdead_beef_cafe_baab, 16];
    let record = decode_call(&call(&words, [0, 0], 0), None, "cuMemsetD8_v2", spec);
    assert_eq!(record.value, Some(0xab));
    let spec = lookup("cuStreamCreateWithPriority").unwrap();
    let words = [0x7ffc, DIRTY | 1, DIRTY | u64::from(-3i32 as u32)];
    let record = decode_call(&call(&words, [0x1000, 0], 0), None, "x", spec);
    assert_eq!((record.flags, record.priority), (Some(1), Some(-3)));
}

#[test]
fn ipc_locations_batches_and_graphs_are_decoded() {
    // The handle passed by value sits in the stack words (args 6..10).
    let spec = lookup("cuIpcOpenMemHandle_v2").unwrap();
    let words = [
        0x7ffc,
        1,
        0,
        0,
        0,
        0,
        0x0807_0605_0403_0201,
        0x1817_1615_1413_1211,
        0,
        u64::MAX,
    ];
    let record = decode_call(&call(&words, [0x7e00_0000_0000, 0], 0), None, "x", spec);
    assert_eq!(
        record.ipc_handle.as_deref(),
        Some("01020304050607081112131415161718".to_owned() + &"00".repeat(8) + &"ff".repeat(8))
            .as_deref()
    );
    assert_eq!(
        (record.dptr, record.flags),
        (Some(Hex(0x7e00_0000_0000)), Some(1))
    );

    let spec = lookup("cuIpcGetMemHandle").unwrap();
    let record = decode_call(
        &call(&[0x7ffc, 0x7f00], [0, 0], 0),
        Some(&[0xab; 64]),
        "x",
        spec,
    );
    assert_eq!(record.ipc_handle, Some("ab".repeat(64)));
    let short = decode_call(&call(&[0x7ffc, 0x7f00], [0, 0], 0), Some(&[]), "x", spec);
    assert_eq!(short.warnings, ["ipc_handle_unread"]);

    // CUmemLocation {type 3, id 7} in one register.
    let spec = lookup("cuMemAdvise_v2").unwrap();
    let words = [0x7f00, 4096, DIRTY_ADVICE | 3, (7 << 32) | 3];
    let record = decode_call(&call(&words, [0, 0], 0), None, "x", spec);
    assert_eq!(
        (
            record.advice,
            record.advice_name.as_deref(),
            record.location.as_deref(),
            record.location_id
        ),
        (
            Some(3),
            Some("CU_MEM_ADVISE_SET_PREFERRED_LOCATION"),
            Some("host_numa"),
            Some(7)
        )
    );

    let spec = lookup("cuMemcpyBatchAsync_v2").unwrap();
    let sizes: Vec<u8> = [4096u64, 512, 100]
        .iter()
        .flat_map(|s| s.to_le_bytes())
        .collect();
    let words = [0x1, 0x2, 0x3, 3, 0, 0, 0, 0x1010];
    let record = decode_call(&call(&words, [0, 0], 0), Some(&sizes), "x", spec);
    assert_eq!(
        (
            record.bytes,
            record.count,
            record.stream,
            record.kind.as_deref()
        ),
        (Some(4708), Some(3), Some(Hex(0x1010)), Some("Default"))
    );
    let words = [0x1, 0x2, 0x3, 40, 0, 0, 0, 0x1010];
    let record = decode_call(&call(&words, [0, 0], 0), Some(&[0; 256]), "x", spec);
    assert_eq!(record.bytes, None);
    assert_eq!(record.warnings, ["batch_sizes_cut"]);

    let spec = lookup("cuGraphExecUpdate_v2").unwrap();
    let record = decode_call(
        &call(&[0x1020, 0x5000, 0x7ffc], [1, 0], 910),
        None,
        "x",
        spec,
    );
    assert_eq!(
        (record.graph, record.source_graph, record.graph_result),
        (Some(Hex(0x1020)), Some(Hex(0x5000)), Some(1))
    );
}

const DIRTY_ADVICE: u64 = 0xffff_ffff_0000_0000;

#[test]
fn functions_outside_the_catalog_keep_their_raw_registers() {
    let words = [1, 2, 3, 0xdead_beef_0000_0004, 5, 6, 7, 8];
    let record = decode_call(
        &call(&words, [0, 0], 0),
        None,
        "cuCtxGetDevice",
        &crate::catalog::GENERIC,
    );
    assert_eq!(
        json(&record),
        r#"{"type":"call","name":"cuCtxGetDevice","pid":10,"tid":11,"ts_ns":1000,"dur_ns":250,"ret":0,"args":["0x1","0x2","0x3","0xdeadbeef00000004","0x5","0x6"]}"#
    );
}

#[test]
fn hex_round_trips_through_json() {
    let text = serde_json::to_string(&Hex(0xdead_beef)).unwrap();
    assert_eq!(text, r#""0xdeadbeef""#);
    assert_eq!(
        serde_json::from_str::<Hex>(&text).unwrap(),
        Hex(0xdead_beef)
    );
}
