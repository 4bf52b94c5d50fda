//! Where CPython keeps what the walk reads, per minor version (default GIL builds; x86-64
//! and arm64 alike: both are LP64 with natural alignment, and no struct the walk reads
//! holds a type whose size or alignment differs between them, such as `long double`),
//! in one table, [`FIELDS`]: a row per offset of [`PyProcess`] with its value in each minor
//! (checked against each version's own headers: `offsetof` compiled against 3.10.13,
//! 3.11.2, 3.11.7, 3.12.1, 3.13.0, 3.13.5, 3.13.18 and 3.14.10, the same for every patch
//! release seen), where CPython's own `_Py_DebugOffsets` (3.13+, read from the interpreter
//! file, which wins) gives it, and the probes' read it must lie in. The layout of a minor
//! ([`table`]), the reading of `_Py_DebugOffsets` (`debug_offsets.rs`), the bounds check
//! ([`fits`]) and the tests follow from the rows; a `PyProcess` field without a row fails
//! the build.

use std::ops::RangeInclusive;

use tracer_common::stacks::{
    CODE_READ, FINGERPRINT_LEN, FRAME_READ, INTERP_READ, NO_FIELD, PyProcess, STR_READ,
    TSTATE_READ,
    py_flags::{FINGERPRINT, IDENT_PER_FRAME, LASTI},
};

/// The minor versions cudatrace reads: the table's columns.
pub const MINORS: RangeInclusive<u32> = 10..=14;
/// The minor versions with `_Py_DebugOffsets`: its columns.
pub const DEBUG_MINORS: RangeInclusive<u32> = 13..=14;

/// One offset of [`PyProcess`]: a row of [`FIELDS`].
#[derive(Debug)]
pub struct Field {
    pub name: &'static str,
    /// Its value in each of [`MINORS`] ([`NO_FIELD`] where the version has none).
    table: [u32; 5],
    /// How `_Py_DebugOffsets` gives it.
    pub given: Given,
    /// The probes' read it lies in, and its size there.
    read: Option<(Read, Size)>,
    get: fn(&PyProcess) -> u32,
    set: fn(&mut PyProcess, u32),
}

/// How `_Py_DebugOffsets` gives a field.
#[derive(Debug)]
pub enum Given {
    /// It does not: the table's value stands.
    Not,
    /// As the word at this position of the struct in each of [`DEBUG_MINORS`] (the struct
    /// grew fields between 3.13 and 3.14; `None`: that minor's has no such word).
    At([Option<usize>; 2]),
    /// From the field named, when it gives that one: its value plus this.
    From(&'static str, i64),
}

/// A read of the probes: where it starts and how many bytes it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Read {
    Interp,
    Tstate,
    Frame,
    Code,
    Str,
}

/// A field's size, and so its alignment, in its read (the probes' masked loads).
#[derive(Clone, Copy, Debug)]
enum Size {
    Word,
    Int,
    Byte,
    /// The frame's instruction: 3.10's `f_lasti` is an `int`, later ones a pointer.
    Instr,
}

/// What a minor is beyond its offsets.
struct Version {
    flags: u32,
    code_mask: u64,
    fingerprint_mask: [u64; FINGERPRINT_LEN / 8],
}

/// [`Version`]s by minor, as [`MINORS`].
const VERSIONS: [Version; 5] = [
    Version {
        flags: IDENT_PER_FRAME | LASTI | FINGERPRINT,
        code_mask: u64::MAX,
        // [16, 128) of the code object; [128, 144) (`co_zombieframe`, `co_weakreflist`)
        // changes as it runs.
        fingerprint_mask: {
            let mut mask = [u64::MAX; FINGERPRINT_LEN / 8];
            mask[14] = 0;
            mask[15] = 0;
            mask
        },
    },
    Version {
        flags: IDENT_PER_FRAME | FINGERPRINT,
        code_mask: u64::MAX,
        // [16, 144), but for `co_warmup` and `_co_linearray_entry_size` ([52, 56): the
        // upper half of the word at 48).
        fingerprint_mask: {
            let mut mask = [u64::MAX; FINGERPRINT_LEN / 8];
            mask[4] = 0x0000_0000_ffff_ffff;
            mask
        },
    },
    Version {
        flags: IDENT_PER_FRAME,
        code_mask: u64::MAX,
        fingerprint_mask: [0; FINGERPRINT_LEN / 8],
    },
    Version {
        flags: IDENT_PER_FRAME,
        code_mask: u64::MAX,
        fingerprint_mask: [0; FINGERPRINT_LEN / 8],
    },
    Version {
        flags: 0,
        // `_PyStackRef`: the low bits tag the pointer.
        code_mask: !3,
        fingerprint_mask: [0; FINGERPRINT_LEN / 8],
    },
];

