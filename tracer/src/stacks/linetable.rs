//! A code object's line table: which line an instruction belongs to, as CPython decodes it
//! (`PyCode_Addr2Line`, `co_lines()`, `co_positions()`), from the table bytes the probes
//! copied. Never a guess: an instruction without a line has none.

/// The line of the instruction `unit` code units into the code (3.10: its `f_lasti`), or
/// `None` where CPython has no line for it.
pub fn line_of(minor: u32, table: &[u8], first_line: i32, unit: i32) -> Option<u32> {
    let line = if minor == 10 {
        line_310(table, first_line, unit)?
    } else {
        line_311(table, first_line, unit)?
    };
    u32::try_from(line).ok()
}

/// PEP 626 (3.10): `(byte delta, line delta)` pairs; a line delta of -128 means no line.
/// Addresses are in bytes, two a code unit; a frame that has not started (`f_lasti` -1)
/// is on its first line.
fn line_310(table: &[u8], first_line: i32, unit: i32) -> Option<i32> {
    if unit < 0 {
        return Some(first_line);
    }
    let address = 2 * i64::from(unit);
    let mut end = 0i64;
    let mut line = first_line;
    for pair in table.chunks_exact(2) {
        let start = end;
        end += i64::from(pair[0]);
        let delta = pair[1] as i8;
        let this = if delta == -128 {
            None
        } else {
            line += i32::from(delta);
            Some(line)
        };
        if start <= address && address < end {
            return this;
        }
    }
    None
}

/// The location table (3.11+, `Objects/locations.md`): entries of 1 to 8 code units, each
/// opening with a byte whose bit 7 is set, bits 3-6 its code and bits 0-2 its length less
/// one, followed by varints. Codes 0-9 keep the line (short forms), 10-12 add 0 to 2, 13
/// (no columns) and 14 (long form) add a signed varint, 15 has no location.
fn line_311(table: &[u8], first_line: i32, unit: i32) -> Option<i32> {
    let mut line = first_line;
    let mut start = 0i32;
    let mut at = 0;
    while at < table.len() {
        let head = table[at];
        let code = (head >> 3) & 15;
        let length = i32::from(head & 7) + 1;
        let delta = match code {
            13 | 14 => signed_varint(table, at + 1)?,
            10..=12 => i32::from(code) - 10,
            _ => 0,
        };
        line += delta;
        if start <= unit && unit < start + length {
            return (code != 15).then_some(line);
        }
        start += length;
        at += 1;
        while at < table.len() && table[at] & 0x80 == 0 {
            at += 1;
        }
    }
    None
}

/// A varint of 6-bit groups, low first, bit 6 saying another follows.
fn varint(table: &[u8], mut at: usize) -> Option<u32> {
    let mut byte = *table.get(at)?;
    let mut value = u32::from(byte & 63);
    let mut shift = 0;
    while byte & 64 != 0 {
        at += 1;
        byte = *table.get(at)?;
        shift += 6;
        if shift > 30 {
            return None;
        }
        value |= u32::from(byte & 63) << shift;
    }
    Some(value)
}

/// A varint whose low bit is the sign.
fn signed_varint(table: &[u8], at: usize) -> Option<i32> {
    let value = varint(table, at)?;
    let magnitude = (value >> 1) as i32;
    Some(if value & 1 != 0 {
        -magnitude
    } else {
        magnitude
    })
}

#[cfg(test)]
mod tests {
    use std::{path::Path, process::Command};

    use super::*;

