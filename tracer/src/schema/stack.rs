//! `"type":"stack"` and `"type":"interpreter"` (`run --stacks`): the Python stacks calls
//! were made from, each written once and named by its id in the call lines (`stack`), and
//! what cudatrace found of each traced process's Python interpreter.
//!
//! A stack is a list of frames, **innermost first**: `frames[0]` is the Python function
//! whose line called into the library (through ctypes, a C extension, PyTorch...), the last
//! frame the outermost one cudatrace walked (`<module>` of the script, or a thread's
//! `run`). Two calls made from the same lines share one stack id, whatever their process.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    fields::{LineType, Tag},
    footer::{EventLine, Footer},
};

/// A Python stack, written before the first call line that names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StackLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    /// What call lines' `stack` names: 1 for the first stack of the trace, then 2, 3, ...
    pub id: u64,
    /// Innermost first.
    pub frames: Vec<StackFrame>,
    /// The stack is deeper than the frame budget (`--stack-depth`): `frames` are the
    /// innermost ones and the outer frames are missing. Absent when the stack is whole.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
}

/// One Python frame: the function (its file, qualified name and first line) and the line
/// it was executing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct StackFrame {
    /// The code object's `co_filename`, as the interpreter has it.
    pub file: String,
    /// `co_qualname` (`GPT2Attention.forward`, `main.<locals>.step`); on Python 3.10, which
    /// has none, `co_name` (`forward`).
    pub qualname: String,
    /// The line being executed, from the frame's instruction and the code's line table, as
    /// `traceback` gives it. Absent where CPython itself has no line for the instruction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// `co_firstlineno`: where the function is defined (with `file` and `qualname`, which
    /// function this is).
    pub first_line: u32,
}

impl LineType for StackLine {
    const TYPE: &'static str = "stack";
}

impl EventLine for StackLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.stack += 1;
    }
}

impl StackLine {
    pub(super) fn read(value: &Value, bytes: &[u8]) -> Result<Self, String> {
        value
            .get("id")
            .and_then(Value::as_u64)
            .ok_or("stack line: no \"id\" number")?;
        serde_json::from_slice(bytes).map_err(|e| format!("stack line: {e}"))
    }
}

/// The Python interpreter of a traced process, said once per process (and again after an
/// `exec`) when `--stacks` looked at it: found where the process's calls come from, at the
/// first library it opened, its fork or the start of tracing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InterpreterLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    pub pid: u32,
    pub ts_ns: u64,
    /// The file holding the interpreter (`_PyRuntime`): the executable itself (a static
    /// `python3.12`) or the `libpython3.X.so` it maps; absent when none was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// CPython's version (`3.12.3`), where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// Whether the calls of this process get stacks.
    pub stacks: bool,
    /// Why not, when `stacks` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Where its offsets came from: `dwarf` (the DWARF of the interpreter file or of its
    /// debug file), `debug_offsets` (3.13+: the file's own `_Py_DebugOffsets`, the table for
    /// the fields it lacks) or `table`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offsets: Option<String>,
    /// The file the DWARF was read from, where `offsets` is `dwarf`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offsets_file: Option<String>,
    /// The fields whose DWARF or `_Py_DebugOffsets` value differs from cudatrace's table
    /// (the file's is used): `name: FILE in the file, TABLE in the table`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub table_differs: Vec<String>,
    /// Why DWARF found for the interpreter was not used (`FILE: WHY`): its offsets came from
    /// the next source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dwarf_unused: Option<String>,
    /// What the check of the layout on the live process read and found right.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checked: Option<LayoutChecked>,
}

/// The objects of a process the check of its layout read: every thread state, each
/// thread's Python frames, their distinct code objects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutChecked {
    pub thread_states: u32,
    pub frames: u32,
    pub code_objects: u32,
}

impl LineType for InterpreterLine {
    const TYPE: &'static str = "interpreter";
}

impl EventLine for InterpreterLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.interpreter += 1;
    }
}