/// [`FIELDS`] from its rows, and a [`PyProcess`] literal naming every row and the fields
/// that are no offsets, so that a field without a row fails the build. A row:
/// `name: [3.10, 3.11, 3.12, 3.13, 3.14]` (`-`: none), then how `_Py_DebugOffsets` gives
/// it, if it does (`at [3.13, 3.14]`, its positions, or `= other ± n`), then the read it
/// must fit in (`in Read Size`).
macro_rules! cpython_fields {
    ($(
        $name:ident: [$($value:tt),*]
        $(at [$($position:tt),*])?
        $(= $from:ident $(+ $plus:literal)? $(- $minus:literal)?)?
        $(in $read:ident $size:ident)?;
    )*) => {
        /// The table: a row per offset of [`PyProcess`].
        pub const FIELDS: &[Field] = &[$(Field {
            name: stringify!($name),
            table: [$(cpython_fields!(@value $value)),*],
            given: cpython_fields!(@given $(at [$($position),*])? $(= $from $(+ $plus)? $(- $minus)?)?),
            read: cpython_fields!(@read $($read $size)?),
            get: |py| py.$name,
            set: |py, value| py.$name = value,
        }),*];

        /// `minor`'s [`PyProcess`] with every offset 0 and its [`Version`].
        fn blank(minor: u32, version: &Version) -> PyProcess {
            PyProcess {
                generation: 0,
                runtime: 0,
                code_type: 0,
                minor,
                flags: version.flags,
                code_mask: version.code_mask,
                code_frees: 0,
                fingerprint_mask: version.fingerprint_mask,
                $($name: 0,)*
            }
        }
    };
    (@value -) => { NO_FIELD };
    (@value $value:literal) => { $value };
    (@position -) => { None };
    (@position $position:literal) => { Some($position) };
    (@given) => { Given::Not };
    (@given at [$($position:tt),*]) => { Given::At([$(cpython_fields!(@position $position)),*]) };
    (@given = $from:ident) => { Given::From(stringify!($from), 0) };
    (@given = $from:ident + $by:literal) => { Given::From(stringify!($from), $by) };
    (@given = $from:ident - $by:literal) => { Given::From(stringify!($from), -$by) };
    (@read) => { None };
    (@read $read:ident $size:ident) => { Some((Read::$read, Size::$size)) };
}

cpython_fields! {
    //                     3.10  3.11  3.12  3.13  3.14   _Py_DebugOffsets       read
    runtime_interpreters: [  32,   40,   40,  632,  808] at [ 40,  40];
    // The interpreter state: one read from `next`.
    interp_read:          [   0,    0,    0, 7264, 7272] = interp_next;
    interp_next:          [   0,    0,    0, 7264, 7272] at [ 64,  64] in Interp Word;
    interp_threads:       [   8,   16,   72, 7344, 7344] at [ 72,  72] in Interp Word;
    // `threads.next_unique_id` is the field before `threads.head`.
    interp_thread_epoch:  [3448,    8,   64, 7336, 7336] = interp_threads - 8;
    // 3.14's `_code_object_generation` (u64), counted up at each code object freed: while
    // it stands, every code pointer still names the object it named.
    interp_code_epoch:    [   -,    -,    -,    -, 7992] at [  -, 160];
    code_epoch_size:      [   0,    0,    0,    0,    8];
    // The thread state.
    tstate_read:          [   8,    8,    8,    8,    8];
    tstate_next:          [   8,    8,    8,    8,    8] at [168, 192] in Tstate Word;
    tstate_interp:        [  16,   16,   16,   16,   16]              in Tstate Word;
    tstate_thread_id:     [ 176,  152,  136,  152,  152] at [192, 216] in Tstate Word;
    tstate_native_id:     [   -,  160,  144,  160,  160] at [200, 224] in Tstate Word;
    tstate_frame:         [  24,   56,   56,   72,   72] at [184, 208] in Tstate Word;
    cframe_frame:         [   -,    8,    0,    -,    -];
    // The data stack's current chunk and its top (3.11 has them past the read: none).
    tstate_datastack:     [   -,    -,  232,  232,  232] at [208, 232] in Tstate Word;
    tstate_datastack_top: [   -,    -,  240,  240,  240] = tstate_datastack + 8 in Tstate Word;
    // The frame.
    frame_read:           [  24,   32,    0,    0,    0];
    frame_previous:       [  24,   48,    8,    8,    8] at [232, 256] in Frame Word;
    frame_code:           [  32,   32,    0,    0,    0] at [240, 264] in Frame Word;
    frame_instr:          [  96,   56,   56,   56,   56] at [248, 272] in Frame Instr;
    frame_owner:          [   -,   69,   70,   70,   74] at [264, 288] in Frame Byte;
    owner_skip_from:      [   -,    -,    3,    3,    3];
    // The code object, read from its start.
    code_ob_type:         [   8,    8,    8,    8,    8] at [360, 408] in Code Word;
    code_adaptive:        [   0,  184,  192,  200,  208] at [344, 384];
    code_ident:           [  16,   16,   92,   92,   92];
    code_filename:        [ 104,  112,  112,  112,  112] at [280, 320] in Code Word;
    code_qualname:        [ 112,  128,  128,  128,  128] at [296, 336] in Code Word;
    code_firstlineno:     [  40,   72,   68,   68,   68] at [312, 352] in Code Int;
    code_firsttraceable:  [   -,  168,  176,  184,  192]              in Code Int;
    code_linetable:       [ 120,  136,  136,  136,  136] at [304, 344] in Code Word;
    // `bytes` and `str`, read from their start.
    bytes_size:           [  16,   16,   16,   16,   16] at [520, 600];
    bytes_data:           [  32,   32,   32,   32,   32] at [528, 608];
    str_length:           [  16,   16,   16,   16,   16] at [552, 632] in Str Word;
    str_state:            [  32,   32,   32,   32,   32] at [544, 624] in Str Int;
    str_ascii_data:       [  48,   48,   40,   40,   40] at [560, 640];
    // A compact string's data follows `PyCompactUnicodeObject`, two words more than
    // `PyASCIIObject`.
    str_compact_data:     [  72,   72,   56,   56,   56] = str_ascii_data + 16;
}

