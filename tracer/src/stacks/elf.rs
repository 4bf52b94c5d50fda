//! An interpreter file as cudatrace reads it before looking at the process: where
//! `_PyRuntime` and `PyCode_Type` are, which CPython it is, and for 3.13+ its
//! `_Py_DebugOffsets` (the start of `_PyRuntime`, initialised data in the file).

use std::path::Path;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};

/// Bytes of `_PyRuntime` read for its debug offsets (3.14's struct is 760).
const DEBUG_OFFSETS_READ: u64 = 1024;

/// What the file says of its interpreter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterpreterFile {
    /// `&_PyRuntime` and `&PyCode_Type`, as link-time addresses.
    pub runtime: u64,
    pub code_type: Option<u64>,
    /// `&PyUnicode_Type` and `&PyBytes_Type`, for the check on the live process.
    pub str_type: Option<u64>,
    pub bytes_type: Option<u64>,
    /// `PY_VERSION_HEX` from `Py_Version` (3.11+).
    pub version_hex: Option<u32>,
    /// The start of `_PyRuntime` as the file initialises it.
    pub runtime_bytes: Vec<u8>,
    /// A position-independent file (a PIE or a shared library): its addresses move by the
    /// load bias.
    pub relocatable: bool,
    /// The first loadable segment's address and file offset (to find the load bias).
    pub first_load: (u64, u64),
    /// A debug build (`Py_REF_DEBUG`): another object layout.
    pub debug_build: bool,
}

/// Why a file is not an interpreter cudatrace can read.
#[derive(Debug, PartialEq, Eq)]
pub enum NotInterpreter {
    /// No `_PyRuntime`: not a CPython interpreter (or one stripped of it).
    NoRuntime,
    /// Not an ELF file cudatrace can parse.
    NotElf(String),
}

/// Reads `bytes` (the file `path`'s contents).
pub fn read(bytes: &[u8], path: &Path) -> Result<InterpreterFile, NotInterpreter> {
    let file = object::File::parse(bytes)
        .map_err(|e| NotInterpreter::NotElf(format!("{}: {e}", path.display())))?;
    let symbol = |name: &str| {
        file.dynamic_symbols()
            .chain(file.symbols())
            .find(|s| s.name() == Ok(name) && s.address() != 0)
            .map(|s| s.address())
    };
    // A stripped file keeps the `.PyRuntime` section, which starts at `_PyRuntime`.
    let runtime = symbol("_PyRuntime")
        .or_else(|| file.section_by_name(".PyRuntime").map(|s| s.address()))
        .ok_or(NotInterpreter::NoRuntime)?;
    let read_at = |address: u64, len: u64| -> Option<Vec<u8>> {
        file.segments().find_map(|segment| {
            let start = segment.address();
            let (offset, size) = segment.file_range();
            if address < start || address >= start + size {
                return None;
            }
            let at = offset + (address - start);
            let end = (at + len).min(offset + size);
            bytes.get(at as usize..end as usize).map(<[u8]>::to_vec)
        })
    };
    let version_hex = symbol("Py_Version")
        .and_then(|address| read_at(address, 4))
        .and_then(|b| Some(u32::from_le_bytes(b.get(..4)?.try_into().ok()?)));
    let first_load = file
        .segments()
        .map(|s| (s.address(), s.file_range().0))
        .min_by_key(|(_, offset)| *offset)
        .unwrap_or((0, 0));
    Ok(InterpreterFile {
        runtime,
        code_type: symbol("PyCode_Type"),
        str_type: symbol("PyUnicode_Type"),
        bytes_type: symbol("PyBytes_Type"),
        version_hex,
        runtime_bytes: read_at(runtime, DEBUG_OFFSETS_READ).unwrap_or_default(),
        relocatable: file.kind() != object::ObjectKind::Executable,
        first_load,
        debug_build: symbol("_Py_NegativeRefcount").is_some(),
    })
}

/// The minor version a file's name gives (`python3.10`, `libpython3.10.so.1.0`), for
/// 3.10, which has no `Py_Version`.
pub fn minor_from_name(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let rest = name
        .strip_prefix("lib")
        .unwrap_or(name)
        .strip_prefix("python3.")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `3.12.3`, `3.14.0rc2` from `PY_VERSION_HEX`.
pub fn version_text(hex: u32) -> String {
    let (major, minor, micro) = (hex >> 24, (hex >> 16) & 0xff, (hex >> 8) & 0xff);
    let (level, serial) = ((hex >> 4) & 0xf, hex & 0xf);
    let suffix = match level {
        0xa => format!("a{serial}"),
        0xb => format!("b{serial}"),
        0xc => format!("rc{serial}"),
        _ => String::new(),
    };
    format!("{major}.{minor}.{micro}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_python_writes_them() {
        assert_eq!(version_text(0x030c_03f0), "3.12.3");
        assert_eq!(version_text(0x030e_00c2), "3.14.0rc2");
        assert_eq!(version_text(0x030d_00a1), "3.13.0a1");
        assert_eq!(minor_from_name(Path::new("/usr/bin/python3.10")), Some(10));
        assert_eq!(
            minor_from_name(Path::new("/p/lib/libpython3.10.so.1.0")),
            Some(10)
        );
        assert_eq!(minor_from_name(Path::new("/usr/bin/python3")), None);
    }

    /// The machine's own interpreters, where they are: Debian's static, stripped 3.11.
    #[test]
    fn debians_python_311_is_found_stripped_and_static() {
        let path = Path::new("/usr/bin/python3.11");
        let Ok(bytes) = std::fs::read(path) else {
            return;
        };
        let file = read(&bytes, path).unwrap();
        assert_eq!(file.version_hex.map(|v| v >> 16), Some(0x030b));
        assert!(!file.relocatable);
        assert!(file.code_type.is_some());
        assert!(file.str_type.is_some() && file.bytes_type.is_some());
        assert!(!file.debug_build);
    }

    #[test]
    fn a_file_without_a_runtime_is_no_interpreter() {
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        assert_eq!(read(&bytes, &exe), Err(NotInterpreter::NoRuntime));
    }
}
