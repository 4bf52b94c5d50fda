use super::{Arg, debug_annotation, debug_annotation_len, wire};

/// Every kind of value, named by iid or in full, short and long: the length is what
/// is written.
#[test]
fn annotation_lengths_are_what_is_written() {
    let long = "k".repeat(300);
    let values = [
        Arg::Bool(true),
        Arg::Unsigned(0),
        Arg::Unsigned(u64::MAX),
        Arg::Signed(-1),
        Arg::Float(1.5),
        Arg::Text(""),
        Arg::Text(&long),
        Arg::Hex(0),
        Arg::Hex(0x7f00_0000_1234),
        Arg::Hex(u64::MAX),
        Arg::Json("[1,2,3]"),
    ];
    for value in values {
        for (key, iid) in [("bytes", Some(1)), ("bytes", Some(300)), ("name", None)] {
            let mut written = Vec::new();
            debug_annotation(&mut written, key, iid, value);
            assert_eq!(
                written.len(),
                debug_annotation_len(key, iid, value),
                "{value:?}"
            );
        }
    }
}

/// A nested message's length takes the width it needs, whatever was set aside for it,
/// as prost writes it.
#[test]
fn nested_lengths_are_written_as_prost_writes_them() {
    for length in [0, 1, 127, 128, 16_383, 16_384, 300_000] {
        let body = vec![7u8; length];
        let mut expected = vec![1u8];
        prost::encoding::bytes::encode(4, &body, &mut expected);
        for guess in [1, 2, 3] {
            let mut written = vec![1u8];
            wire::message(&mut written, 4, guess, |buf| buf.extend_from_slice(&body));
            assert!(written == expected, "length {length}, guess {guess}");
        }
    }
}