impl InterpreterLine {
    pub(super) fn read(value: &Value, bytes: &[u8]) -> Result<Self, String> {
        value
            .get("pid")
            .and_then(Value::as_u64)
            .and_then(|pid| u32::try_from(pid).ok())
            .ok_or("interpreter line: no valid \"pid\"")?;
        serde_json::from_slice(bytes).map_err(|e| format!("interpreter line: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Line, parse};

    #[test]
    fn a_stack_line_is_written_innermost_first_and_read_back() {
        let stack = StackLine {
            id: 3,
            frames: vec![
                StackFrame {
                    file: "/w/model.py".into(),
                    qualname: "Block.forward".into(),
                    line: Some(42),
                    first_line: 38,
                },
                StackFrame {
                    file: "/w/run.py".into(),
                    qualname: "<module>".into(),
                    line: None,
                    first_line: 1,
                },
            ],
            cut: true,
            ..StackLine::default()
        };
        let text = serde_json::to_string(&stack).unwrap();
        assert_eq!(
            text,
            r#"{"type":"stack","id":3,"frames":[{"file":"/w/model.py","qualname":"Block.forward","line":42,"first_line":38},{"file":"/w/run.py","qualname":"<module>","first_line":1}],"cut":true}"#
        );
        assert_eq!(parse(text.as_bytes()), Ok(Line::Stack(Box::new(stack))));
        let whole = r#"{"type":"stack","id":1,"frames":[]}"#;
        let Ok(Line::Stack(read)) = parse(whole.as_bytes()) else {
            panic!("not a stack line")
        };
        assert!(!read.cut);
        assert_eq!(
            parse(br#"{"type":"stack","frames":[]}"#),
            Err(r#"stack line: no "id" number"#.to_owned())
        );
    }

    #[test]
    fn an_interpreter_line_says_why_there_are_no_stacks() {
        let line = InterpreterLine {
            pid: 7,
            ts_ns: 9,
            path: Some("/usr/bin/python3.15".into()),
            python: Some("3.15.0".into()),
            stacks: false,
            reason: Some("Python 3.15 is not supported (3.10 to 3.14 are)".into()),
            ..InterpreterLine::default()
        };
        let text = serde_json::to_string(&line).unwrap();
        assert_eq!(
            text,
            r#"{"type":"interpreter","pid":7,"ts_ns":9,"path":"/usr/bin/python3.15","python":"3.15.0","stacks":false,"reason":"Python 3.15 is not supported (3.10 to 3.14 are)"}"#
        );
        assert_eq!(
            parse(text.as_bytes()),
            Ok(Line::Interpreter(Box::new(line)))
        );
    }

    #[test]
    fn the_footer_counts_stack_lines_and_every_reason() {
        use crate::schema::footer::{StackRecordCounts, StacklessCounts, StacksFooter};
        let mut footer = Footer::default();
        StackLine::default().count_in(&mut footer);
        footer.stacks = Some(StacksFooter {
            calls: 3,
            cut: 1,
            without: StacklessCounts {
                no_thread_state: 2,
                ..StacklessCounts::default()
            },
            code_objects: 5,
            frames_walked: 40,
            memory_reads: 21,
            memory_read_faults: 1,
            memory_read_bytes: 9000,
            stack_records: StackRecordCounts {
                known: 7,
                known_in_call: 6,
                sent_whole: 2,
                sent_again: 1,
            },
            ..StacksFooter::default()
        });
        let text = serde_json::to_string(&footer).unwrap();
        assert!(text.contains(r#""library":0,"stack":1}"#), "{text}");
        assert!(
            text.ends_with(
                r#""stacks":{"calls":3,"cut":1,"without":{"not_python":0,"unsupported_python":0,"not_initialized":0,"no_thread_state":2,"ambiguous_thread_state":0,"no_python_frames":0,"read_fault":0,"code_unresolved":0,"record_lost":0},"code_objects":5,"code_objects_unusable":{"not_code":0,"read_fault":0,"bad_name":0},"long_linetables":{"read":0,"unread":0},"code_free_probes":{"linked":0,"not_linked":0},"frames_walked":40,"memory_reads":21,"memory_read_faults":1,"memory_read_bytes":9000,"stack_records":{"known":7,"known_in_call":6,"sent_whole":2,"sent_again":1}}}"#
            ),
            "{text}"
        );
    }
}
