use super::*;
use crate::schema::{CallLine, Hex};
use proptest::prelude::*;

/// What serde_json makes of `line`, for comparison.
fn serde_json_reads(line: &[u8]) -> Option<CallLine> {
    serde_json::from_slice(line).ok()
}

fn from_str<'de, T: Deserialize<'de>>(line: &'de str) -> Option<T> {
    from_bytes(line.as_bytes())
}

#[test]
fn lines_the_writer_writes_are_read_whole() {
    let call = CallLine {
        name: "cuLaunchKernel".into(),
        pid: 7,
        tid: 8,
        ts_ns: u64::MAX,
        dur_ns: Some(0),
        ret: Some(719),
        ret_name: Some("CUDA_ERROR_LAUNCH_FAILED".into()),
        grid: Some([1, 2, 3]),
        block: Some([4294967295, 0, 1]),
        stream: Some(Hex(0x10)),
        function: Some(Hex(u64::MAX)),
        kernel: Some("void k<(char)1>(int, float*) ü ∑".into()),
        device: Some(-1),
        version: Some(i32::MIN + 1),
        warnings: vec!["entry_read_failed".into(), "name_truncated".into()],
        ..CallLine::default()
    };
    let line = serde_json::to_string(&call).unwrap();
    assert_eq!(from_str::<CallLine>(&line), Some(call));
}

#[test]
fn anything_else_is_left_to_serde_json() {
    for line in [
        // An escape, whitespace, null, a float, a leading zero, -0, a nested object,
        // trailing bytes, a duplicate key, an overflow, a bad pointer, a missing field.
        r#"{"type":"call","name":"cu\"Init","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0}"#,
        r#"{"type":"call", "name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0}"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"kind":null}"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"bytes":1.0}"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"bytes":1e3}"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":01,"dur_ns":1,"ret":0}"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"device":-0}"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"x":{"a":1}}"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0}x"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"ret":1}"#,
        r#"{"type":"call","name":"cuInit","pid":4294967296,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0}"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"dptr":"0xzz"}"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"dur_ns":1,"ret":0}"#,
        r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"grid":[1,2]}"#,
        "{\"type\":\"call\",\"name\":\"cu\tInit\",\"pid\":1,\"tid\":1,\"ts_ns\":1,\"dur_ns\":1,\"ret\":0}",
    ] {
        assert_eq!(from_str::<CallLine>(line), None, "{line}");
    }
    // Bytes that are not UTF-8, inside strings: "cuInit" and, far into the line, the
    // kernel name.
    for at in [23, 100] {
        let mut line = format!(
            r#"{{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"kernel":"{}"}}"#,
            "k".repeat(64)
        )
        .into_bytes();
        line[at] = 0xff;
        assert_eq!(from_bytes::<CallLine>(&line), None, "{at}");
        assert_eq!(serde_json_reads(&line), None, "{at}");
    }
    // A key this version does not know, with a plain value, is skipped as serde does.
    let line = r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0,"new":"x","newer":-5}"#;
    assert_eq!(
        from_str::<CallLine>(line),
        serde_json_reads(line.as_bytes())
    );
    assert!(from_str::<CallLine>(line).is_some());
}

/// GPU activity lines (a flattened part, booleans, negative numbers), as the writer
/// writes them and as the test traces have them: read whole, as serde_json reads them.
#[test]
fn gpu_lines_are_read_as_serde_json_reads_them() {
    use crate::schema::{GpuCopyLine, GpuKernelLine, GpuLink, GpuMemsetLine};
    let link = GpuLink {
        correlation_id: 9,
        graph_id: Some(2),
        graph_node_id: Some(1 << 40),
        call_tid: Some(301),
        call_ts_ns: Some(u64::MAX),
        capture_call_tid: Some(302),
        capture_call_ts_ns: Some(17),
        queued_ns: Some(-200),
        unlinked: None,
        warnings: vec!["name_truncated".into()],
    };
    let kernel = GpuKernelLine {
        pid: 300,
        stream: 7,
        ts_ns: 5,
        dur_ns: 6,
        kernel: "gemm()".into(),
        kernel_mangled: Some("_Z4gemmv".into()),
        cupti_kernel: Some("_Z5stalev".into()),
        grid: [4, 1, 1],
        link: link.clone(),
        ..GpuKernelLine::default()
    };
    let copy = GpuCopyLine {
        pid: 300,
        kind: "HtoD".into(),
        bytes: 4096,
        is_async: true,
        link: GpuLink {
            unlinked: Some("no_call_record".into()),
            ..GpuLink::default()
        },
        ..GpuCopyLine::default()
    };
    let line = serde_json::to_string(&kernel).unwrap();
    assert_eq!(from_str::<GpuKernelLine>(&line), Some(kernel));
    let line = serde_json::to_string(&copy).unwrap();
    assert_eq!(from_str::<GpuCopyLine>(&line), Some(copy));
    let mut read = 0;
    for line in crate::test_traces::gpu().lines() {
        let kernel = from_str::<GpuKernelLine>(line);
        let copy = from_str::<GpuCopyLine>(line);
        let memset = from_str::<GpuMemsetLine>(line);
        if line.starts_with(r#"{"type":"gpu_kernel""#) {
            assert!(kernel.is_some(), "{line}");
        }
        read += usize::from(kernel.is_some() || copy.is_some() || memset.is_some());
        assert_eq!(kernel, serde_json::from_str(line).ok(), "{line}");
        assert_eq!(copy, serde_json::from_str(line).ok(), "{line}");
        assert_eq!(memset, serde_json::from_str(line).ok(), "{line}");
    }
    assert!(read >= 3, "{read} GPU lines read");
}

