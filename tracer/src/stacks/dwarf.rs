//! An interpreter's DWARF, where it has some: in the interpreter file itself (pyenv's
//! builds, CPython's configure compiles with `-g`) or in its separate debug file (a `-dbg`
//! package's, found by the file's GNU build-id or its `.gnu_debuglink`). The structs' member
//! offsets it gives, read with gimli, describe this very build: they are preferred to the
//! table ([`MEMBERS`] says where each field of the table is).

use std::{
    borrow::Cow,
    fs,
    io::Read as _,
    path::{Path, PathBuf},
};

use gimli::{AttributeValue, EndianSlice, LittleEndian, Operation, UnitOffset, constants};
use object::{CompressionFormat, Object, ObjectSection};
use tracer_common::stacks::PyProcess;

use super::{
    debug_offsets::DebugOffsets,
    layout::{self, FIELDS, Field, MINORS},
};

/// Where DWARF gives a field of the table in one minor.
#[derive(Clone, Copy, Debug)]
enum Member {
    /// The offset of a member of a struct (its typedef or struct name), by its path.
    At(&'static str, &'static str),
    /// The size of a struct: what follows it lies there.
    Size(&'static str),
    /// A read's start: at its lowest field ([`layout::start_reads_at_first_fields`]).
    ReadStart,
    /// The table's value stands: a field the minor lacks, or no offset of a struct.
    Table,
}

use Member::{At, ReadStart, Size, Table};

/// Where each field of the table ([`FIELDS`]) is, by minor as [`MINORS`]: the struct and
/// member CPython's headers name (checked against pyenv's 3.10.13, 3.11.7, 3.12.1 and
/// 3.13.0, whose DWARF gives the table's values).
const MEMBERS: &[(&str, [Member; 5])] = &[
    (
        "runtime_interpreters",
        [At("_PyRuntimeState", "interpreters.head"); 5],
    ),
    ("interp_read", [ReadStart; 5]),
    ("interp_next", [At("PyInterpreterState", "next"); 5]),
    (
        "interp_threads",
        [
            At("PyInterpreterState", "tstate_head"),
            At("PyInterpreterState", "threads.head"),
            At("PyInterpreterState", "threads.head"),
            At("PyInterpreterState", "threads.head"),
            At("PyInterpreterState", "threads.head"),
        ],
    ),
    (
        "interp_thread_epoch",
        [
            At("PyInterpreterState", "tstate_next_unique_id"),
            At("PyInterpreterState", "threads.next_unique_id"),
            At("PyInterpreterState", "threads.next_unique_id"),
            At("PyInterpreterState", "threads.next_unique_id"),
            At("PyInterpreterState", "threads.next_unique_id"),
        ],
    ),
    (
        "interp_code_epoch",
        [
            Table,
            Table,
            Table,
            Table,
            At("PyInterpreterState", "_code_object_generation"),
        ],
    ),
    ("code_epoch_size", [Table; 5]),
    ("tstate_read", [ReadStart; 5]),
    ("tstate_next", [At("PyThreadState", "next"); 5]),
    ("tstate_interp", [At("PyThreadState", "interp"); 5]),
    ("tstate_thread_id", [At("PyThreadState", "thread_id"); 5]),
    (
        "tstate_native_id",
        [
            Table,
            At("PyThreadState", "native_thread_id"),
            At("PyThreadState", "native_thread_id"),
            At("PyThreadState", "native_thread_id"),
            At("PyThreadState", "native_thread_id"),
        ],
    ),
    (
        "tstate_frame",
        [
            At("PyThreadState", "frame"),
            At("PyThreadState", "cframe"),
            At("PyThreadState", "cframe"),
            At("PyThreadState", "current_frame"),
            At("PyThreadState", "current_frame"),
        ],
    ),
    (
        "cframe_frame",
        [
            Table,
            At("_PyCFrame", "current_frame"),
            At("_PyCFrame", "current_frame"),
            Table,
            Table,
        ],
    ),
    (
        "tstate_datastack",
        [
            Table,
            Table,
            At("PyThreadState", "datastack_chunk"),
            At("PyThreadState", "datastack_chunk"),
            At("PyThreadState", "datastack_chunk"),
        ],
    ),
    (
        "tstate_datastack_top",
        [
            Table,
            Table,
            At("PyThreadState", "datastack_top"),
            At("PyThreadState", "datastack_top"),
            At("PyThreadState", "datastack_top"),
        ],
    ),
    ("frame_read", [ReadStart; 5]),
    (
        "frame_previous",
        [
            At("PyFrameObject", "f_back"),
            At("_PyInterpreterFrame", "previous"),
            At("_PyInterpreterFrame", "previous"),
            At("_PyInterpreterFrame", "previous"),
            At("_PyInterpreterFrame", "previous"),
        ],
    ),
    (
        "frame_code",
        [
            At("PyFrameObject", "f_code"),
            At("_PyInterpreterFrame", "f_code"),
            At("_PyInterpreterFrame", "f_code"),
            At("_PyInterpreterFrame", "f_executable"),
            At("_PyInterpreterFrame", "f_executable"),
        ],
    ),
    (
        "frame_instr",
        [
            At("PyFrameObject", "f_lasti"),
            At("_PyInterpreterFrame", "prev_instr"),
            At("_PyInterpreterFrame", "prev_instr"),
            At("_PyInterpreterFrame", "instr_ptr"),
            At("_PyInterpreterFrame", "instr_ptr"),
        ],
    ),
    (
        "frame_owner",
        [
            Table,
            At("_PyInterpreterFrame", "owner"),
            At("_PyInterpreterFrame", "owner"),
            At("_PyInterpreterFrame", "owner"),
            At("_PyInterpreterFrame", "owner"),
        ],
    ),
    ("owner_skip_from", [Table; 5]),
    ("code_ob_type", [At("PyObject", "ob_type"); 5]),
    (
        "code_adaptive",
        [
            Table,
            At("PyCodeObject", "co_code_adaptive"),
            At("PyCodeObject", "co_code_adaptive"),
            At("PyCodeObject", "co_code_adaptive"),
            At("PyCodeObject", "co_code_adaptive"),
        ],
    ),
    (
        "code_ident",
        [
            Table,
            Table,
            At("PyCodeObject", "co_version"),
            At("PyCodeObject", "co_version"),
            At("PyCodeObject", "co_version"),
        ],
    ),
    ("code_filename", [At("PyCodeObject", "co_filename"); 5]),
    (
        "code_qualname",
        [
            At("PyCodeObject", "co_name"),
            At("PyCodeObject", "co_qualname"),
            At("PyCodeObject", "co_qualname"),
            At("PyCodeObject", "co_qualname"),
            At("PyCodeObject", "co_qualname"),
        ],
    ),
    (
        "code_firstlineno",
        [At("PyCodeObject", "co_firstlineno"); 5],
    ),
    (
        "code_firsttraceable",
        [
            Table,
            At("PyCodeObject", "_co_firsttraceable"),
            At("PyCodeObject", "_co_firsttraceable"),
            At("PyCodeObject", "_co_firsttraceable"),
            At("PyCodeObject", "_co_firsttraceable"),
        ],
    ),
    ("code_linetable", [At("PyCodeObject", "co_linetable"); 5]),
    ("bytes_size", [At("PyBytesObject", "ob_base.ob_size"); 5]),
    ("bytes_data", [At("PyBytesObject", "ob_sval"); 5]),
    ("str_length", [At("PyASCIIObject", "length"); 5]),
    ("str_state", [At("PyASCIIObject", "state"); 5]),
    ("str_ascii_data", [Size("PyASCIIObject"); 5]),
    ("str_compact_data", [Size("PyCompactUnicodeObject"); 5]),
];

/// The fields whose table value stands in a minor that has them, and why.
#[cfg(test)]
const KEPT: &[(&str, &[u32], &str)] = &[
    (
        "code_epoch_size",
        &[10, 11, 12, 13, 14],
        "a size read, not an offset",
    ),
    ("owner_skip_from", &[12, 13, 14], "an owner, not an offset"),
    (
        "code_ident",
        &[10, 11],
        "the start of the code fingerprint, a choice of the walk",
    ),
    (
        "code_adaptive",
        &[10],
        "3.10 has no adaptive bytecode: unused",
    ),
];

/// What an interpreter file's DWARF gave.
#[derive(Clone, Debug)]
pub enum Dwarf {
    /// Neither the file nor a debug file found for it has DWARF.
    Absent,
    Read(DwarfOffsets),
    /// DWARF that could not be used: the next source stands (the reason is said).
    Failed {
        file: PathBuf,
        error: DwarfError,
    },
}

/// The fields of the table DWARF gives, and the file it was read from.
#[derive(Clone, Debug)]
pub struct DwarfOffsets {
    pub file: PathBuf,
    values: Vec<(&'static Field, u32)>,
}

/// Why an interpreter's DWARF was not used.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DwarfError {
    #[error("it cannot be read ({0})")]
    Unreadable(String),
    #[error("it has no struct {0}")]
    NoStruct(&'static str),
    #[error("its {0} has no member {1}")]
    NoMember(&'static str, &'static str),
    #[error("its {0}.{1} is not a u32 offset ({2})")]
    TooLarge(&'static str, &'static str, u64),
    #[error("its _Py_DebugOffsets disagree with it ({0})")]
    Disagrees(String),
}

impl From<gimli::Error> for DwarfError {
    fn from(error: gimli::Error) -> Self {
        DwarfError::Unreadable(error.to_string())
    }
}

/// The DWARF of the interpreter file `path` (its contents `bytes`), minor version `minor`:
/// its own, or a debug file's under `roots`' `/usr/lib/debug` (a traced process's root,
/// then cudatrace's) or beside it, by build-id then `.gnu_debuglink`.
pub fn find(bytes: &[u8], path: &Path, roots: &[PathBuf], minor: u32) -> Dwarf {
    let Ok(file) = object::File::parse(bytes) else {
        return Dwarf::Absent;
    };
    if has_dwarf(&file) {
        return read(&file, path, minor);
    }
    let build_id = file.build_id().ok().flatten();
    let debuglink = file.gnu_debuglink().ok().flatten();
    for candidate in debug_files(path, roots, build_id, debuglink.map(|(name, _)| name)) {
        let Ok(debug_bytes) = fs::read(&candidate) else {
            continue;
        };
        let Ok(debug) = object::File::parse(&*debug_bytes) else {
            continue;
        };
        // The debug file of this very build: the same build-id, or (a file without one) the
        // CRC its debuglink names.
        let same = match build_id {
            Some(id) => debug.build_id().ok().flatten() == Some(id),
            None => debuglink.is_some_and(|(_, crc)| crc32fast::hash(&debug_bytes) == crc),
        };
        if same && has_dwarf(&debug) {
            return read(&debug, &candidate, minor);
        }
    }
    Dwarf::Absent
}

/// Where a separate debug file may be, as GDB looks.
fn debug_files(
    path: &Path,
    roots: &[PathBuf],
    build_id: Option<&[u8]>,
    debuglink: Option<&[u8]>,
) -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some((first, rest)) = build_id.and_then(<[u8]>::split_first) {
        let rest: String = rest.iter().map(|byte| format!("{byte:02x}")).collect();
        for root in roots {
            candidates.push(root.join(format!("usr/lib/debug/.build-id/{first:02x}/{rest}.debug")));
        }
    }
    if let (Some(name), Some(dir)) = (
        debuglink.and_then(|name| std::str::from_utf8(name).ok()),
        path.parent(),
    ) {
        candidates.push(dir.join(name));
        candidates.push(dir.join(".debug").join(name));
        for root in roots {
            candidates.push(
                root.join("usr/lib/debug")
                    .join(dir.strip_prefix("/").unwrap_or(dir))
                    .join(name),
            );
        }
    }
    candidates.retain(|candidate| candidate != path);
    candidates
}

fn has_dwarf(file: &object::File) -> bool {
    file.section_by_name(".debug_info")
        .is_some_and(|section| section.kind() != object::SectionKind::UninitializedData)
}

fn read(file: &object::File, path: &Path, minor: u32) -> Dwarf {
    match offsets(file, minor) {
        Ok(values) => Dwarf::Read(DwarfOffsets {
            file: path.to_owned(),
            values,
        }),
        Err(error) => Dwarf::Failed {
            file: path.to_owned(),
            error,
        },
    }
}

/// A section's bytes, uncompressed (zlib: what Debian's debug files use).
fn section_data<'data>(
    section: &object::Section<'data, '_>,
) -> Result<Cow<'data, [u8]>, DwarfError> {
    let unreadable = |e: &dyn std::fmt::Display| {
        DwarfError::Unreadable(format!("{}: {e}", section.name().unwrap_or("?")))
    };
    let compressed = section.compressed_data().map_err(|e| unreadable(&e))?;
    match compressed.format {
        CompressionFormat::None => Ok(Cow::Borrowed(compressed.data)),
        CompressionFormat::Zlib => {
            let mut data = Vec::with_capacity(compressed.uncompressed_size as usize);
            flate2::read::ZlibDecoder::new(compressed.data)
                .read_to_end(&mut data)
                .map_err(|e| unreadable(&e))?;
            Ok(Cow::Owned(data))
        }
        other => Err(unreadable(&format!("compressed as {other:?}"))),
    }
}

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// The fields of [`MEMBERS`] for `minor`, from the first complete definition of each struct
/// (every unit that includes a header defines its structs alike).
fn offsets(file: &object::File, minor: u32) -> Result<Vec<(&'static Field, u32)>, DwarfError> {
    let column = minor
        .checked_sub(*MINORS.start())
        .and_then(|column| usize::try_from(column).ok())
        .filter(|_| MINORS.contains(&minor))
        .ok_or_else(|| DwarfError::Unreadable(format!("no members known for 3.{minor}")))?;
    let wanted: Vec<(&str, Member)> = MEMBERS
        .iter()
        .map(|(name, members)| (*name, members[column]))
        .collect();
    offsets_of(file, &wanted)
}

