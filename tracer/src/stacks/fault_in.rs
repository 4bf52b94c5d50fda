//! A code object whose read failed in the probe (a page not resident: a probe cannot fault
//! pages in, and a static interpreter's frozen modules keep their names and line tables in
//! file pages nothing may have touched yet): its memory is read here through
//! `/proc/PID/mem`, which faults the pages into the process, so that the probe's next read
//! of it succeeds. What is read here is not used: the probe reads the code object itself,
//! under its identity check.

use std::{fs::File, os::unix::fs::FileExt};

use tracer_common::stacks::{CODE_READ, CodeHead, FILENAME_CAP, LINETABLE_CAP};

/// Bytes read of an object's header, and of its contents at most.
const HEADER: usize = 64;
const CONTENTS: usize = FILENAME_CAP + LINETABLE_CAP;

/// Touches the code object's memory and its names' and line table's.
pub fn fault_in(head: &CodeHead) {
    let Ok(memory) = File::open(format!("/proc/{}/mem", head.header.pid)) else {
        return;
    };
    let mut buffer = vec![0u8; CONTENTS];
    let _ = memory.read_at(&mut buffer[..CODE_READ], head.code);
    for object in head.objects {
        if object == 0 {
            continue;
        }
        let mut header = [0u8; HEADER];
        if memory.read_at(&mut header, object).is_err() {
            continue;
        }
        // A `str`'s length or a `bytes`' size, both at 16: four bytes each, past the
        // largest header (72), cover the contents of either.
        let size = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
        let len = (size.saturating_mul(4).saturating_add(72) as usize).min(CONTENTS);
        let _ = memory.read_at(&mut buffer[..len], object);
    }
}
