//! `"type":"process"`: a traced process forked, exec'd or exited.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    fields::{LineType, Tag},
    footer::{EventLine, Footer},
};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    /// `fork`, `exec` or `exit`.
    pub event: String,
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    /// `fork`: the new process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child_pid: Option<u32>,
    /// `fork` and `exit`: the process's command name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// `exec`: the program (cut at 255 bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
}

impl LineType for ProcessLine {
    const TYPE: &'static str = "process";
}

impl EventLine for ProcessLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.process += 1;
    }
}

impl ProcessLine {
    pub(super) fn read(value: &Value, bytes: &[u8]) -> Result<Self, String> {
        value
            .get("pid")
            .and_then(Value::as_u64)
            .and_then(|pid| u32::try_from(pid).ok())
            .ok_or("process line: no valid \"pid\"")?;
        value
            .get("event")
            .and_then(Value::as_str)
            .ok_or("process line: no \"event\" string")?;
        serde_json::from_slice(bytes).map_err(|e| format!("process line: {e}"))
    }
}
