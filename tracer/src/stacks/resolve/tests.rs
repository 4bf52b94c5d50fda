use tracer_common::{EventHeader, kind, stacks::code_flags};

use super::*;

/// A 3.11 code record: `qualname` in `file`, defined at `first`, every unit on line
/// `first + unit / 2` (one entry of code 11 per two units).
fn code(capture: u64, file: &str, qualname: &str, first: i32, units: usize) -> (CodeHead, Vec<u8>) {
    let mut table = vec![0x80 | (10 << 3) | 1];
    table.extend(std::iter::repeat_n(0x80 | (11 << 3) | 1, units / 2));
    let head = CodeHead {
        header: EventHeader {
            kind: kind::CODE,
            flags: 11,
            ..EventHeader::default()
        },
        capture,
        first_line: first,
        first_traceable: 2,
        filename_len: file.len() as u32,
        qualname_len: qualname.len() as u32,
        linetable_len: table.len() as u32,
        filename_kind: 1,
        qualname_kind: 1,
        ..CodeHead::default()
    };
    let mut data = file.as_bytes().to_vec();
    data.extend_from_slice(qualname.as_bytes());
    data.extend_from_slice(&table);
    (head, data)
}

fn stack(tid: u32, ts_ns: u64, hash: u64, flags: u32, nframes: u32) -> StackEvent {
    StackEvent {
        header: EventHeader {
            kind: kind::STACK,
            ts_ns,
            pid: 7,
            tid,
            ..EventHeader::default()
        },
        generation: 1,
        hash: [hash, hash],
        status: stack_status::OK,
        flags,
        nframes,
        probe_id: 0,
    }
}

fn frame(capture: u64, unit: i32) -> RawPyFrame {
    RawPyFrame {
        capture,
        unit,
        ..RawPyFrame::default()
    }
}

fn resolver() -> Resolver {
    let mut resolver = Resolver::default();
    for (capture, file, qualname, first) in [
        (1, "/w/model.py", "Block.forward", 10),
        (2, "/w/run.py", "<module>", 1),
    ] {
        let (head, data) = code(capture, file, qualname, first, 40);
        resolver.code(&head, &data);
    }
    resolver
}

#[test]
fn a_new_stack_is_written_once_and_named_by_later_calls() {
    let mut resolver = resolver();
    let frames = [frame(1, 7), frame(2, 12)];
    let line = resolver
        .stack(&stack(5, 100, 9, 0, 2), &frames, Reason::NotPython)
        .unwrap();
    assert_eq!(
        serde_json::to_string(&line).unwrap(),
        r#"{"type":"stack","id":1,"frames":[{"file":"/w/model.py","qualname":"Block.forward","line":13,"first_line":10},{"file":"/w/run.py","qualname":"<module>","line":7,"first_line":1}]}"#
    );
    assert_eq!(resolver.take(5, 100, true), Some(1));
    // Known to the probes: the hash alone, the same id, no new line.
    assert_eq!(
        resolver.stack(
            &stack(5, 200, 9, stack_flags::KNOWN, 0),
            &[],
            Reason::NotPython
        ),
        None
    );
    assert_eq!(resolver.take(5, 200, true), Some(1));
    // The same frames in another process image (another hash): no new line either.
    assert_eq!(
        resolver.stack(&stack(6, 300, 10, 0, 2), &frames, Reason::NotPython),
        None
    );
    assert_eq!(resolver.take(6, 300, true), Some(1));
    // Cut: another stack.
    let line = resolver
        .stack(
            &stack(6, 400, 11, stack_flags::CUT, 1),
            &frames[..1],
            Reason::NotPython,
        )
        .unwrap();
    assert_eq!((line.id, line.cut, line.frames.len()), (2, true, 1));
    assert_eq!(resolver.take(6, 400, true), Some(2));
    assert_eq!((resolver.footer.calls, resolver.footer.cut), (4, 1));
    assert_eq!(resolver.footer.without.total(), 0);
}

#[test]
fn frames_not_started_are_left_out_as_cpython_leaves_them() {
    let mut resolver = resolver();
    // Unit 1 is before the first traceable instruction (2): an incomplete frame, unless a
    // generator owns it.
    let frames = [frame(1, 1), frame(2, 12)];
    let line = resolver
        .stack(&stack(5, 100, 9, 0, 2), &frames, Reason::NotPython)
        .unwrap();
    assert_eq!(line.frames.len(), 1);
    assert_eq!(line.frames[0].qualname, "<module>");
    let generator = [RawPyFrame {
        owner: OWNED_BY_GENERATOR,
        ..frame(1, 1)
    }];
    let line = resolver
        .stack(&stack(5, 200, 10, 0, 1), &generator, Reason::NotPython)
        .unwrap();
    assert_eq!(line.frames[0].line, Some(10));
    // Only incomplete frames: none to show.
    assert_eq!(
        resolver.stack(&stack(5, 300, 11, 0, 1), &frames[..1], Reason::NotPython),
        None
    );
    assert_eq!(resolver.take(5, 300, true), None);
    assert_eq!(resolver.footer.without.no_python_frames, 1);
}