impl Field {
    /// Its value in `py`.
    pub fn get(&self, py: &PyProcess) -> u32 {
        (self.get)(py)
    }

    pub fn set(&self, py: &mut PyProcess, value: u32) {
        (self.set)(py, value);
    }

    /// Its position in `_Py_DebugOffsets` of `minor`, where the struct has it.
    pub fn position(&self, minor: u32) -> Option<usize> {
        match self.given {
            Given::At(positions) => {
                let column = minor.checked_sub(*DEBUG_MINORS.start())?;
                *positions.get(usize::try_from(column).ok()?)?
            }
            _ => None,
        }
    }

    /// Whether its value in `py` lies inside its read, aligned to its size.
    fn fits(&self, py: &PyProcess) -> bool {
        let Some((read, size)) = self.read else {
            return true;
        };
        let (start, len) = match read {
            Read::Interp => (py.interp_read, INTERP_READ),
            Read::Tstate => (py.tstate_read, TSTATE_READ),
            Read::Frame => (py.frame_read, FRAME_READ),
            Read::Code => (0, CODE_READ),
            Read::Str => (0, STR_READ),
        };
        let size: u32 = match size {
            Size::Word => 8,
            Size::Int => 4,
            Size::Byte => 1,
            Size::Instr if py.flags & LASTI != 0 => 4,
            Size::Instr => 8,
        };
        let offset = self.get(py);
        offset == NO_FIELD
            || (offset >= start
                && u64::from(offset - start) + u64::from(size) <= len as u64
                && (offset - start).is_multiple_of(size))
    }
}

/// The row named `name`.
pub fn field(name: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|field| field.name == name)
}

/// The environment variable of the test hook [`Shift`]. A test's, not a user's: every
/// layout it moves is said on stderr, and docs/python-stacks.md names it.
pub const SHIFT_ENV: &str = "CUDATRACE_TEST_LAYOUT_SHIFT";

/// `FIELD+N` or `FIELD-N`: the table's value of one field moved by N bytes, as a table
/// gone wrong would have it (the tests' wrong layout: the check on the live process must
/// refuse it, or `_Py_DebugOffsets` correct it and say so).
#[derive(Debug)]
pub struct Shift {
    field: &'static Field,
    by: i64,
}

