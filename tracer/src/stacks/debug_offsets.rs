//! CPython's own `_Py_DebugOffsets` (3.13+), at the start of `_PyRuntime` in the
//! interpreter file: the fields the layout table gives positions for, read and laid over
//! the table's values.

use tracer_common::stacks::PyProcess;

use super::layout::{self, FIELDS, Field, Given};

/// `_Py_DebugOffsets`, as far as the walk uses it.
#[derive(Clone, Debug)]
pub struct DebugOffsets {
    /// `PY_VERSION_HEX`.
    pub version: u64,
    pub free_threaded: bool,
    values: Vec<(&'static Field, u64)>,
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
        for field in FIELDS {
            if let Some(at) = field.position(minor) {
                values.push((
                    field,
                    word(at).ok_or(DebugOffsetsError::Short(bytes.len()))?,
                ));
            }
        }
        Ok(DebugOffsets {
            version,
            free_threaded: free_threaded != 0,
            values,
        })
    }

    /// The fields whose value here differs from `table`'s: `name: FILE in the file, TABLE
    /// in the table`.
    pub fn differences(&self, table: &PyProcess) -> Vec<String> {
        self.values
            .iter()
            .filter(|(field, value)| u64::from(field.get(table)) != *value)
            .map(|(field, value)| {
                format!(
                    "{}: {value} in the file, {} in the table",
                    field.name,
                    field.get(table)
                )
            })
            .collect()
    }

