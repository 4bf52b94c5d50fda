//! A line table longer than a code record holds ([`LINETABLE_CAP`], 16 KiB: Inductor's
//! generated `call` of about 1,000 lines has one): the probe sends the code object's names
//! and the table's address, and the table is read here through `/proc/PID/mem`, under the
//! identity the probe read (the code object at that address is the same one, with the same
//! table, before and after the read). So a frame of such a function has its exact line, or
//! none where the code object is gone by then (its process exited, the function freed):
//! the footer's `long_linetables` counts both.

use std::{fs::File, io, os::unix::fs::FileExt};

use tracer_common::stacks::{
    CODE_READ, CodeHead, FINGERPRINT_LEN, LINETABLE_CAP, PyProcess, py_flags,
};

/// The longest line table read (some 100,000 lines).
const MAX_LINETABLE: u64 = 4 << 20;

/// A process's memory, as `/proc/PID/mem` gives it.
pub trait Memory {
    fn read_at(&self, buf: &mut [u8], address: u64) -> io::Result<()>;
}

impl Memory for File {
    fn read_at(&self, buf: &mut [u8], address: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, address)
    }
}

/// The line table of the code record's code object, read from its process; `None` when
/// the code object at that address is no longer the one the probe read.
pub fn read(head: &CodeHead, py: &PyProcess) -> Option<Vec<u8>> {
    let memory = File::open(format!("/proc/{}/mem", head.header.pid)).ok()?;
    read_from(&memory, head, py)
}

/// [`read`] from any memory.
pub fn read_from(memory: &impl Memory, head: &CodeHead, py: &PyProcess) -> Option<Vec<u8>> {
    let table = head.objects[2];
    if table == 0 || !same_code(memory, head, py)? {
        return None;
    }
    let mut size = [0u8; 8];
    memory
        .read_at(&mut size, table + u64::from(py.bytes_size))
        .ok()?;
    let size = u64::from_le_bytes(size);
    if size <= LINETABLE_CAP as u64 || size > MAX_LINETABLE {
        return None;
    }
    let mut bytes = vec![0u8; size as usize];
    memory
        .read_at(&mut bytes, table + u64::from(py.bytes_data))
        .ok()?;
    // Still the same code object: it held its table (immutable) all along.
    same_code(memory, head, py)?.then_some(bytes)
}

