//! A layout checked against the process's own objects before the probes read a stack with
//! it: userspace walks what the probes will walk (the interpreter, every thread state,
//! each thread's frames, their code objects, names and line tables) through
//! `/proc/PID/mem`, and each object must be what the layout says it is. A wrong offset
//! reads another field, whose value fails one of these: the types' own sizes put the
//! contents where the layout does, a thread state points back at its interpreter, its
//! `thread_id` is a `pthread_t` (on x86-64 glibc's and musl's thread control block starts
//! with a pointer to itself), a frame's code object has `PyCode_Type` as its type and its
//! instruction lies inside its bytecode, its names are `str`s whose length ends at their
//! NUL, its line table a `bytes` whose size does too. docs/python-stacks.md lists them all.

use std::{collections::HashSet, fs::File, os::unix::fs::FileExt};

use tracer_common::stacks::{MAX_STACK_FRAMES, MAX_THREAD_STATES, NO_FIELD, PyProcess, py_flags};

/// A process's memory, as read through `/proc/PID/mem` (a test gives another).
pub trait Memory {
    /// Fills `buf` from `address`; false when any of it cannot be read.
    fn read(&self, address: u64, buf: &mut [u8]) -> bool;
}

impl Memory for File {
    fn read(&self, address: u64, buf: &mut [u8]) -> bool {
        self.read_exact_at(buf, address).is_ok()
    }
}

/// The type objects a process's objects must point to (load bias applied). `str` and
/// `bytes` are checked where the file exports them (CPython does).
#[derive(Clone, Copy, Debug)]
pub struct Types {
    pub code: u64,
    pub str: Option<u64>,
    pub bytes: Option<u64>,
}

/// What the check read and found right.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    pub thread_states: u32,
    /// Python frames (the interpreter's own entry frames, skipped as the probes skip
    /// them, are not counted).
    pub frames: u32,
    pub code_objects: u32,
}

/// Longest name checked (a qualified name or file name the probes would read is shorter).
const NAME_MAX: u64 = 1 << 16;
/// Largest line table checked.
const LINETABLE_MAX: i64 = 1 << 24;
/// Largest tid Linux gives (`PID_MAX_LIMIT`).
const TID_MAX: u64 = 1 << 22;

/// The highest frame owner of `minor` (3.11: thread, generator, frame object; 3.12 and
/// 3.13: C stack; 3.14: interpreter and C stack).
fn max_owner(minor: u32) -> u32 {
    match minor {
        11 => 2,
        12 | 13 => 3,
        _ => 4,
    }
}

struct Reader<'a, M: Memory> {
    memory: &'a M,
}

impl<M: Memory> Reader<'_, M> {
    fn bytes<const N: usize>(&self, address: u64) -> Option<[u8; N]> {
        let mut buf = [0u8; N];
        self.memory.read(address, &mut buf).then_some(buf)
    }

    fn u64(&self, address: u64) -> Option<u64> {
        self.bytes::<8>(address).map(u64::from_le_bytes)
    }

    fn u32(&self, address: u64) -> Option<u32> {
        self.bytes::<4>(address).map(u32::from_le_bytes)
    }

    fn u8(&self, address: u64) -> Option<u8> {
        self.bytes::<1>(address).map(|b| b[0])
    }

    /// The word at `base + offset`, or why not in the words of `what`.
    fn field(&self, base: u64, offset: u32, what: &str) -> Result<u64, String> {
        self.u64(base.wrapping_add(u64::from(offset)))
            .ok_or_else(|| format!("{what} cannot be read"))
    }
}

