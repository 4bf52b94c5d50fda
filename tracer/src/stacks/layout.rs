//! Where CPython keeps what the walk reads, per minor version (x86-64, default GIL builds):
//! a table checked against each version's own headers (`offsetof` compiled against
//! 3.10.13, 3.11.2, 3.11.7, 3.12.1, 3.13.0, 3.13.5, 3.13.18 and 3.14.10, the same for every
//! patch release seen), and for 3.13+ CPython's own `_Py_DebugOffsets`, read from the
//! interpreter file, which wins where it has the field.

use tracer_common::stacks::{NO_FIELD, PyProcess, py_flags};

/// The minor versions cudatrace reads.
#[cfg(test)]
pub const MINORS: std::ops::RangeInclusive<u32> = 10..=14;

/// The layout of `3.minor` from the table (addresses and generation left 0).
pub fn table(minor: u32) -> Option<PyProcess> {
    let mut py = PyProcess {
        minor,
        code_mask: u64::MAX,
        tstate_read: 8,
        tstate_next: 8,
        tstate_interp: 16,
        tstate_native_id: 160,
        cframe_frame: NO_FIELD,
        frame_read: 0,
        frame_previous: 8,
        frame_code: 0,
        frame_instr: 56,
        frame_owner: 70,
        owner_skip_from: 3,
        code_ob_type: 8,
        code_ident: 92,
        code_filename: 112,
        code_qualname: 128,
        code_firstlineno: 68,
        code_linetable: 136,
        interp_next: 0,
        interp_code_epoch: NO_FIELD,
        bytes_size: 16,
        bytes_data: 32,
        str_length: 16,
        str_state: 32,
        str_ascii_data: 40,
        str_compact_data: 56,
        flags: py_flags::IDENT_PER_FRAME,
        ..PyProcess::default()
    };
    match minor {
        10 => {
            py.runtime_interpreters = 32;
            py.interp_threads = 8;
            py.interp_thread_epoch = 3448;
            py.tstate_thread_id = 176;
            py.tstate_native_id = NO_FIELD;
            py.tstate_frame = 24;
            py.frame_read = 24;
            py.frame_previous = 24;
            py.frame_code = 32;
            py.frame_instr = 96;
            py.frame_owner = NO_FIELD;
            py.owner_skip_from = NO_FIELD;
            py.flags |= py_flags::LASTI | py_flags::FINGERPRINT;
            // [16, 128) of the code object; [128, 144) (`co_zombieframe`,
            // `co_weakreflist`) changes as it runs.
            py.code_ident = 16;
            py.fingerprint_mask = [u64::MAX; 16];
            py.fingerprint_mask[14] = 0;
            py.fingerprint_mask[15] = 0;
            py.code_filename = 104;
            py.code_qualname = 112;
            py.code_firstlineno = 40;
            py.code_linetable = 120;
            py.code_firsttraceable = NO_FIELD;
            py.code_adaptive = 0;
            py.str_ascii_data = 48;
            py.str_compact_data = 72;
        }
        11 => {
            py.runtime_interpreters = 40;
            py.interp_threads = 16;
            py.interp_thread_epoch = 8;
            py.tstate_thread_id = 152;
            py.tstate_frame = 56;
            py.cframe_frame = 8;
            py.frame_read = 32;
            py.frame_previous = 48;
            py.frame_code = 32;
            py.frame_owner = 69;
            py.owner_skip_from = NO_FIELD;
            py.flags |= py_flags::FINGERPRINT;
            // [16, 144), but for `co_warmup` and `_co_linearray_entry_size` ([52, 56): the
            // upper half of the word at 48).
            py.code_ident = 16;
            py.fingerprint_mask = [u64::MAX; 16];
            py.fingerprint_mask[4] = 0x0000_0000_ffff_ffff;
            py.code_firstlineno = 72;
            py.code_firsttraceable = 168;
            py.code_adaptive = 184;
            py.str_ascii_data = 48;
            py.str_compact_data = 72;
        }
        12 => {
            py.runtime_interpreters = 40;
            py.interp_threads = 72;
            py.interp_thread_epoch = 64;
            py.tstate_thread_id = 136;
            py.tstate_native_id = 144;
            py.tstate_frame = 56;
            py.cframe_frame = 0;
            py.code_firsttraceable = 176;
            py.code_adaptive = 192;
        }
        13 => {
            py.runtime_interpreters = 632;
            py.interp_next = 7264;
            py.interp_threads = 7344;
            py.interp_thread_epoch = 7336;
            py.tstate_thread_id = 152;
            py.tstate_frame = 72;
            py.code_firsttraceable = 184;
            py.code_adaptive = 200;
        }
        14 => {
            py.runtime_interpreters = 808;
            py.interp_next = 7272;
            py.interp_threads = 7344;
            py.interp_thread_epoch = 7336;
            py.tstate_thread_id = 152;
            py.tstate_frame = 72;
            py.frame_owner = 74;
            py.code_firsttraceable = 192;
            py.code_adaptive = 208;
            // `_PyStackRef`: the low bits tag the pointer.
            py.code_mask = !3;
            // `_code_object_generation` (u64), counted up at each code object freed: while
            // it stands, every code pointer still names the object it named.
            py.interp_code_epoch = 7992;
            py.code_epoch_size = 8;
            py.flags &= !py_flags::IDENT_PER_FRAME;
        }
        _ => return None,
    }
    py.interp_read = py.interp_next;
    Some(py)
}

