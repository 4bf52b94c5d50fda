//! The summary as text: the whole report (`cudatrace summary`), the few lines
//! `cudatrace run` prints at the end, and the `--json` object.
//!
//! | file | |
//! |---|---|
//! | `full.rs` | [`render_text`]: the whole report, section by section |
//! | `sections.rs` | its devices, collectives and driver sections |
//! | `gpu.rs` | its `--gpu` section |
//! | `short.rs` | [`render_short`], [`render_gpu_short`]: what `cudatrace run` prints at the end |
//! | `json.rs` | [`SummaryJson`]: `cudatrace summary --json` |
//! | `ranks.rs` | [`render_job`]: several traces of one job (`summary A B`), and who waited for whom |

mod full;
mod gpu;
mod json;
mod ranks;
mod sections;
mod short;
#[cfg(test)]
mod tests;

pub use full::render_text;
pub use json::SummaryJson;
pub use ranks::{render_communicators, render_job};
pub use short::{render_gpu_short, render_short};

pub(super) fn copies(n: u64) -> String {
    format!("{n} {}", if n == 1 { "copy" } else { "copies" })
}

pub(super) fn percent(part: u64, whole: u64) -> String {
    format!("{:.1}%", part as f64 * 100.0 / whole.max(1) as f64)
}