    /// `py` (the table's layout) with every field the debug offsets give taken from them,
    /// and every field derived from one of those derived again. `None` when a value does
    /// not fit where the walk reads it (a layout the probes cannot read in one piece).
    pub fn apply(&self, mut py: PyProcess) -> Option<PyProcess> {
        for (field, value) in &self.values {
            field.set(&mut py, u32::try_from(*value).ok()?);
        }
        for field in FIELDS {
            if let Given::From(from, by) = field.given
                && let Some((source, _)) = self.values.iter().find(|(given, _)| given.name == from)
            {
                let value = i64::from(source.get(&py)) + by;
                field.set(&mut py, u32::try_from(value).ok()?);
            }
        }
        layout::drop_optional_misfits(&mut py);
        layout::fits(&py).then_some(py)
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::stacks::NO_FIELD;

    use super::*;
    use crate::stacks::{
        elf,
        layout::{DEBUG_MINORS, table},
    };

    /// `_Py_DebugOffsets` with each field the table's value at its position, as Debian's
    /// 3.13.5 and 3.14.10 have them.
    fn debug_offsets(minor: u32, version: u64) -> Vec<u8> {
        let expected = table(minor).unwrap();
        let mut bytes = vec![0u8; 800];
        bytes[..8].copy_from_slice(b"xdebugpy");
        bytes[8..16].copy_from_slice(&version.to_le_bytes());
        for field in FIELDS {
            if let Some(at) = field.position(minor) {
                bytes[at..at + 8].copy_from_slice(&u64::from(field.get(&expected)).to_le_bytes());
            }
        }
        bytes
    }

    /// Debug offsets with the table's values give the table's values, over a layout that
    /// has none of the fields they give or derive (which were checked against the headers).
    #[test]
    fn debug_offsets_give_the_tables_values() {
        for (minor, version) in [(13, 0x030d_05f0u64), (14, 0x030e_0af0)] {
            let expected = table(minor).unwrap();
            let offsets = DebugOffsets::read(&debug_offsets(minor, version), minor).unwrap();
            assert_eq!((offsets.version, offsets.free_threaded), (version, false));
            let mut unknown = expected;
            for field in FIELDS {
                if field.position(minor).is_some() || matches!(field.given, Given::From(..)) {
                    field.set(&mut unknown, NO_FIELD);
                }
            }
            assert_ne!(unknown, expected);
            assert_eq!(offsets.apply(unknown), Some(expected), "3.{minor}");
            assert_eq!(offsets.differences(&expected), Vec::<String>::new());
            let mut moved = expected;
            moved.tstate_frame += 8;
            moved.code_qualname -= 8;
            assert_eq!(
                offsets.differences(&moved),
                [
                    format!(
                        "tstate_frame: {0} in the file, {1} in the table",
                        expected.tstate_frame,
                        expected.tstate_frame + 8
                    ),
                    format!(
                        "code_qualname: {0} in the file, {1} in the table",
                        expected.code_qualname,
                        expected.code_qualname - 8
                    ),
                ],
                "3.{minor}"
            );
            assert_eq!(offsets.apply(moved), Some(expected), "3.{minor}");
        }
    }

    /// Each minor's positions are distinct words after the header (cookie, version,
    /// free-threaded).
    #[test]
    fn positions_are_distinct_words_after_the_header() {
        for minor in DEBUG_MINORS {
            let mut positions: Vec<usize> =
                FIELDS.iter().filter_map(|f| f.position(minor)).collect();
            assert!(
                positions.iter().all(|at| at % 8 == 0 && *at >= 24),
                "3.{minor}"
            );
            let count = positions.len();
            positions.sort_unstable();
            positions.dedup();
            assert_eq!(positions.len(), count, "3.{minor}");
        }
    }

    /// Interpreters this machine has (pyenv's, and the `--stacks` root tests' trixie
    /// root): CPython's own debug offsets give exactly the table's values.
    #[test]
    fn real_interpreters_debug_offsets_are_the_tables() {
        let trixie = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/pythons/trixie");
        for path in [
            "/root/.pyenv/versions/3.13.0/lib/libpython3.13.so.1.0".to_owned(),
            format!("{trixie}/usr/bin/python3.13"),
            format!("{trixie}/usr/bin/python3.14"),
        ] {
            let path = std::path::Path::new(&path);
            let Ok(bytes) = std::fs::read(path) else {
                // In CI (`CI=true`) every one must be there.
                assert_ne!(
                    std::env::var("CI").as_deref(),
                    Ok("true"),
                    "CI: {} is missing",
                    path.display()
                );
                continue;
            };
            let file = elf::read(&bytes, path).unwrap();
            let minor = (file.version_hex.unwrap() >> 16) & 0xff;
            let expected = table(minor).unwrap();
            let offsets = DebugOffsets::read(&file.runtime_bytes, minor).unwrap();
            for (field, value) in &offsets.values {
                assert_eq!(
                    *value,
                    u64::from(field.get(&expected)),
                    "{} in {}",
                    field.name,
                    path.display()
                );
            }
            assert_eq!(
                offsets.apply(expected),
                Some(expected),
                "{}",
                path.display()
            );
        }
    }

    /// A value the probes cannot read in one piece, or not a u32, refuses the layout.
    #[test]
    fn a_layout_out_of_the_reads_is_refused() {
        let minor = 13;
        let mut bytes = debug_offsets(minor, 0x030d_05f0);
        let at = layout::field("tstate_frame")
            .unwrap()
            .position(minor)
            .unwrap();
        bytes[at..at + 8].copy_from_slice(&4096u64.to_le_bytes());
        let offsets = DebugOffsets::read(&bytes, minor).unwrap();
        assert_eq!(offsets.apply(table(minor).unwrap()), None);
        bytes[at..at + 8].copy_from_slice(&(1u64 << 32).to_le_bytes());
        let offsets = DebugOffsets::read(&bytes, minor).unwrap();
        assert_eq!(offsets.apply(table(minor).unwrap()), None);
    }

    #[test]
    fn a_struct_without_its_cookie_or_cut_short_is_refused() {
        assert_eq!(
            DebugOffsets::read(b"xdebugpz", 13).unwrap_err(),
            DebugOffsetsError::NoCookie
        );
        assert_eq!(
            DebugOffsets::read(b"xdebugpy\x01", 13).unwrap_err(),
            DebugOffsetsError::Short(9)
        );
        let bytes = debug_offsets(14, 0x030e_0af0);
        assert_eq!(
            DebugOffsets::read(&bytes[..600], 14).unwrap_err(),
            DebugOffsetsError::Short(600)
        );
    }
}