/// Over a call with every field set, a line with a few fields leaves none of the
/// others behind.
#[test]
fn reading_in_place_over_every_field_leaves_none_behind() {
    use crate::schema::testing::{every_field, field_names};
    let mut place = every_field(&[
        serde_json::json!("0x7f00ab"),
        serde_json::json!([4, 1, 65535]),
        serde_json::json!(["0x1"]),
        serde_json::json!(7),
    ]);
    let set = serde_json::to_value(&place).unwrap();
    assert_eq!(
        set.as_object().unwrap().len(),
        field_names::<CallLine>().len()
    );
    let line = r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":1,"dur_ns":1,"ret":0}"#;
    assert!(from_bytes_in_place(line.as_bytes(), &mut place));
    assert_eq!(Some(place), from_str::<CallLine>(line));
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9_:<>(), *&]{0,40}",
        // Escapes, quotes, controls and non-ASCII: serde_json's to write and read.
        ".{0,12}",
        Just("\"\\\n\u{1}é".to_owned()),
    ]
}

prop_compose! {
    fn call_line()(
        name in text(),
        (pid, tid, ts_ns, dur_ns, ret) in (any::<u32>(), any::<u32>(), any::<u64>(), proptest::option::of(any::<u64>()), proptest::option::of(any::<u32>())),
        kind in proptest::option::of(text()),
        bytes in proptest::option::of(any::<u64>()),
        dptr in proptest::option::of(any::<u64>()),
        grid in proptest::option::of(any::<[u32; 3]>()),
        kernel in proptest::option::of(text()),
        device in proptest::option::of(any::<i32>()),
        warnings in proptest::collection::vec(text(), 0..3),
    ) -> CallLine {
        CallLine {
            name,
            pid,
            tid,
            ts_ns,
            dur_ns,
            ret,
            kind: kind.map(Into::into),
            bytes,
            dptr: dptr.map(Hex),
            grid,
            kernel,
            device,
            warnings: warnings.into_iter().map(Into::into).collect(),
            ..CallLine::default()
        }
    }
}

proptest! {
    /// Written lines, and the same lines cut or with a byte changed: where the compact
    /// reader reads a line it reads what serde_json reads; where serde_json rejects one
    /// it gives up.
    #[test]
    fn it_agrees_with_serde_json(call in call_line(), cut in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let line = serde_json::to_string(&call).unwrap();
        match from_str::<CallLine>(&line) {
            Some(read) => prop_assert_eq!(&read, &call),
            // Only escapes (quotes, backslashes, control characters) are left over.
            None => prop_assert!(line.contains('\\'), "{}", line),
        }
        let mut changed = line.clone().into_bytes();
        let at = cut.index(changed.len());
        changed[at] = byte;
        // Bytes that are not UTF-8 too: serde_json rejects them, and so must this.
        for variant in [&line.as_bytes()[..at], &changed[..]] {
            let compact = from_bytes::<CallLine>(variant);
            if compact.is_some() {
                prop_assert_eq!(compact, serde_json_reads(variant), "{}", String::from_utf8_lossy(variant));
            }
        }
    }

    /// Read into the place of another call, a line leaves nothing of that call behind:
    /// the place ends equal to the line read afresh, field for field.
    #[test]
    fn reading_in_place_leaves_nothing_of_the_call_before(call in call_line(), before in call_line()) {
        let line = serde_json::to_string(&call).unwrap();
        let mut place = before;
        match from_str::<CallLine>(&line) {
            Some(fresh) => {
                prop_assert!(from_bytes_in_place(line.as_bytes(), &mut place), "{}", line);
                prop_assert_eq!(&place, &fresh);
            }
            None => prop_assert!(!from_bytes_in_place(line.as_bytes(), &mut place), "{}", line),
        }
    }
}
