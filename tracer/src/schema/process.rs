//! `"type":"process"`: a traced process forked, exec'd or exited.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
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
    pub event: ProcessEvent,
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

/// What happened to the process (the `event` key), written as its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessEvent {
    Fork,
    Exec,
    Exit,
    /// A name this version does not know (a newer trace), kept as written: readers pass
    /// it on (the export draws it) and otherwise ignore it.
    Other(String),
}

impl ProcessEvent {
    pub fn as_str(&self) -> &str {
        match self {
            ProcessEvent::Fork => "fork",
            ProcessEvent::Exec => "exec",
            ProcessEvent::Exit => "exit",
            ProcessEvent::Other(name) => name,
        }
    }

    /// `exec` and `exit`: the process's address space is gone, and with it its handles,
    /// its device memory and the GPU work still waiting for its calls.
    pub fn ends_address_space(&self) -> bool {
        matches!(self, ProcessEvent::Exec | ProcessEvent::Exit)
    }
}

impl From<&str> for ProcessEvent {
    fn from(name: &str) -> Self {
        match name {
            "fork" => ProcessEvent::Fork,
            "exec" => ProcessEvent::Exec,
            "exit" => ProcessEvent::Exit,
            other => ProcessEvent::Other(other.to_owned()),
        }
    }
}

/// An empty name, as a line without `event` was read before this was an enum.
impl Default for ProcessEvent {
    fn default() -> Self {
        ProcessEvent::Other(String::new())
    }
}

impl Serialize for ProcessEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ProcessEvent {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(ProcessEventVisitor)
    }
}

struct ProcessEventVisitor;

impl de::Visitor<'_> for ProcessEventVisitor {
    type Value = ProcessEvent;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<ProcessEvent, E> {
        Ok(ProcessEvent::from(name))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_is_written_as_its_name_and_an_unknown_one_is_kept() {
        for name in ["fork", "exec", "exit", "vfork", ""] {
            let event = ProcessEvent::from(name);
            assert_eq!(event.as_str(), name);
            let text = serde_json::to_string(&event).unwrap();
            assert_eq!(text, format!("\"{name}\""));
            assert_eq!(serde_json::from_str::<ProcessEvent>(&text).unwrap(), event);
        }
        assert_eq!(ProcessEvent::from("exit"), ProcessEvent::Exit);
        assert_eq!(
            ProcessEvent::from("vfork"),
            ProcessEvent::Other("vfork".into())
        );
        let ends =
            ["fork", "exec", "exit", "vfork"].map(|n| ProcessEvent::from(n).ends_address_space());
        assert_eq!(ends, [false, true, true, false]);
    }
}
