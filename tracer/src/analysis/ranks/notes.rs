//! What the cross-rank analysis could not match or align, as the analysis finds it
//! ([`Note`]), and the English sentence `summary` and `merge` print for each (its
//! `Display`, which is also its JSON: a string).

use std::fmt;

use serde::{Serialize, Serializer};

/// One thing the figures leave out, and why.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// A trace without its footer (`cut_line`: its last line, cut mid-line).
    CutShort { file: String, cut_line: Option<u64> },
    /// No communicator has ranks in two of the traces: the clocks are the wall clock's.
    NothingShared,
    /// A rank of a communicator found in two processes: the second is left out.
    RankTwice {
        comm_id: String,
        rank: i32,
        kept: TraceProcess,
        left_out: TraceProcess,
    },
    /// Ranks of a communicator of `nranks` in no trace given.
    RanksMissing {
        comm_id: String,
        nranks: i32,
        missing: Vec<i32>,
    },
    /// Numbers under which the ranks called different collectives (`first`, the
    /// lowest; `numbers` of them): not matched.
    Mismatched {
        comm_id: String,
        first: u64,
        numbers: u64,
    },
}

/// A process of a trace: the trace's file and the pid.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceProcess {
    pub file: String,
    pub pid: u32,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Note::CutShort { file, cut_line } => {
                let cut = match cut_line {
                    Some(line) => format!(", its line {line} cut mid-line"),
                    None => String::new(),
                };
                write!(
                    f,
                    "{file} has no footer (cut short{cut}): collectives after the cut are \
                     missing from it"
                )
            }
            Note::NothingShared => f.write_str(
                "no communicator is shared by these traces (traces of different jobs, or \
                 communicators made before tracing began): their clocks are aligned by the \
                 wall clock alone",
            ),
            Note::RankTwice {
                comm_id,
                rank,
                kept,
                left_out,
            } => write!(
                f,
                "communicator {comm_id}: rank {rank} is in {} (pid {}) and again in {} (pid {}): \
                 the second is left out (the same run traced twice?)",
                kept.file, kept.pid, left_out.file, left_out.pid
            ),
            Note::RanksMissing {
                comm_id,
                nranks,
                missing,
            } => {
                let missing: Vec<String> = missing.iter().map(i32::to_string).collect();
                write!(
                    f,
                    "communicator {comm_id}: rank {} of {nranks} in no trace given: the waits \
                     are those among the ranks given",
                    missing.join(", ")
                )
            }
            Note::Mismatched {
                comm_id,
                first,
                numbers,
            } => write!(
                f,
                "communicator {comm_id}: its ranks called different collectives as number \
                 {first} ({numbers} numbers in all; traces of different runs?): those are not \
                 matched"
            ),
        }
    }
}

impl Serialize for Note {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}