/// Checks `py` (addresses set) against the live process `memory`. An interpreter not
/// initialised yet has nothing to check beyond its types: it passes with nothing counted.
pub fn check(memory: &impl Memory, py: &PyProcess, types: &Types) -> Result<Checked, String> {
    let read = Reader { memory };
    for (name, address, expected) in [
        ("PyCode_Type", Some(types.code), "code"),
        ("PyUnicode_Type", types.str, "str"),
        ("PyBytes_Type", types.bytes, "bytes"),
    ] {
        if let Some(address) = address {
            type_named(&read, address, expected).map_err(|found| {
                format!("{name} is not the type named \"{expected}\" ({found})")
            })?;
        }
    }
    check_type_sizes(&read, py, types)?;
    let mut checked = Checked::default();
    let interp = read.field(
        py.runtime,
        py.runtime_interpreters,
        "_PyRuntime's interpreter (runtime_interpreters)",
    )?;
    if interp == 0 {
        return Ok(checked);
    }
    check_next_interpreter(&read, py, interp)?;
    let head = read.field(
        interp,
        py.interp_threads,
        "the interpreter's thread list (interp_threads)",
    )?;
    let mut tstate = head;
    let mut bound = 0;
    let mut codes = HashSet::new();
    let mut doubts = Doubts::default();
    while tstate != 0 && (checked.thread_states as usize) < MAX_THREAD_STATES {
        bound += u32::from(check_thread_state(&read, py, interp, tstate)?);
        checked.thread_states += 1;
        let mut frame = read.field(
            tstate,
            py.tstate_frame,
            "a thread state's frame (tstate_frame)",
        )?;
        if py.cframe_frame != NO_FIELD && frame != 0 {
            frame = read.field(frame, py.cframe_frame, "a thread's cframe (cframe_frame)")?;
        }
        for _ in 0..MAX_STACK_FRAMES {
            if frame == 0 {
                break;
            }
            let previous = read.field(
                frame,
                py.frame_previous,
                "a frame's previous frame (frame_previous)",
            )?;
            if py.frame_owner != NO_FIELD {
                let owner = read
                    .u8(frame + u64::from(py.frame_owner))
                    .ok_or("a frame's owner (frame_owner) cannot be read")?;
                if u32::from(owner) > max_owner(py.minor) {
                    return Err(format!(
                        "a frame's owner (frame_owner at {}) is {owner}, no owner 3.{} has",
                        py.frame_owner, py.minor
                    ));
                }
                if u32::from(owner) >= py.owner_skip_from {
                    frame = previous;
                    continue;
                }
            }
            let code = read.field(frame, py.frame_code, "a frame's code object (frame_code)")?
                & py.code_mask;
            if read.u64(code.wrapping_add(u64::from(py.code_ob_type))) != Some(types.code) {
                return Err(format!(
                    "a frame's code object (frame_code at {}, code_ob_type at {}) is not of type \
                     code",
                    py.frame_code, py.code_ob_type
                ));
            }
            let units = check_instruction(&read, py, frame, code)?;
            if codes.insert(code) {
                check_code(&read, py, types, code, units, &mut doubts)?;
                checked.code_objects += 1;
            }
            checked.frames += 1;
            frame = previous;
        }
        tstate = read.field(
            tstate,
            py.tstate_next,
            "a thread state's next (tstate_next)",
        )?;
    }
    // A running interpreter has a thread state with a thread: the one that runs it.
    if checked.thread_states == 0 {
        return Err(format!(
            "its interpreter has no thread state (interp_threads at {})",
            py.interp_threads
        ));
    }
    // `threads.next_unique_id`: one more than the thread states made, a count.
    let epoch = read.field(
        interp,
        py.interp_thread_epoch,
        "the interpreter's thread count (interp_thread_epoch)",
    )?;
    if epoch < u64::from(checked.thread_states) || epoch > u64::from(u32::MAX) {
        return Err(format!(
            "the interpreter's thread count (interp_thread_epoch at {}) is {epoch}, fewer than \
             its {} thread states or no count",
            py.interp_thread_epoch, checked.thread_states
        ));
    }
    if bound == 0 {
        return Err(format!(
            "no thread state has a thread (tstate_thread_id at {})",
            py.tstate_thread_id
        ));
    }
    doubts.names.verdict()?;
    doubts.modules.verdict()?;
    Ok(checked)
}

/// Rules a tool can break for one code object (`code.replace`): the layout is refused
/// where every code object they apply to breaks them.
#[derive(Default)]
struct Doubts {
    /// A qualified name ends with its name.
    names: Doubt,
    /// A module's first line is 1.
    modules: Doubt,
}

#[derive(Default)]
struct Doubt {
    applied: u32,
    broken: u32,
    first: Option<String>,
}

impl Doubt {
    fn count(&mut self, broken: bool, why: impl FnOnce() -> String) {
        self.applied += 1;
        if broken {
            self.broken += 1;
            self.first.get_or_insert_with(why);
        }
    }

    fn verdict(&mut self) -> Result<(), String> {
        match self.first.take() {
            Some(why) if self.broken == self.applied => Err(why),
            _ => Ok(()),
        }
    }
}