impl Shift {
    pub fn parse(text: &str) -> Result<Shift, String> {
        let at = text
            .find(['+', '-'])
            .ok_or_else(|| format!("{SHIFT_ENV}={text}: not FIELD+N or FIELD-N"))?;
        let field = field(&text[..at])
            .ok_or_else(|| format!("{SHIFT_ENV}={text}: no field {:?}", &text[..at]))?;
        let by: i64 = text[at..]
            .strip_prefix('+')
            .unwrap_or(&text[at..])
            .parse()
            .map_err(|_| format!("{SHIFT_ENV}={text}: not FIELD+N or FIELD-N"))?;
        Ok(Shift { field, by })
    }

    /// Moves the field in `py` (a field the minor lacks stays absent).
    pub fn apply(&self, py: &mut PyProcess) {
        let value = self.field.get(py);
        if value != NO_FIELD {
            self.field.set(
                py,
                (i64::from(value) + self.by).clamp(0, i64::from(u32::MAX - 1)) as u32,
            );
        }
    }
}

impl std::fmt::Display for Shift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{:+}", self.field.name, self.by)
    }
}

/// Where another architecture's CPython puts a field elsewhere than the table (x86-64's):
/// (`std::env::consts::ARCH`, minor, field, offset). aarch64's glibc `pthread_mutex_t` is 48
/// bytes, not 40, and 3.14's interpreter state holds two of them (its GIL's) before
/// `_code_object_generation`: Debian sid's 3.14.10 for arm64 has it at 8,008 (its own
/// `_Py_DebugOffsets`), x86-64's at 7,992. The fields before the GIL are where x86-64 has
/// them (the arm64 guests' 3.11, 3.13 and 3.14 check the rest against the table).
const ARCH_FIELDS: &[(&str, u32, &str, u32)] = &[("aarch64", 14, "interp_code_epoch", 8008)];

/// The layout of `3.minor` from the table (addresses and generation left 0), for this
/// machine's architecture.
pub fn table(minor: u32) -> Option<PyProcess> {
    table_for(std::env::consts::ARCH, minor)
}

/// The layout of `3.minor` from the table for architecture `arch` (as
/// `std::env::consts::ARCH` names it).
fn table_for(arch: &str, minor: u32) -> Option<PyProcess> {
    let column = usize::try_from(minor.checked_sub(*MINORS.start())?).ok()?;
    let mut py = blank(minor, VERSIONS.get(column)?);
    for field in FIELDS {
        field.set(&mut py, field.table[column]);
    }
    for (_, _, name, value) in ARCH_FIELDS
        .iter()
        .filter(|(on, of, _, _)| *on == arch && *of == minor)
    {
        if let Some(field) = FIELDS.iter().find(|field| field.name == *name) {
            field.set(&mut py, *value);
        }
    }
    Some(py)
}

/// `py` with each read (the interpreter's, the thread state's, the frame's) starting at its
/// lowest field, as every minor's table has them: a layout read from DWARF puts its reads
/// where its own fields are rather than where the table's would be.
pub fn start_reads_at_first_fields(py: &mut PyProcess) {
    for (read, start) in [
        (Read::Interp, "interp_read"),
        (Read::Tstate, "tstate_read"),
        (Read::Frame, "frame_read"),
    ] {
        let first = FIELDS
            .iter()
            .filter(|field| matches!(field.read, Some((r, _)) if r == read))
            .map(|field| field.get(py))
            .filter(|offset| *offset != NO_FIELD)
            .min();
        if let (Some(first), Some(start)) = (first, field(start)) {
            start.set(py, first);
        }
    }
}

/// The fields the walk can do without (the data stack's chunk: its windows then stop at
/// their frame's page): where one of them does not lie inside its read, as a build of
/// other options could have it, they are left out rather than the interpreter refused.
pub fn drop_optional_misfits(py: &mut PyProcess) {
    let optional = ["tstate_datastack", "tstate_datastack_top"].map(field);
    if optional.iter().flatten().any(|field| !field.fits(py)) {
        for field in optional.into_iter().flatten() {
            field.set(py, NO_FIELD);
        }
    }
}

