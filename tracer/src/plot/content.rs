//! What the picture shows: the summary's own figures and the calls binned into columns.

use super::bins::Bins;
use crate::{
    analysis::{Report, stages::ProcessStages, summarise::TraceInfo},
    schema::ProcessMemory,
};

/// What the picture shows.
pub struct Plot<'a> {
    pub info: &'a TraceInfo,
    pub report: &'a Report,
    pub bins: &'a Bins,
}

impl Plot<'_> {
    /// The stages drawn as bands: those of the process with the most calls.
    pub fn primary_stages(&self) -> Option<&ProcessStages> {
        self.report
            .stages
            .iter()
            .max_by_key(|process| (process.calls, std::cmp::Reverse(process.pid)))
    }

    /// A process's memory figures (its latest entry, after an exec).
    pub fn memory_of(&self, pid: u32) -> Option<&ProcessMemory> {
        self.report.memory.iter().rev().find(|m| m.pid == pid)
    }
}