/// The types' own sizes say where their objects' contents start: a code object's bytecode
/// (3.11+: `tp_basicsize` is `offsetof(PyCodeObject, co_code_adaptive)`, units of 2 bytes),
/// a `bytes`' data (`tp_basicsize` is its offset plus the NUL), a compact `str`'s
/// characters (`PyUnicodeObject` is `PyCompactUnicodeObject` and a data pointer).
fn check_type_sizes<M: Memory>(
    read: &Reader<M>,
    py: &PyProcess,
    types: &Types,
) -> Result<(), String> {
    let sizes = |address: u64| -> Result<(u64, u64), String> {
        match (read.u64(address + 32), read.u64(address + 40)) {
            (Some(basic), Some(item)) => Ok((basic, item)),
            _ => Err("a type's sizes cannot be read".into()),
        }
    };
    if py.minor >= 11 {
        let (basic, item) = sizes(types.code)?;
        if (basic, item) != (u64::from(py.code_adaptive), 2) {
            return Err(format!(
                "PyCode_Type's sizes ({basic}, {item}) do not put its bytecode at code_adaptive \
                 ({})",
                py.code_adaptive
            ));
        }
    }
    if let Some(bytes_type) = types.bytes {
        let (basic, item) = sizes(bytes_type)?;
        if (basic, item) != (u64::from(py.bytes_data) + 1, 1) {
            return Err(format!(
                "PyBytes_Type's sizes ({basic}, {item}) do not put its data at bytes_data ({})",
                py.bytes_data
            ));
        }
    }
    if let Some(str_type) = types.str {
        let (basic, _) = sizes(str_type)?;
        if basic != u64::from(py.str_compact_data) + 8 {
            return Err(format!(
                "PyUnicode_Type's size ({basic}) does not put a compact str's characters at \
                 str_compact_data ({})",
                py.str_compact_data
            ));
        }
    }
    Ok(())
}

/// The interpreter's `next` is none, or another interpreter (whose thread states point
/// back at it).
fn check_next_interpreter<M: Memory>(
    read: &Reader<M>,
    py: &PyProcess,
    interp: u64,
) -> Result<(), String> {
    let wrong = || {
        format!(
            "the interpreter's next (interp_next at {}) is no interpreter",
            py.interp_next
        )
    };
    let next = read.field(
        interp,
        py.interp_next,
        "the interpreter's next (interp_next)",
    )?;
    if next == 0 {
        return Ok(());
    }
    let head = read
        .u64(next.wrapping_add(u64::from(py.interp_threads)))
        .ok_or_else(wrong)?;
    if head != 0 && read.u64(head.wrapping_add(u64::from(py.tstate_interp))) != Some(next) {
        return Err(wrong());
    }
    Ok(())
}

/// The type at `address` has `expected` as its `tp_name` (after the object header and
/// `ob_size`); else what it has.
fn type_named<M: Memory>(read: &Reader<M>, address: u64, expected: &str) -> Result<(), String> {
    let name = read.u64(address + 24).ok_or("unreadable")?;
    let mut text = vec![0u8; expected.len() + 1];
    if !read.memory.read(name, &mut text) {
        return Err("its name is unreadable".into());
    }
    if text.strip_suffix(&[0]) == Some(expected.as_bytes()) {
        Ok(())
    } else {
        Err(format!(
            "its name begins {:?}",
            String::from_utf8_lossy(&text)
        ))
    }
}

/// Whether the thread state has its thread (`thread_id` set: bound), after checking it.
fn check_thread_state<M: Memory>(
    read: &Reader<M>,
    py: &PyProcess,
    interp: u64,
    tstate: u64,
) -> Result<bool, String> {
    let back = read.field(
        tstate,
        py.tstate_interp,
        "a thread state's interpreter (tstate_interp)",
    )?;
    if back != interp {
        return Err(format!(
            "a thread state does not point back at its interpreter (tstate_interp at {})",
            py.tstate_interp
        ));
    }
    // 0: a thread state made for a thread that has not started yet.
    let thread_id = read.field(tstate, py.tstate_thread_id, "a thread state's thread_id")?;
    if thread_id == 0 {
        return Ok(false);
    }
    // Only where the thread pointer is the pthread_t (`Arch::pthread_self_is_thread_pointer`,
    // x86-64's TLS variant II): arm64's struct pthread does not start with a pointer to
    // itself; its native_thread_id below is checked all the same.
    if tracer_common::arch::TARGET.pthread_self_is_thread_pointer
        && read.u64(thread_id) != Some(thread_id)
    {
        return Err(format!(
            "a thread state's thread_id (tstate_thread_id at {}) is no thread's pthread_t",
            py.tstate_thread_id
        ));
    }
    if py.tstate_native_id != NO_FIELD {
        // 0: a thread stopped between setting its `thread_id` and its tid.
        let tid = read.field(
            tstate,
            py.tstate_native_id,
            "a thread state's native_thread_id",
        )?;
        if tid > TID_MAX {
            return Err(format!(
                "a thread state's native_thread_id (tstate_native_id at {}) is {tid}, no tid",
                py.tstate_native_id
            ));
        }
    }
    Ok(true)
}