/// Whether every field lies where the probes read it: inside the one read of its object,
/// aligned for the probes' masked loads.
pub fn fits(py: &PyProcess) -> bool {
    FIELDS.iter().all(|field| field.fits(py))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every minor's table fits the probes' reads, and there is none for other minors.
    #[test]
    fn each_table_fits_the_reads() {
        for minor in MINORS {
            let py = table(minor).unwrap();
            assert!(fits(&py), "3.{minor}");
            assert_eq!(py.minor, minor);
        }
        assert_eq!(table(9), None);
        assert_eq!(table(15), None);
    }

    /// Every minor's reads start at their lowest field: [`start_reads_at_first_fields`]
    /// leaves each table as it is, and follows a field moved below its read's start.
    #[test]
    fn each_tables_reads_start_at_their_first_field() {
        for minor in MINORS {
            let mut py = table(minor).unwrap();
            start_reads_at_first_fields(&mut py);
            assert_eq!(py, table(minor).unwrap(), "3.{minor}");
        }
        let mut moved = table(13).unwrap();
        moved.interp_next -= 16;
        start_reads_at_first_fields(&mut moved);
        assert_eq!(moved.interp_read, table(13).unwrap().interp_read - 16);
    }

    /// The data stack's chunk is left out where it lies past the thread state's read (a
    /// build of other options), the interpreter kept; where it fits it stays.
    #[test]
    fn a_data_stack_chunk_outside_its_read_is_left_out() {
        for minor in MINORS {
            let mut py = table(minor).unwrap();
            drop_optional_misfits(&mut py);
            assert_eq!(py, table(minor).unwrap(), "3.{minor}");
        }
        let mut moved = table(12).unwrap();
        moved.tstate_datastack = 240;
        moved.tstate_datastack_top = 248;
        assert!(!fits(&moved));
        drop_optional_misfits(&mut moved);
        assert_eq!(
            (moved.tstate_datastack, moved.tstate_datastack_top),
            (NO_FIELD, NO_FIELD)
        );
        assert!(fits(&moved));
    }

    /// A field moved out of its read, or off its alignment, does not fit.
    #[test]
    fn a_field_outside_its_read_does_not_fit() {
        let py = table(13).unwrap();
        for (name, value) in [
            ("tstate_frame", TSTATE_READ as u32 + 8),
            ("tstate_frame", 4),
            ("frame_instr", 60),
            ("code_firstlineno", CODE_READ as u32 - 2),
            ("str_state", 34),
        ] {
            let mut moved = py;
            field(name).unwrap().set(&mut moved, value);
            assert!(!fits(&moved), "{name} at {value}");
        }
        // 3.10's `f_lasti` is an int: 4-aligned is enough.
        let mut lasti = table(10).unwrap();
        lasti.frame_instr = 100;
        assert!(fits(&lasti));
    }

    #[test]
    fn an_architecture_moves_only_its_own_fields() {
        let (x86, arm) = (
            table_for("x86_64", 14).unwrap(),
            table_for("aarch64", 14).unwrap(),
        );
        assert_eq!((x86.interp_code_epoch, arm.interp_code_epoch), (7992, 8008));
        assert_eq!(
            PyProcess {
                interp_code_epoch: 7992,
                ..arm
            },
            x86
        );
        assert_eq!(table_for("aarch64", 13), table_for("x86_64", 13));
        // Every entry names a field and a minor of the table.
        for (arch, minor, name, _) in ARCH_FIELDS {
            assert!(MINORS.contains(minor), "{arch} 3.{minor}");
            assert!(FIELDS.iter().any(|f| f.name == *name), "{arch} {name}");
        }
    }

    #[test]
    fn a_shift_moves_one_field_of_the_table() {
        let shift = Shift::parse("frame_code+8").unwrap();
        assert_eq!(shift.to_string(), "frame_code+8");
        let mut py = table(12).unwrap();
        shift.apply(&mut py);
        assert_eq!(
            py,
            PyProcess {
                frame_code: 8,
                ..table(12).unwrap()
            }
        );
        Shift::parse("tstate_interp-8").unwrap().apply(&mut py);
        assert_eq!(py.tstate_interp, 8);
        // 3.10 has no owner: none is made.
        let mut old = table(10).unwrap();
        Shift::parse("frame_owner+1").unwrap().apply(&mut old);
        assert_eq!(old, table(10).unwrap());
        for wrong in ["frame_code", "frame_code+x", "no_field+8", "+8"] {
            assert!(Shift::parse(wrong).is_err(), "{wrong}");
        }
    }

    /// What a derived field follows from is a row `_Py_DebugOffsets` gives in every minor
    /// that has it, and the table agrees with the derivation there.
    #[test]
    fn derived_fields_follow_their_rows() {
        for field in FIELDS {
            let Given::From(from, by) = field.given else {
                continue;
            };
            let source = super::field(from).unwrap();
            for minor in DEBUG_MINORS {
                assert!(
                    source.position(minor).is_some(),
                    "{} in 3.{minor}",
                    field.name
                );
                let py = table(minor).unwrap();
                assert_eq!(
                    i64::from(field.get(&py)),
                    i64::from(source.get(&py)) + by,
                    "{} in 3.{minor}",
                    field.name
                );
            }
        }
    }
}