    #[test]
    fn hand_made_tables_decode() {
        // 3.11+: line 10 (first), one unit at +0 (code 10: no change), two units at +2
        // (code 12), one unit of code 13 with -3, one without location (15).
        let table = [
            0x80 | (10 << 3),
            0x80 | (12 << 3) | 1,
            0x80 | (13 << 3),
            7,
            0x80 | (15 << 3),
        ];
        let lines: Vec<Option<u32>> = (0..6).map(|u| line_of(11, &table, 10, u)).collect();
        assert_eq!(lines, [Some(10), Some(12), Some(12), Some(9), None, None]);
        // 3.10: 4 bytes on line +1, 2 bytes without line, 6 bytes on line +2 (from +1).
        let table = [4, 1, 2, 0x80, 6, 2];
        let lines: Vec<Option<u32>> = (-1..7).map(|u| line_of(10, &table, 5, u)).collect();
        assert_eq!(
            lines,
            [
                Some(5),
                Some(6),
                Some(6),
                None,
                Some(8),
                Some(8),
                Some(8),
                None
            ]
        );
    }

    /// CPython itself, where this machine has it: for every instruction of the code objects
    /// of a few stdlib modules, the line CPython gives (`co_positions()` on 3.11+,
    /// `co_lines()` on 3.10) and the one decoded here agree exactly.
    #[test]
    fn every_line_agrees_with_cpython() {
        let script = r#"
import sys, types, importlib
codes = []
def collect(co):
    codes.append(co)
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            collect(c)
for name in ["json.decoder", "argparse", "traceback", "asyncio.tasks", "email.message"]:
    m = importlib.import_module(name)
    collect(compile(open(m.__file__).read(), m.__file__, "exec"))
v = sys.version_info[:2]
for co in codes:
    if v >= (3, 11):
        lines = [p[0] for p in co.co_positions()]
    else:
        lines = [None] * (len(co.co_code) // 2)
        for s, e, l in co.co_lines():
            for a in range(s, e, 2):
                lines[a // 2] = l
    print(co.co_firstlineno, co.co_linetable.hex(), ",".join("-" if l is None else str(l) for l in lines))
"#;
        let mut checked = 0;
        // Debian sid's 3.14 in the `--stacks` root tests' Debian root, run with chroot.
        let trixie = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/pythons/trixie");
        let sid = format!("{trixie}/usr/bin/python3.14");
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        for python in [
            "/usr/bin/python3.11",
            "/root/.pyenv/versions/3.10.13/bin/python3.10",
            "/root/.pyenv/versions/3.11.7/bin/python3.11",
            "/root/.pyenv/versions/3.12.1/bin/python3.12",
            "/root/.pyenv/versions/3.13.0/bin/python3.13",
            &sid,
        ] {
            if !Path::new(python).exists() || (python == sid && !root) {
                // In CI (`CI=true`) every one must be there.
                assert_ne!(
                    std::env::var("CI").as_deref(),
                    Ok("true"),
                    "CI: no {python}"
                );
                continue;
            }
            let output = if python == sid {
                Command::new("chroot")
                    .args([trixie, "/usr/bin/python3.14", "-c", script])
                    .output()
            } else {
                Command::new(python).args(["-c", script]).output()
            }
            .unwrap();
            assert!(output.status.success(), "{python}: {output:?}");
            let minor: u32 = python.rsplit("3.").next().unwrap().parse().unwrap();
            let mut units = 0;
            for row in String::from_utf8(output.stdout).unwrap().lines() {
                let mut fields = row.split(' ');
                let first: i32 = fields.next().unwrap().parse().unwrap();
                let hex = fields.next().unwrap();
                let table: Vec<u8> = (0..hex.len() / 2)
                    .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                    .collect();
                for (unit, expected) in fields.next().unwrap_or("").split(',').enumerate() {
                    if expected.is_empty() {
                        continue;
                    }
                    let expected = expected.parse::<u32>().ok();
                    assert_eq!(
                        line_of(minor, &table, first, unit as i32),
                        expected,
                        "{python}: {row:.80}, unit {unit}"
                    );
                    units += 1;
                }
            }
            assert!(units > 10_000, "{python}: {units}");
            checked += 1;
        }
        assert!(checked > 0 || !Path::new("/usr/bin/python3.11").exists());
    }
}
