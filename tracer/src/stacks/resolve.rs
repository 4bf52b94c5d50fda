//! The probes' stack and code records into `stack` lines and the calls' `stack` ids: code
//! records kept by id, each stack's frames named from them and their lines decoded, each
//! distinct stack written once; then each call of a chosen family gets its stack, or is
//! counted under the reason it has none.

use std::collections::HashMap;

use tracer_common::stacks::{
    CodeHead, RawPyFrame, StackEvent, code_flags, stack_flags, stack_status,
};

use super::linetable::line_of;
use crate::schema::{StackFrame, StackLine, StacklessCounts, StacksFooter};

/// Why a call has no stack (the footer's `stacks.without`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    NotPython,
    UnsupportedPython,
    NotInitialized,
    NoThreadState,
    Ambiguous,
    NoPythonFrames,
    ReadFault,
    CodeUnresolved,
    RecordLost,
    SampledOut,
    RateLimited,
}

impl Reason {
    pub fn count(self, counts: &mut StacklessCounts) {
        let slot = match self {
            Reason::NotPython => &mut counts.not_python,
            Reason::UnsupportedPython => &mut counts.unsupported_python,
            Reason::NotInitialized => &mut counts.not_initialized,
            Reason::NoThreadState => &mut counts.no_thread_state,
            Reason::Ambiguous => &mut counts.ambiguous_thread_state,
            Reason::NoPythonFrames => &mut counts.no_python_frames,
            Reason::ReadFault => &mut counts.read_fault,
            Reason::CodeUnresolved => &mut counts.code_unresolved,
            Reason::RecordLost => &mut counts.record_lost,
            Reason::SampledOut => &mut counts.sampled_out,
            Reason::RateLimited => &mut counts.rate_limited,
        };
        *slot += 1;
    }
}

/// A call's stack: its id and whether it was cut, or why there is none.
pub type Resolved = Result<(u64, bool), Reason>;

/// A code object as its record gave it; `None` where it cannot name a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Code {
    file: String,
    qualname: String,
    first_line: i32,
    first_traceable: i32,
    linetable: Vec<u8>,
    minor: u32,
}

/// Records of one thread's calls still waiting for their call line, at most this many (a
/// call nests at most 4 deep; older ones were lost).
const PENDING_PER_THREAD: usize = 8;

/// A frame owned by a generator (or coroutine): its prologue has run.
const OWNED_BY_GENERATOR: u32 = 1;

#[derive(Default)]
pub struct Resolver {
    codes: HashMap<u64, Option<Code>>,
    known: HashMap<(u64, [u64; 2]), Resolved>,
    interned: HashMap<(Vec<StackFrame>, bool), u64>,
    pending: HashMap<u32, Vec<(u64, Resolved)>>,
    pub footer: StacksFooter,
}

impl Resolver {
    /// A code record (its header's flags: its interpreter's minor version).
    #[cfg(test)]
    pub fn code(&mut self, event: &CodeHead, data: &[u8]) {
        self.code_with_table(event, data, None);
    }

    /// A code record; `long_table`: where the record's line table was too long to send
    /// ([`code_flags::LINETABLE_TOO_LONG`]), the table read apart, if it could be. Such a
    /// code object names its frames all the same, without their lines if it could not.
    pub fn code_with_table(&mut self, event: &CodeHead, data: &[u8], long_table: Option<Vec<u8>>) {
        self.footer.code_objects += 1;
        let unusable = &mut self.footer.code_objects_unusable;
        for (flag, count) in [
            (code_flags::NOT_CODE, &mut unusable.not_code),
            (code_flags::READ_FAULT, &mut unusable.read_fault),
            (code_flags::BAD_NAME, &mut unusable.bad_name),
        ] {
            if event.flags & flag != 0 {
                *count += 1;
            }
        }
        let long = event.flags & code_flags::LINETABLE_TOO_LONG != 0;
        let usable = event.flags & !code_flags::LINETABLE_TOO_LONG == 0;
        if long && usable {
            let counts = &mut self.footer.long_linetables;
            match long_table {
                Some(_) => counts.read += 1,
                None => counts.unread += 1,
            }
        }
        let minor = event.header.flags;
        let code = usable
            .then(|| decode_code(event, data, minor))
            .flatten()
            .map(|code| match long_table {
                Some(linetable) if long => Code { linetable, ..code },
                _ => code,
            });
        self.codes.insert(event.capture, code);
    }

    /// A stack record of a call: the stack line to write first when its stack is new.
    /// `no_interpreter` says why a process without an interpreter layout has none.
    pub fn stack(
        &mut self,
        event: &StackEvent,
        frames: &[RawPyFrame],
        no_interpreter: Reason,
    ) -> Option<StackLine> {
        let (resolved, line) = self.resolve(event, frames, no_interpreter);
        let waiting = self.pending.entry(event.header.tid).or_default();
        if waiting.len() >= PENDING_PER_THREAD {
            let _ = waiting.remove(0);
        }
        waiting.push((event.header.ts_ns, resolved));
        line
    }