/// `_Py_DebugOffsets` (3.13+), as far as the walk uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugOffsets {
    /// `PY_VERSION_HEX`.
    pub version: u64,
    pub free_threaded: bool,
    values: Vec<(Field, u64)>,
}

/// A [`PyProcess`] field `_Py_DebugOffsets` gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    RuntimeInterpreters,
    InterpNext,
    InterpThreads,
    InterpCodeEpoch,
    TstateNext,
    TstateFrame,
    TstateThreadId,
    TstateNativeId,
    FramePrevious,
    FrameCode,
    FrameInstr,
    FrameOwner,
    CodeFilename,
    CodeQualname,
    CodeLinetable,
    CodeFirstlineno,
    CodeAdaptive,
    ObType,
    BytesSize,
    BytesData,
    StrState,
    StrLength,
    StrAsciiSize,
}

/// Where each field sits inside `_Py_DebugOffsets` (the struct grew fields between 3.13
/// and 3.14, so each minor has its map).
fn positions(minor: u32) -> Option<&'static [(Field, usize)]> {
    use Field::*;
    match minor {
        13 => Some(&[
            (RuntimeInterpreters, 40),
            (InterpNext, 64),
            (InterpThreads, 72),
            (TstateNext, 168),
            (TstateFrame, 184),
            (TstateThreadId, 192),
            (TstateNativeId, 200),
            (FramePrevious, 232),
            (FrameCode, 240),
            (FrameInstr, 248),
            (FrameOwner, 264),
            (CodeFilename, 280),
            (CodeQualname, 296),
            (CodeLinetable, 304),
            (CodeFirstlineno, 312),
            (CodeAdaptive, 344),
            (ObType, 360),
            (BytesSize, 520),
            (BytesData, 528),
            (StrState, 544),
            (StrLength, 552),
            (StrAsciiSize, 560),
        ]),
        14 => Some(&[
            (RuntimeInterpreters, 40),
            (InterpNext, 64),
            (InterpThreads, 72),
            (InterpCodeEpoch, 160),
            (TstateNext, 192),
            (TstateFrame, 208),
            (TstateThreadId, 216),
            (TstateNativeId, 224),
            (FramePrevious, 256),
            (FrameCode, 264),
            (FrameInstr, 272),
            (FrameOwner, 288),
            (CodeFilename, 320),
            (CodeQualname, 336),
            (CodeLinetable, 344),
            (CodeFirstlineno, 352),
            (CodeAdaptive, 384),
            (ObType, 408),
            (BytesSize, 600),
            (BytesData, 608),
            (StrState, 624),
            (StrLength, 632),
            (StrAsciiSize, 640),
        ]),
        _ => None,
    }
}