#[test]
fn every_call_without_a_stack_is_counted_under_its_reason() {
    let mut resolver = resolver();
    let (mut bad, data) = code(3, "/w/x.py", "f", 1, 4);
    bad.flags = code_flags::NOT_CODE;
    resolver.code(&bad, &data);
    let cases = [
        (
            stack_status::NO_INTERPRETER,
            vec![],
            Reason::UnsupportedPython,
        ),
        (stack_status::NO_THREAD_STATE, vec![], Reason::NotPython),
        (stack_status::OK, vec![frame(3, 4)], Reason::NotPython),
        (stack_status::OK, vec![frame(0, 4)], Reason::NotPython),
        (stack_status::READ_FAULT, vec![], Reason::NotPython),
        // `--stack-every`: drawn out where the thread's state was not known yet.
        (stack_status::SAMPLED_OUT, vec![], Reason::NotPython),
    ];
    for (ts, (status, frames, no_interpreter)) in cases.into_iter().enumerate() {
        let event = StackEvent {
            status,
            ..stack(5, ts as u64, ts as u64, 0, frames.len() as u32)
        };
        assert_eq!(resolver.stack(&event, &frames, no_interpreter), None);
        assert_eq!(resolver.take(5, ts as u64, true), None);
    }
    // No record at all: lost.
    assert_eq!(resolver.take(5, 99, true), None);
    let without = &resolver.footer.without;
    assert_eq!(
        (
            without.unsupported_python,
            without.no_thread_state,
            without.code_unresolved,
            without.read_fault,
            without.record_lost,
            without.sampled_out
        ),
        (1, 1, 2, 1, 1, 1)
    );
    assert_eq!(resolver.footer.calls, 0);
}

#[test]
fn records_of_calls_whose_lines_were_lost_do_not_pair_with_others() {
    let mut resolver = resolver();
    let frames = [frame(2, 12)];
    // Outer call at 100, inner at 150 (its call line lost), outer returns.
    resolver.stack(&stack(5, 100, 9, 0, 1), &frames, Reason::NotPython);
    resolver.stack(
        &stack(5, 150, 9, stack_flags::KNOWN, 0),
        &[],
        Reason::NotPython,
    );
    assert_eq!(resolver.take(5, 100, true), Some(1));
    assert_eq!(resolver.take(5, 150, true), None);
    assert_eq!(resolver.footer.without.record_lost, 1);
}

#[test]
fn names_in_every_string_kind_are_read() {
    assert_eq!(decode_str(b"gr\xf6\xdfe", 1).as_deref(), Some("größe"));
    assert_eq!(
        decode_str(&[0xa2, 0x95, 0x70, 0x65], 2).as_deref(),
        Some("関数")
    );
    assert_eq!(
        decode_str(&[0x00, 0xf6, 0x01, 0x00], 4).as_deref(),
        Some("\u{1f600}")
    );
    assert_eq!(decode_str(&[0x00, 0xd8], 2), None);
}

/// A code object whose line table was too long for its record names its frames all the
/// same: with its lines where the table was read apart, without them where it could not be,
/// and the footer says which; the rest of the stack is whole either way.
#[test]
fn a_code_object_with_a_line_table_over_the_cap_keeps_its_frames() {
    for (read_apart, line) in [(true, Some(13)), (false, None)] {
        let mut resolver = resolver();
        let (mut long, data) = code(3, "/w/inductor.py", "call", 10, 40);
        let table = data[long.filename_len as usize + long.qualname_len as usize..].to_vec();
        long.flags = code_flags::LINETABLE_TOO_LONG;
        long.linetable_len = 0;
        let names = &data[..data.len() - table.len()];
        resolver.code_with_table(&long, names, read_apart.then_some(table));
        let line_of = resolver
            .stack(
                &stack(5, 100, 9, 0, 2),
                &[frame(3, 7), frame(2, 12)],
                Reason::NotPython,
            )
            .unwrap();
        assert_eq!(
            line_of
                .frames
                .iter()
                .map(|f| (f.qualname.as_str(), f.line))
                .collect::<Vec<_>>(),
            [("call", line), ("<module>", Some(7))]
        );
        assert_eq!(resolver.take(5, 100, true), Some(1));
        assert_eq!(resolver.footer.without.code_unresolved, 0);
        let counts = &resolver.footer.long_linetables;
        assert_eq!(
            (counts.read, counts.unread),
            (u64::from(read_apart), u64::from(!read_apart))
        );
    }
    // With another flag, still unusable.
    let mut resolver = resolver();
    let (mut bad, data) = code(3, "/w/x.py", "f", 1, 4);
    bad.flags = code_flags::LINETABLE_TOO_LONG | code_flags::BAD_NAME;
    resolver.code_with_table(&bad, &data, None);
    resolver.stack(&stack(5, 100, 9, 0, 1), &[frame(3, 4)], Reason::NotPython);
    assert_eq!(resolver.take(5, 100, true), None);
    assert_eq!(resolver.footer.without.code_unresolved, 1);
    assert_eq!(resolver.footer.long_linetables.unread, 0);
}

/// A call a window leaves out still takes its stack (the records pair by time), but only
/// the calls written are counted: the footer's `calls` and `without` add up to its lines.
#[test]
fn a_call_not_written_takes_its_stack_uncounted() {
    let mut resolver = resolver();
    let frames = [frame(1, 7), frame(2, 12)];
    resolver.stack(&stack(5, 100, 9, 0, 2), &frames, Reason::NotPython);
    assert_eq!(resolver.take(5, 100, false), Some(1));
    assert_eq!(resolver.take(5, 200, false), None);
    assert_eq!(resolver.footer.calls, 0);
    assert_eq!(resolver.footer.without.total(), 0);
    resolver.stack(
        &stack(5, 300, 9, stack_flags::KNOWN, 0),
        &[],
        Reason::NotPython,
    );
    assert_eq!(resolver.take(5, 300, true), Some(1));
    assert_eq!(resolver.take(5, 400, true), None);
    assert_eq!(resolver.footer.calls, 1);
    assert_eq!(resolver.footer.without.record_lost, 1);
}