/// The frame's instruction lies in its code object's bytecode (3.11+: a pointer into
/// `co_code_adaptive`, one unit before it at a frame's start; 3.10: `f_lasti`, an index).
/// Returns the code object's length in code units (3.11+).
fn check_instruction<M: Memory>(
    read: &Reader<M>,
    py: &PyProcess,
    frame: u64,
    code: u64,
) -> Result<Option<i64>, String> {
    let at = frame + u64::from(py.frame_instr);
    if py.flags & py_flags::LASTI != 0 {
        let lasti = read
            .u32(at)
            .ok_or("a frame's f_lasti (frame_instr) cannot be read")? as i32;
        if !(-1..1 << 24).contains(&lasti) {
            return Err(format!(
                "a frame's f_lasti (frame_instr at {}) is {lasti}, no instruction",
                py.frame_instr
            ));
        }
        return Ok(None);
    }
    // Since 3.11 a code object is a `PyVarObject` of code units.
    let units = read
        .u64(code + 16)
        .ok_or("a code object's size cannot be read")? as i64;
    let instr = read.field(frame, py.frame_instr, "a frame's instruction (frame_instr)")?;
    let first = code.wrapping_add(u64::from(py.code_adaptive));
    let unit = (instr.wrapping_sub(first) as i64) >> 1;
    if !(-1..=units).contains(&unit) {
        return Err(format!(
            "a frame's instruction (frame_instr at {}, code_adaptive at {}) is outside its code \
             object's bytecode",
            py.frame_instr, py.code_adaptive
        ));
    }
    Ok(Some(units))
}

/// A code object's names are `str`s, its line table a `bytes`, its first line and first
/// traceable instruction plausible.
fn check_code<M: Memory>(
    read: &Reader<M>,
    py: &PyProcess,
    types: &Types,
    code: u64,
    units: Option<i64>,
    doubts: &mut Doubts,
) -> Result<(), String> {
    let mut names = Vec::new();
    for (offset, what) in [
        (py.code_filename, "co_filename (code_filename"),
        (py.code_qualname, "co_qualname (code_qualname"),
    ] {
        let string = read.field(code, offset, &format!("a code object's {what})"))?;
        names.push(read_str(read, py, types, string).map_err(|why| {
            format!("a code object's {what} at {offset}) is not a str as laid out: {why}")
        })?);
    }
    let (filename, qualname) = (&names[0], &names[1]);
    // `<module>`, `<lambda>`, `<genexpr>`: names no file has.
    if qualname.starts_with('<') && filename == qualname {
        return Err(format!(
            "a code object's co_filename (code_filename at {}) reads as its name {qualname}",
            py.code_filename
        ));
    }
    if py.minor >= 11 {
        // `co_name` is the word before `co_qualname` (3.11 to 3.14), and a qualified name
        // ends with its name (but where a tool replaced one: a doubt).
        let string = read.field(code, py.code_qualname - 8, "a code object's co_name")?;
        let name = read_str(read, py, types, string)
            .map_err(|why| format!("a code object's co_name is not a str as laid out: {why}"))?;
        doubts.names.count(
            !(qualname == &name || qualname.ends_with(&format!(".{name}"))),
            || {
                format!(
                    "no code object's co_qualname (code_qualname at {}) ends with its co_name \
                     ({qualname:?}, {name:?})",
                    py.code_qualname
                )
            },
        );
    }
    let linetable = read.field(code, py.code_linetable, "a code object's line table")?;
    check_bytes(read, py, types, linetable).map_err(|why| {
        format!(
            "a code object's line table (code_linetable at {}) is not a bytes as laid out: {why}",
            py.code_linetable
        )
    })?;
    let firstlineno = read
        .u32(code + u64::from(py.code_firstlineno))
        .ok_or("a code object's first line cannot be read")? as i32;
    if qualname == "<module>" {
        // A module's code starts at line 1 (but where a tool replaced it: a doubt).
        doubts.modules.count(firstlineno != 1, || {
            format!(
                "no module's first line (code_firstlineno at {}) is 1 ({firstlineno})",
                py.code_firstlineno
            )
        });
    }
    if !(0..100_000_000).contains(&firstlineno) {
        return Err(format!(
            "a code object's first line (code_firstlineno at {}) is {firstlineno}",
            py.code_firstlineno
        ));
    }
    if let (Some(units), true) = (units, py.code_firsttraceable != NO_FIELD) {
        let first = read
            .u32(code + u64::from(py.code_firsttraceable))
            .ok_or("a code object's first traceable instruction cannot be read")?
            as i32;
        if !(0..=units).contains(&i64::from(first)) {
            return Err(format!(
                "a code object's first traceable instruction (code_firsttraceable at {}) is \
                 {first}, outside its {units} units",
                py.code_firsttraceable
            ));
        }
    }
    Ok(())
}