/// The fields `wanted` names, where DWARF has them.
fn offsets_of(
    file: &object::File,
    wanted: &[(&str, Member)],
) -> Result<Vec<(&'static Field, u32)>, DwarfError> {
    let sections = gimli::DwarfSections::load(|id| match file.section_by_name(id.name()) {
        Some(section) => section_data(&section),
        None => Ok(Cow::Borrowed(&[][..])),
    })?;
    let dwarf = sections.borrow(|section| Slice::new(section, LittleEndian));
    let wanted: Vec<(&'static Field, Member)> = wanted
        .iter()
        .map(|(name, member)| (layout::field(name).expect("a field of the table"), *member))
        .collect();
    let mut pending: Vec<&'static str> = Vec::new();
    for (_, member) in &wanted {
        if let At(structure, _) | Size(structure) = member
            && !pending.contains(structure)
        {
            pending.push(structure);
        }
    }
    // Each wanted field's value or why not, said in [`MEMBERS`]' order.
    let mut values: Vec<Option<Result<u32, DwarfError>>> = vec![None; wanted.len()];
    let mut units = dwarf.units();
    while !pending.is_empty()
        && let Some(header) = units.next()?
    {
        let unit = dwarf.unit(header)?;
        let mut cursor = unit.entries();
        // The unit's root, then its children one by one, their own children skipped.
        if cursor.next_dfs()?.is_none() || cursor.next_dfs()?.is_none() {
            continue;
        }
        while let Some(entry) = cursor.current() {
            let found = match entry.attr_value(constants::DW_AT_name) {
                Some(name) => {
                    let name = dwarf.attr_string(&unit, name)?;
                    pending
                        .iter()
                        .position(|wanted| name.slice() == wanted.as_bytes())
                        .and_then(|at| Some((at, definition(&unit, entry)?)))
                }
                None => None,
            };
            if let Some((at, structure)) = found {
                let name = pending.swap_remove(at);
                for ((_, member), value) in wanted.iter().zip(&mut values) {
                    let (read, path) = match *member {
                        At(of, path) if of == name => {
                            (member_offset(&dwarf, &unit, structure, path)?, path)
                        }
                        Size(of) if of == name => (
                            unit.entry(structure)?
                                .attr_value(constants::DW_AT_byte_size)
                                .and_then(|size| size.udata_value()),
                            "(its size)",
                        ),
                        _ => continue,
                    };
                    *value = Some(
                        read.ok_or(DwarfError::NoMember(name, path))
                            .and_then(|read| {
                                u32::try_from(read)
                                    .map_err(|_| DwarfError::TooLarge(name, path, read))
                            }),
                    );
                }
            }
            cursor.next_sibling()?;
        }
    }
    let mut given = Vec::new();
    for ((field, member), value) in wanted.iter().zip(values) {
        match (member, value) {
            (_, Some(value)) => given.push((*field, value?)),
            (At(structure, _) | Size(structure), None) => {
                return Err(DwarfError::NoStruct(structure));
            }
            _ => {}
        }
    }
    Ok(given)
}

/// The complete struct a top-level entry defines: itself, or the struct its typedef names.
fn definition(
    unit: &gimli::Unit<Slice>,
    entry: &gimli::DebuggingInformationEntry<Slice>,
) -> Option<UnitOffset> {
    match entry.tag() {
        constants::DW_TAG_structure_type => complete(entry).then(|| entry.offset()),
        constants::DW_TAG_typedef => aggregate(unit, type_of(entry)?),
        _ => None,
    }
}

fn complete(entry: &gimli::DebuggingInformationEntry<Slice>) -> bool {
    entry.attr_value(constants::DW_AT_declaration).is_none()
}

fn type_of(entry: &gimli::DebuggingInformationEntry<Slice>) -> Option<UnitOffset> {
    match entry.attr_value(constants::DW_AT_type)? {
        AttributeValue::UnitRef(offset) => Some(offset),
        _ => None,
    }
}

/// The complete struct or union a type is, through typedefs and qualifiers.
fn aggregate(unit: &gimli::Unit<Slice>, mut offset: UnitOffset) -> Option<UnitOffset> {
    for _ in 0..16 {
        let entry = unit.entry(offset).ok()?;
        match entry.tag() {
            constants::DW_TAG_typedef
            | constants::DW_TAG_const_type
            | constants::DW_TAG_volatile_type => {
                offset = type_of(&entry)?;
            }
            constants::DW_TAG_structure_type | constants::DW_TAG_union_type => {
                return complete(&entry).then_some(offset);
            }
            _ => return None,
        }
    }
    None
}

/// The offset of `path` (`interpreters.head`) in the struct at `structure`.
fn member_offset(
    dwarf: &gimli::Dwarf<Slice>,
    unit: &gimli::Unit<Slice>,
    structure: UnitOffset,
    path: &str,
) -> Result<Option<u64>, DwarfError> {
    let (name, rest) = match path.split_once('.') {
        Some((name, rest)) => (name, Some(rest)),
        None => (path, None),
    };
    let Some((offset, member_type)) = find_member(dwarf, unit, structure, name)? else {
        return Ok(None);
    };
    let Some(rest) = rest else {
        return Ok(Some(offset));
    };
    let Some(inner) = member_type.and_then(|ty| aggregate(unit, ty)) else {
        return Ok(None);
    };
    Ok(member_offset(dwarf, unit, inner, rest)?.map(|within| offset + within))
}

/// A member named `name` of the struct or union at `structure`, or of one of its anonymous
/// members: its offset and type.
fn find_member(
    dwarf: &gimli::Dwarf<Slice>,
    unit: &gimli::Unit<Slice>,
    structure: UnitOffset,
    name: &str,
) -> Result<Option<(u64, Option<UnitOffset>)>, DwarfError> {
    let mut tree = unit.entries_tree(Some(structure))?;
    let mut children = tree.root()?.children();
    let mut anonymous = Vec::new();
    while let Some(child) = children.next()? {
        let entry = child.entry();
        if entry.tag() != constants::DW_TAG_member {
            continue;
        }
        let location = member_location(unit, entry)?;
        match entry.attr_value(constants::DW_AT_name) {
            Some(member) if dwarf.attr_string(unit, member)?.slice() == name.as_bytes() => {
                return Ok(Some((location, type_of(entry))));
            }
            Some(_) => {}
            None => anonymous.push((location, type_of(entry))),
        }
    }
    for (location, member_type) in anonymous {
        if let Some(inner) = member_type.and_then(|ty| aggregate(unit, ty))
            && let Some((within, found_type)) = find_member(dwarf, unit, inner, name)?
        {
            return Ok(Some((location + within, found_type)));
        }
    }
    Ok(None)
}

/// A member's `DW_AT_data_member_location`: a constant, or DWARF 2's `DW_OP_plus_uconst`;
/// none for a union's members.
fn member_location(
    unit: &gimli::Unit<Slice>,
    entry: &gimli::DebuggingInformationEntry<Slice>,
) -> Result<u64, DwarfError> {
    let Some(location) = entry.attr_value(constants::DW_AT_data_member_location) else {
        return Ok(0);
    };
    if let Some(offset) = location.udata_value() {
        return Ok(offset);
    }
    if let AttributeValue::Exprloc(expression) = location
        && let Some(Operation::PlusConstant { value }) =
            expression.operations(unit.encoding()).next()?
    {
        return Ok(value);
    }
    Err(DwarfError::Unreadable(format!(
        "a member location {location:?}"
    )))
}

impl DwarfOffsets {
    /// `py` with every field DWARF gives taken from it, and the reads starting at their
    /// first fields.
    pub fn apply(&self, mut py: PyProcess) -> PyProcess {
        for (field, value) in &self.values {
            field.set(&mut py, *value);
        }
        layout::start_reads_at_first_fields(&mut py);
        py
    }

    /// The fields whose value here differs from `table`'s: `name: FILE in the file, TABLE
    /// in the table`.
    pub fn differences(&self, table: &PyProcess) -> Vec<String> {
        let applied = self.apply(*table);
        FIELDS
            .iter()
            .filter(|field| field.get(&applied) != field.get(table))
            .map(|field| {
                format!(
                    "{}: {} in the file, {} in the table",
                    field.name,
                    field.get(&applied),
                    field.get(table)
                )
            })
            .collect()
    }

    /// Where `_Py_DebugOffsets` (3.13+) say otherwise than this DWARF gives (`py`: the layout
    /// DWARF gave): both come from the same build, so neither is trusted then.
    pub fn disagreement(&self, debug_offsets: &DebugOffsets, py: &PyProcess) -> Option<DwarfError> {
        let differs = debug_offsets.differences(py);
        (!differs.is_empty()).then(|| {
            DwarfError::Disagrees(
                differs
                    .iter()
                    .map(|d| {
                        d.replace(" in the file", " in _Py_DebugOffsets")
                            .replace(" in the table", " in DWARF")
                    })
                    .collect::<Vec<_>>()
                    .join("; "),
            )
        })
    }
}

/// A field's value in `py`, where it has one.
#[cfg(test)]
fn value(field: &Field, py: &PyProcess) -> Option<u32> {
    Some(field.get(py)).filter(|value| *value != tracer_common::stacks::NO_FIELD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::{debug_offsets::DebugOffsets, elf, layout::table};

    /// Every field of the table has a row here and every row a field; a field DWARF does
    /// not give in a minor that has it is one of [`KEPT`].
    #[test]
    fn every_field_of_the_table_has_its_members() {
        assert_eq!(
            MEMBERS.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
            FIELDS.iter().map(|field| field.name).collect::<Vec<_>>()
        );
        for (name, members) in MEMBERS {
            let field = layout::field(name).unwrap();
            for (column, minor) in MINORS.enumerate() {
                if matches!(members[column], Table)
                    && value(field, &table(minor).unwrap()).is_some()
                {
                    assert!(
                        KEPT.iter()
                            .any(|(kept, minors, _)| kept == name && minors.contains(&minor)),
                        "{name} in 3.{minor}"
                    );
                }
            }
        }
    }

    /// pyenv's interpreters (CPython's configure builds with `-g`): the offsets their DWARF
    /// gives are the table's, field by field, and it gives every field but those kept.
    #[test]
    fn pyenvs_dwarf_gives_the_tables_values() {
        for (version, minor) in [
            ("3.10.13", 10),
            ("3.11.7", 11),
            ("3.12.1", 12),
            ("3.13.0", 13),
        ] {
            let path = PathBuf::from(format!(
                "/root/.pyenv/versions/{version}/lib/libpython3.{minor}.so.1.0"
            ));
            let Ok(bytes) = fs::read(&path) else {
                assert_ne!(
                    std::env::var("CI").as_deref(),
                    Ok("true"),
                    "CI: {} is missing",
                    path.display()
                );
                continue;
            };
            let Dwarf::Read(offsets) = find(&bytes, &path, &[], minor) else {
                panic!("{}: {:?}", path.display(), find(&bytes, &path, &[], minor));
            };
            assert_eq!(offsets.file, path);
            let expected = table(minor).unwrap();
            for (field, value) in &offsets.values {
                assert_eq!(*value, field.get(&expected), "{} in 3.{minor}", field.name);
            }
            let given = offsets.values.len();
            let column = (minor - 10) as usize;
            let members = MEMBERS
                .iter()
                .filter(|(_, members)| matches!(members[column], At(..) | Size(_)))
                .count();
            assert_eq!(given, members, "3.{minor}");
            assert_eq!(offsets.apply(expected), expected, "3.{minor}");
            let mut moved = expected;
            moved.tstate_interp += 8;
            assert_eq!(offsets.apply(moved), expected);
            assert_eq!(
                offsets.differences(&moved),
                ["tstate_interp: 16 in the file, 24 in the table"]
            );
        }
    }

    /// pyenv's 3.13.0 has both DWARF and `_Py_DebugOffsets`: they agree; a DWARF value
    /// moved is a disagreement, naming the field and both values.
    #[test]
    fn dwarf_and_debug_offsets_agree_or_dwarf_is_not_trusted() {
        let path = Path::new("/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0");
        let Ok(bytes) = fs::read(path) else { return };
        let file = elf::read(&bytes, path).unwrap();
        let debug_offsets = DebugOffsets::read(&file.runtime_bytes, 13).unwrap();
        let Dwarf::Read(mut offsets) = find(&bytes, path, &[], 13) else {
            panic!("no DWARF in {}", path.display());
        };
        let py = offsets.apply(table(13).unwrap());
        assert_eq!(offsets.disagreement(&debug_offsets, &py), None);
        let frame = offsets
            .values
            .iter_mut()
            .find(|(field, _)| field.name == "tstate_frame")
            .unwrap();
        frame.1 += 8;
        let py = offsets.apply(table(13).unwrap());
        let error = offsets.disagreement(&debug_offsets, &py).unwrap();
        assert_eq!(
            error.to_string(),
            "its _Py_DebugOffsets disagree with it (tstate_frame: 72 in _Py_DebugOffsets, 80 \
             in DWARF)"
        );
    }

    /// A struct the DWARF lacks, or a member, is said and nothing is given.
    #[test]
    fn a_missing_struct_or_member_fails_the_read() {
        let path = Path::new("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0");
        let Ok(bytes) = fs::read(path) else { return };
        let file = object::File::parse(&*bytes).unwrap();
        // 3.11's DWARF read for 3.13: its thread state has no `current_frame`.
        assert_eq!(
            offsets(&file, 13).unwrap_err(),
            DwarfError::NoMember("PyThreadState", "current_frame")
        );
        // 3.10's, for 3.11: no `_PyInterpreterFrame` at all.
        let path = Path::new("/root/.pyenv/versions/3.10.13/lib/libpython3.10.so.1.0");
        let Ok(bytes) = fs::read(path) else { return };
        let file = object::File::parse(&*bytes).unwrap();
        assert_eq!(
            offsets(&file, 11).unwrap_err(),
            DwarfError::NoMember("PyInterpreterState", "threads.head")
        );
        let Dwarf::Failed { file, error } = read(&file, path, 11) else {
            panic!("read");
        };
        assert_eq!(
            (file.as_path(), error.to_string()),
            (
                path,
                "its PyInterpreterState has no member threads.head".to_owned()
            )
        );
        // A struct none of its units defines.
        assert_eq!(
            offsets_of(
                &object::File::parse(&*bytes).unwrap(),
                &[("frame_code", At("_PyNoSuchStruct", "f_code"))]
            )
            .unwrap_err(),
            DwarfError::NoStruct("_PyNoSuchStruct")
        );
    }

    /// A file without DWARF and no debug file: none; with its DWARF moved to a separate
    /// file named by `.gnu_debuglink` beside it (as `objcopy --only-keep-debug` makes a
    /// `-dbg` package's), that file's.
    #[test]
    fn a_separate_debug_file_is_found_by_its_debuglink() {
        let source = Path::new("/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0");
        if !source.exists() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("cudatrace-dwarf-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let debug = dir.join("libpython3.12.so.1.0.debug");
        let stripped = dir.join("libpython3.12.so.1.0");
        let run = |program: &str, args: &[&std::ffi::OsStr]| {
            let status = std::process::Command::new(program)
                .args(args)
                .status()
                .unwrap();
            assert!(status.success(), "{program} {args:?}");
        };
        run(
            "objcopy",
            &[
                "--only-keep-debug".as_ref(),
                source.as_os_str(),
                debug.as_os_str(),
            ],
        );
        run(
            "strip",
            &[
                "--strip-debug".as_ref(),
                "-o".as_ref(),
                stripped.as_os_str(),
                source.as_os_str(),
            ],
        );
        let bytes = fs::read(&stripped).unwrap();
        assert!(matches!(find(&bytes, &stripped, &[], 12), Dwarf::Absent));
        let link = std::ffi::OsString::from(format!("--add-gnu-debuglink={}", debug.display()));
        // objcopy names the debug file by its file name alone.
        let status = std::process::Command::new("objcopy")
            .current_dir(&dir)
            .arg(&link)
            .arg(&stripped)
            .status()
            .unwrap();
        assert!(status.success());
        let bytes = fs::read(&stripped).unwrap();
        let file = elf::read(&bytes, &stripped).unwrap();
        assert_eq!(file.version_hex.map(|hex| hex >> 16), Some(0x030c));
        let Dwarf::Read(offsets) = find(&bytes, &stripped, &[], 12) else {
            panic!("{:?}", find(&bytes, &stripped, &[], 12));
        };
        assert_eq!(offsets.file, debug);
        let expected = table(12).unwrap();
        assert_eq!(offsets.apply(expected), expected);
        assert!(offsets.differences(&expected).is_empty());
        // A debug file of another build (another build-id) is not taken.
        run(
            "objcopy",
            &[
                "--only-keep-debug".as_ref(),
                Path::new("/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0").as_os_str(),
                debug.as_os_str(),
            ],
        );
        assert!(matches!(find(&bytes, &stripped, &[], 12), Dwarf::Absent));
        fs::remove_dir_all(&dir).unwrap();
    }
}