    fn resolve(
        &mut self,
        event: &StackEvent,
        frames: &[RawPyFrame],
        no_interpreter: Reason,
    ) -> (Resolved, Option<StackLine>) {
        let reason = match event.status {
            stack_status::OK => None,
            stack_status::NO_INTERPRETER => Some(no_interpreter),
            stack_status::NOT_INITIALIZED => Some(Reason::NotInitialized),
            stack_status::NO_THREAD_STATE => Some(Reason::NoThreadState),
            stack_status::AMBIGUOUS | stack_status::TOO_MANY_THREADS => Some(Reason::Ambiguous),
            stack_status::NO_FRAMES => Some(Reason::NoPythonFrames),
            stack_status::SAMPLED_OUT => Some(Reason::SampledOut),
            stack_status::RATE_LIMITED => Some(Reason::RateLimited),
            _ => Some(Reason::ReadFault),
        };
        if let Some(reason) = reason {
            return (Err(reason), None);
        }
        let key = (event.generation, event.hash);
        if event.flags & stack_flags::KNOWN != 0 {
            self.footer.stack_records.known += 1;
            // Its frames came before, or it would not be known.
            let resolved = self
                .known
                .get(&key)
                .copied()
                .unwrap_or(Err(Reason::RecordLost));
            return (resolved, None);
        }
        self.footer.stack_records.sent_whole += 1;
        let cut = event.flags & stack_flags::CUT != 0;
        let (resolved, line) = match self.frames(frames) {
            Err(reason) => (Err(reason), None),
            Ok(named) if named.is_empty() => (Err(Reason::NoPythonFrames), None),
            Ok(named) => {
                let next = self.interned.len() as u64 + 1;
                let id = *self.interned.entry((named.clone(), cut)).or_insert(next);
                if id != next {
                    self.footer.stack_records.sent_again += 1;
                }
                let line = (id == next).then(|| StackLine {
                    id,
                    frames: named,
                    cut,
                    ..StackLine::default()
                });
                (Ok((id, cut)), line)
            }
        };
        self.known.insert(key, resolved);
        (resolved, line)
    }

    /// The frames named, innermost first; frames CPython would not show (not started yet)
    /// left out.
    fn frames(&self, frames: &[RawPyFrame]) -> Result<Vec<StackFrame>, Reason> {
        let mut named = Vec::with_capacity(frames.len());
        for frame in frames {
            let Some(Some(code)) = self.codes.get(&frame.capture) else {
                return Err(Reason::CodeUnresolved);
            };
            // 3.11+: a frame whose prologue has not reached its first traceable
            // instruction is "incomplete", and CPython leaves it out.
            if code.minor >= 11
                && frame.owner != OWNED_BY_GENERATOR
                && frame.unit < code.first_traceable
            {
                continue;
            }
            named.push(StackFrame {
                file: code.file.clone(),
                qualname: code.qualname.clone(),
                line: line_of(code.minor, &code.linetable, code.first_line, frame.unit),
                first_line: u32::try_from(code.first_line).unwrap_or(0),
            });
        }
        Ok(named)
    }

    /// The stack of the call of thread `tid` entered at `ts_ns`, counted when `counted`;
    /// `None` when it has none.
    pub fn take(&mut self, tid: u32, ts_ns: u64, counted: bool) -> Option<u64> {
        let resolved = match self.pending.get_mut(&tid) {
            Some(waiting) => {
                let found = waiting
                    .iter()
                    .position(|(ts, _)| *ts == ts_ns)
                    .map(|at| waiting.remove(at).1);
                // Calls entered after this one returned before it: their records are stale
                // (their call lines were lost).
                waiting.retain(|(ts, _)| *ts < ts_ns);
                found.unwrap_or(Err(Reason::RecordLost))
            }
            None => Err(Reason::RecordLost),
        };
        match resolved {
            Ok((id, cut)) => {
                if counted {
                    self.footer.calls += 1;
                    self.footer.cut += u64::from(cut);
                }
                Some(id)
            }
            Err(reason) => {
                if counted {
                    reason.count(&mut self.footer.without);
                }
                None
            }
        }
    }
}

/// The code record's names and table, or `None` when a name is not text.
fn decode_code(event: &CodeHead, data: &[u8], minor: u32) -> Option<Code> {
    let filename_end = event.filename_len as usize;
    let qualname_end = filename_end + event.qualname_len as usize;
    let table_end = qualname_end + event.linetable_len as usize;
    Some(Code {
        file: decode_str(data.get(..filename_end)?, event.filename_kind)?,
        qualname: decode_str(data.get(filename_end..qualname_end)?, event.qualname_kind)?,
        first_line: event.first_line,
        first_traceable: event.first_traceable,
        linetable: data.get(qualname_end..table_end)?.to_vec(),
        minor,
    })
}

/// A `str`'s characters as CPython stores them: `kind` bytes each (1: Latin-1, 2: UCS-2,
/// 4: UCS-4), little-endian.
fn decode_str(bytes: &[u8], kind: u32) -> Option<String> {
    match kind {
        1 => Some(bytes.iter().map(|b| char::from(*b)).collect()),
        2 => bytes
            .chunks_exact(2)
            .map(|c| char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]]))))
            .collect(),
        4 => bytes
            .chunks_exact(4)
            .map(|c| char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect(),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