/// What is wrong with an interpreter's debug offsets.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DebugOffsetsError {
    #[error("its _Py_DebugOffsets has no \"xdebugpy\" cookie")]
    NoCookie,
    #[error("its _Py_DebugOffsets is cut short ({0} bytes)")]
    Short(usize),
}

impl DebugOffsets {
    /// Reads the struct at the start of `_PyRuntime` (`bytes`: the file's bytes there) for
    /// minor version `minor` (13+).
    pub fn read(bytes: &[u8], minor: u32) -> Result<Self, DebugOffsetsError> {
        let word = |at: usize| {
            bytes
                .get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        if bytes.get(..8) != Some(b"xdebugpy") {
            return Err(DebugOffsetsError::NoCookie);
        }
        let (Some(version), Some(free_threaded)) = (word(8), word(16)) else {
            return Err(DebugOffsetsError::Short(bytes.len()));
        };
        let mut values = Vec::new();
        for (field, at) in positions(minor).unwrap_or(&[]) {
            values.push((
                *field,
                word(*at).ok_or(DebugOffsetsError::Short(bytes.len()))?,
            ));
        }
        Ok(DebugOffsets {
            version,
            free_threaded: free_threaded != 0,
            values,
        })
    }

    /// `py` (the table's layout) with every field the debug offsets give taken from them.
    /// `None` when a value does not fit where the walk reads it (a layout the probes cannot
    /// read in one piece).
    pub fn apply(&self, mut py: PyProcess) -> Option<PyProcess> {
        for (field, value) in &self.values {
            let value = u32::try_from(*value).ok()?;
            match field {
                Field::RuntimeInterpreters => py.runtime_interpreters = value,
                Field::InterpNext => py.interp_next = value,
                Field::InterpThreads => {
                    py.interp_threads = value;
                    // `threads.next_unique_id` is the field before `threads.head`.
                    py.interp_thread_epoch = value.checked_sub(8)?;
                }
                Field::InterpCodeEpoch => py.interp_code_epoch = value,
                Field::TstateNext => py.tstate_next = value,
                Field::TstateFrame => py.tstate_frame = value,
                Field::TstateThreadId => py.tstate_thread_id = value,
                Field::TstateNativeId => py.tstate_native_id = value,
                Field::FramePrevious => py.frame_previous = value,
                Field::FrameCode => py.frame_code = value,
                Field::FrameInstr => py.frame_instr = value,
                Field::FrameOwner => py.frame_owner = value,
                Field::CodeFilename => py.code_filename = value,
                Field::CodeQualname => py.code_qualname = value,
                Field::CodeLinetable => py.code_linetable = value,
                Field::CodeFirstlineno => py.code_firstlineno = value,
                Field::CodeAdaptive => py.code_adaptive = value,
                Field::ObType => py.code_ob_type = value,
                Field::BytesSize => py.bytes_size = value,
                Field::BytesData => py.bytes_data = value,
                Field::StrState => py.str_state = value,
                Field::StrLength => py.str_length = value,
                Field::StrAsciiSize => {
                    py.str_ascii_data = value;
                    // A compact string's data follows `PyCompactUnicodeObject`, two words
                    // more than `PyASCIIObject`.
                    py.str_compact_data = value + 16;
                }
            }
        }
        py.interp_read = py.interp_next;
        fits(&py).then_some(py)
    }
}

/// Whether every field lies where the probes read it: inside the one read of its object,
/// aligned for the probes' masked loads.
pub fn fits(py: &PyProcess) -> bool {
    use tracer_common::stacks::{CODE_READ, FRAME_READ, INTERP_READ, STR_READ, TSTATE_READ};
    let inside = |field: u32, start: u32, len: usize, size: u32| {
        field == NO_FIELD
            || (field >= start
                && u64::from(field - start) + u64::from(size) <= len as u64
                && (field - start).is_multiple_of(size))
    };
    let words = |fields: &[u32], start: u32, len: usize| {
        fields.iter().all(|field| inside(*field, start, len, 8))
    };
    let instr = if py.flags & py_flags::LASTI != 0 {
        4
    } else {
        8
    };
    words(
        &[py.interp_next, py.interp_threads],
        py.interp_read,
        INTERP_READ,
    ) && words(
        &[
            py.tstate_next,
            py.tstate_interp,
            py.tstate_thread_id,
            py.tstate_native_id,
            py.tstate_frame,
        ],
        py.tstate_read,
        TSTATE_READ,
    ) && words(
        &[py.frame_previous, py.frame_code],
        py.frame_read,
        FRAME_READ,
    ) && inside(py.frame_instr, py.frame_read, FRAME_READ, instr)
        && inside(py.frame_owner, py.frame_read, FRAME_READ, 1)
        && words(
            &[
                py.code_ob_type,
                py.code_filename,
                py.code_qualname,
                py.code_linetable,
            ],
            0,
            CODE_READ,
        )
        && inside(py.code_firstlineno, 0, CODE_READ, 4)
        && inside(py.code_firsttraceable, 0, CODE_READ, 4)
        && inside(py.str_length, 0, STR_READ, 8)
        && inside(py.str_state, 0, STR_READ, 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every minor's table fits the probes' reads.
    #[test]
    fn each_table_fits_the_reads() {
        for minor in MINORS {
            let py = table(minor).unwrap();
            assert!(fits(&py), "3.{minor}");
            assert_eq!(py.interp_read, py.interp_next);
        }
        assert_eq!(table(9), None);
        assert_eq!(table(15), None);
    }

    /// Debug offsets as the research read them from Debian's 3.13.5 and 3.14.10 give the
    /// table's values (which were checked against the headers).
    #[test]
    fn debug_offsets_give_the_tables_values() {
        for (minor, version) in [(13, 0x030d_05f0u64), (14, 0x030e_0af0)] {
            let expected = table(minor).unwrap();
            let mut bytes = vec![0u8; 800];
            bytes[..8].copy_from_slice(b"xdebugpy");
            bytes[8..16].copy_from_slice(&version.to_le_bytes());
            let value = |field: Field| -> u64 {
                match field {
                    Field::RuntimeInterpreters => expected.runtime_interpreters.into(),
                    Field::InterpNext => expected.interp_next.into(),
                    Field::InterpThreads => expected.interp_threads.into(),
                    Field::InterpCodeEpoch => expected.interp_code_epoch.into(),
                    Field::TstateNext => expected.tstate_next.into(),
                    Field::TstateFrame => expected.tstate_frame.into(),
                    Field::TstateThreadId => expected.tstate_thread_id.into(),
                    Field::TstateNativeId => expected.tstate_native_id.into(),
                    Field::FramePrevious => expected.frame_previous.into(),
                    Field::FrameCode => expected.frame_code.into(),
                    Field::FrameInstr => expected.frame_instr.into(),
                    Field::FrameOwner => expected.frame_owner.into(),
                    Field::CodeFilename => expected.code_filename.into(),
                    Field::CodeQualname => expected.code_qualname.into(),
                    Field::CodeLinetable => expected.code_linetable.into(),
                    Field::CodeFirstlineno => expected.code_firstlineno.into(),
                    Field::CodeAdaptive => expected.code_adaptive.into(),
                    Field::ObType => expected.code_ob_type.into(),
                    Field::BytesSize => expected.bytes_size.into(),
                    Field::BytesData => expected.bytes_data.into(),
                    Field::StrState => expected.str_state.into(),
                    Field::StrLength => expected.str_length.into(),
                    Field::StrAsciiSize => expected.str_ascii_data.into(),
                }
            };
            for (field, at) in positions(minor).unwrap() {
                bytes[*at..*at + 8].copy_from_slice(&value(*field).to_le_bytes());
            }
            let offsets = DebugOffsets::read(&bytes, minor).unwrap();
            assert_eq!((offsets.version, offsets.free_threaded), (version, false));
            assert_eq!(offsets.apply(expected), Some(expected), "3.{minor}");
        }
        assert_eq!(
            DebugOffsets::read(b"xdebugpz", 13),
            Err(DebugOffsetsError::NoCookie)
        );
        assert_eq!(
            DebugOffsets::read(b"xdebugpy\x01", 13),
            Err(DebugOffsetsError::Short(9))
        );
    }
}
