//! Decoding: ring-buffer records to trace lines, `cudatrace run`'s second stage (after the
//! ring, before the analysis). [`Decoder`] (`decoder.rs`) drives it: a record's bytes
//! become a `RawEvent` (`raw.rs`), then the schema's `Line` (the enum the readers read
//! back) or a GPU record still to be linked ([`Event`]): calls with their arguments named
//! through the probe catalog (`call/`; CUDA error names from `catalog/cuda_result.rs`),
//! driver events (`driver.rs`), process events (`process.rs`) and GPU records (`gpu.rs`).

mod call;
mod decoder;
mod driver;
pub mod gpu;
mod process;
mod raw;

pub use decoder::{Decoder, Event};
pub use raw::{RawEvent, RawGpu, decode, is_call_kind};
