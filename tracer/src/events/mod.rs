//! Decoding: ring-buffer records to trace lines. A record's bytes become a [`RawEvent`]
//! (`raw.rs`), then a line of the schema: calls through the probe catalog (`call.rs`, CUDA
//! error names from `cuda_result.rs`), driver events (`driver.rs`) and process events
//! (`process.rs`).

mod call;
pub mod cuda_result;
mod driver;
mod process;
mod raw;

pub use call::decode_call;
pub use driver::decode as decode_driver;
pub use process::decode as decode_process;
pub use raw::{RawEvent, decode};
