//! Where `cudatrace run`'s events go, last in its pipeline: the JSONL trace (`jsonl.rs`)
//! and the progress line on stderr (`progress.rs`).

pub mod jsonl;
pub mod progress;