/// Whether the code object at the record's address is still the one it read: a code
/// object, of the same identity (as the probes compute it, `stacks/walk.rs`), whose line
/// table is at the same address.
fn same_code(memory: &impl Memory, head: &CodeHead, py: &PyProcess) -> Option<bool> {
    let mut code = [0u8; CODE_READ];
    memory.read_at(&mut code, head.code).ok()?;
    let word = |offset: u32| {
        let at = offset as usize;
        code.get(at..at + 8)
            .map(|bytes| u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    };
    if word(py.code_ob_type)? != py.code_type || word(py.code_linetable)? != head.objects[2] {
        return Some(false);
    }
    Some(head.ident != 0 && identity(memory, head.code, py)? == head.ident)
}

/// A code object's identity as the probes compute it: `co_version` (3.12+), or on 3.10 and
/// 3.11 a fingerprint of its immutable fields.
fn identity(memory: &impl Memory, code: u64, py: &PyProcess) -> Option<u64> {
    let at = code + u64::from(py.code_ident);
    if py.flags & py_flags::FINGERPRINT == 0 {
        let mut version = [0u8; 4];
        memory.read_at(&mut version, at).ok()?;
        return Some(u64::from(u32::from_le_bytes(version)));
    }
    let mut fields = [0u8; FINGERPRINT_LEN];
    memory.read_at(&mut fields, at).ok()?;
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for (word, mask) in fields.chunks_exact(8).zip(py.fingerprint_mask) {
        let value = u64::from_le_bytes(word.try_into().expect("8 bytes")) & mask;
        hash = (hash ^ value).wrapping_mul(0x0000_0100_0000_01b3);
    }
    Some(hash | 1)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Memory made of a few regions, by address.
    #[derive(Default)]
    struct Regions(BTreeMap<u64, Vec<u8>>);

    impl Memory for Regions {
        fn read_at(&self, buf: &mut [u8], address: u64) -> io::Result<()> {
            let (start, bytes) = self
                .0
                .range(..=address)
                .next_back()
                .ok_or(io::ErrorKind::InvalidInput)?;
            let from = (address - start) as usize;
            let got = bytes
                .get(from..from + buf.len())
                .ok_or(io::ErrorKind::UnexpectedEof)?;
            buf.copy_from_slice(got);
            Ok(())
        }
    }

    const CODE: u64 = 0x10_0000;
    const TABLE: u64 = 0x20_0000;

    fn layout(fingerprint: bool) -> PyProcess {
        PyProcess {
            code_type: 0xc0de,
            code_ob_type: 8,
            code_ident: 120,
            code_linetable: 96,
            bytes_size: 16,
            bytes_data: 32,
            flags: if fingerprint {
                py_flags::FINGERPRINT
            } else {
                0
            },
            fingerprint_mask: [u64::MAX; FINGERPRINT_LEN / 8],
            ..PyProcess::default()
        }
    }

    /// A code object of version 77 (or fingerprinted) whose table is `table`.
    fn process(table: &[u8]) -> Regions {
        let mut code = vec![0u8; 512];
        code[8..16].copy_from_slice(&0xc0deu64.to_le_bytes());
        code[96..104].copy_from_slice(&TABLE.to_le_bytes());
        code[120..124].copy_from_slice(&77u32.to_le_bytes());
        let mut bytes = vec![0u8; 32];
        bytes[16..24].copy_from_slice(&(table.len() as u64).to_le_bytes());
        bytes.extend_from_slice(table);
        Regions(BTreeMap::from([(CODE, code), (TABLE, bytes)]))
    }

    fn head(ident: u64) -> CodeHead {
        CodeHead {
            code: CODE,
            ident,
            objects: [0, 0, TABLE],
            ..CodeHead::default()
        }
    }

    #[test]
    fn a_long_table_is_read_whole_under_the_code_objects_identity() {
        let table: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let memory = process(&table);
        assert_eq!(
            read_from(&memory, &head(77), &layout(false)),
            Some(table.clone())
        );
        // Another code object at the address (another version), or the same one whose
        // table is elsewhere: nothing.
        assert_eq!(read_from(&memory, &head(78), &layout(false)), None);
        let moved = CodeHead {
            objects: [0, 0, TABLE + 8],
            ..head(77)
        };
        assert_eq!(read_from(&memory, &moved, &layout(false)), None);
        let mut not_code = process(&table);
        not_code.0.get_mut(&CODE).unwrap()[8] ^= 1;
        assert_eq!(read_from(&not_code, &head(77), &layout(false)), None);
        // A table the record could have held is not one to read here.
        let short = process(&table[..LINETABLE_CAP]);
        assert_eq!(read_from(&short, &head(77), &layout(false)), None);
        // The memory gone (the process exited).
        assert_eq!(
            read_from(&Regions::default(), &head(77), &layout(false)),
            None
        );
    }

    #[test]
    fn on_3_10_and_3_11_the_identity_is_the_probes_fingerprint() {
        let table = vec![7u8; LINETABLE_CAP + 1];
        let memory = process(&table);
        let py = layout(true);
        // FNV-1a over the 16 words from `code_ident`, as walk.rs computes it.
        let mut fields = [0u8; FINGERPRINT_LEN];
        memory.read_at(&mut fields, CODE + 120).unwrap();
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for word in fields.chunks_exact(8) {
            hash = (hash ^ u64::from_le_bytes(word.try_into().unwrap()))
                .wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_eq!(read_from(&memory, &head(hash | 1), &py), Some(table));
        assert_eq!(read_from(&memory, &head(77), &py), None);
    }
}