/// A compact `str` of at most [`NAME_MAX`] characters (`""` is a file name too), none of
/// them NUL, followed by one: its text.
fn read_str<M: Memory>(
    read: &Reader<M>,
    py: &PyProcess,
    types: &Types,
    string: u64,
) -> Result<String, String> {
    let ob_type = read.u64(string + 8).ok_or("its type cannot be read")?;
    if types.str.is_some_and(|str_type| str_type != ob_type) {
        return Err("its type is not str".into());
    }
    let length = read
        .u64(string + u64::from(py.str_length))
        .ok_or("its length cannot be read")?;
    let state = read
        .u32(string + u64::from(py.str_state))
        .ok_or("its state cannot be read")?;
    let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
    if compact == 0 || !matches!(kind, 1 | 2 | 4) || (ascii == 1 && kind != 1) {
        return Err(format!("its state (str_state) is {state:#x}"));
    }
    if length > NAME_MAX {
        return Err(format!("its length (str_length) is {length}"));
    }
    let data = string
        + u64::from(if ascii == 1 {
            py.str_ascii_data
        } else {
            py.str_compact_data
        });
    let width = u64::from(kind);
    let mut text = vec![0u8; ((length + 1) * width) as usize];
    if !read.memory.read(data, &mut text) {
        return Err("its characters cannot be read".into());
    }
    let (characters, end) = text.split_at((length * width) as usize);
    let units: Vec<&[u8]> = characters.chunks(width as usize).collect();
    if end.iter().any(|b| *b != 0) || units.iter().any(|unit| unit.iter().all(|b| *b == 0)) {
        return Err("its characters do not end at its length".into());
    }
    if ascii == 1 && characters.iter().any(|b| *b >= 0x80) {
        return Err("an ASCII string with a byte above 127".into());
    }
    units
        .iter()
        .map(|unit| {
            let mut code = [0u8; 4];
            code[..unit.len()].copy_from_slice(unit);
            char::from_u32(u32::from_le_bytes(code))
        })
        .collect::<Option<String>>()
        .ok_or_else(|| "its characters are no Unicode".into())
}

/// A `bytes` of at most [`LINETABLE_MAX`] bytes, followed by a NUL (CPython ends each).
fn check_bytes<M: Memory>(
    read: &Reader<M>,
    py: &PyProcess,
    types: &Types,
    bytes: u64,
) -> Result<(), String> {
    let ob_type = read.u64(bytes + 8).ok_or("its type cannot be read")?;
    if types.bytes.is_some_and(|bytes_type| bytes_type != ob_type) {
        return Err("its type is not bytes".into());
    }
    let size = read
        .u64(bytes + u64::from(py.bytes_size))
        .ok_or("its size cannot be read")? as i64;
    if !(0..=LINETABLE_MAX).contains(&size) {
        return Err(format!("its size (bytes_size) is {size}"));
    }
    let end = (bytes + u64::from(py.bytes_data)).wrapping_add(size as u64);
    if read.u8(end) != Some(0) {
        return Err("no NUL after its size (bytes_data)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rule one code object breaks (a tool's `code.replace`) leaves the layout; every
    /// one breaking it refuses it, with the first reason.
    #[test]
    fn a_doubt_refuses_only_where_every_object_breaks_its_rule() {
        let mut doubt = Doubt::default();
        doubt.count(false, || "first".into());
        doubt.count(true, || "second".into());
        assert_eq!(doubt.verdict(), Ok(()));
        let mut doubt = Doubt::default();
        doubt.count(true, || "first".into());
        doubt.count(true, || "second".into());
        assert_eq!(doubt.verdict(), Err("first".into()));
        assert_eq!(Doubt::default().verdict(), Ok(()));
    }
}
