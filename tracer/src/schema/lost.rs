//! `"type":"lost"`: events the kernel had to drop since the last look, by reason.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    fields::{LineType, Tag},
    footer::{EventLine, Footer},
};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LostLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    pub ts_ns: u64,
    /// A counter of the footer's `lost`: `ring_full`, `too_deep`, `frames_full`,
    /// `process_ring_full`, `driver_ring_full`, `library_not_attached`, or (`--gpu`)
    /// `gpu_ring_full`, `gpu_read_failed`, `cupti_dropped`.
    pub reason: String,
    /// Dropped since the previous `lost` line of this reason.
    pub count: u64,
    /// Dropped so far, all reasons (readers add up `count`s instead).
    #[serde(skip_deserializing)]
    pub total: u64,
    /// `library_not_attached`: the library file whose probes a process did not get (its
    /// calls into it are missing), the process, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl LineType for LostLine {
    const TYPE: &'static str = "lost";
}

impl EventLine for LostLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.lost += 1;
    }
}

impl LostLine {
    pub(super) fn read(value: &Value, bytes: &[u8]) -> Result<Self, String> {
        value
            .get("count")
            .and_then(Value::as_u64)
            .ok_or("lost line: no \"count\" number")?;
        serde_json::from_slice(bytes).map_err(|e| format!("lost line: {e}"))
    }
}
