//! `"type":"driver"` (`cudatrace run --kernel`): what the NVIDIA kernel module did for a
//! thread: an ioctl or mmap of a `/dev/nvidia*` file, a kprobed function, an Xid error.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    fields::{LineType, Tag},
    footer::{EventLine, Footer},
};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DriverLine {
    #[serde(rename = "type")]
    pub tag: Tag<Self>,
    /// `ioctl`, `mmap`, `xid` or `kprobe`.
    pub hook: Cow<'static, str>,
    pub pid: u32,
    pub tid: u32,
    pub ts_ns: u64,
    pub dur_ns: u64,
    pub ret: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fd: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escape: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escape_name: Option<Cow<'static, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uvm_cmd: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uvm_name: Option<Cow<'static, str>>,
    /// RM_CONTROL's command (NVOS54_PARAMETERS.cmd).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rm_control_cmd: Option<String>,
    /// RM_ALLOC's class (NVOS21/64_PARAMETERS.hClass).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rm_class: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prot: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flags: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<[String; 3]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xid: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl LineType for DriverLine {
    const TYPE: &'static str = "driver";
}

impl EventLine for DriverLine {
    fn count_in(&self, footer: &mut Footer) {
        footer.events.driver += 1;
    }
}

impl DriverLine {
    /// The most specific name the line has, which the summary counts it under and the
    /// export names its slice by: the escape or UVM command name, the kernel function,
    /// `Xid N`, `mmap DEVICE`...
    pub fn what(&self) -> String {
        let what = self
            .escape_name
            .as_deref()
            .map(str::to_owned)
            .or_else(|| self.escape.map(|e| format!("escape {e:#x}")))
            .or_else(|| self.uvm_name.as_deref().map(str::to_owned))
            .or_else(|| self.uvm_cmd.map(|c| format!("uvm {c:#x}")))
            .or_else(|| self.function.clone())
            .or_else(|| self.xid.map(|x| format!("Xid {x}")))
            .or_else(|| self.cmd.clone())
            .unwrap_or_else(|| self.hook.clone().into_owned());
        match (self.hook.as_ref(), &self.device) {
            ("mmap", Some(device)) => format!("mmap {device}"),
            _ => what,
        }
    }

    /// A failed syscall or function (a negative return).
    pub fn failed(&self) -> bool {
        self.ret < 0
    }

    /// Every field but the type, the thread and the times: what a viewer shows beside the
    /// slice.
    pub fn details(&self) -> Map<String, Value> {
        let mut fields = match serde_json::to_value(self) {
            Ok(Value::Object(fields)) => fields,
            _ => Map::new(),
        };
        for key in ["type", "pid", "tid", "ts_ns", "dur_ns"] {
            fields.remove(key);
        }
        fields
    }

    /// A line without `tid` is its process's main thread's.
    pub(super) fn read(value: &Value, bytes: &[u8]) -> Result<Self, String> {
        let number = |key: &str| value.get(key).and_then(Value::as_u64);
        value
            .get("hook")
            .and_then(Value::as_str)
            .ok_or("driver line: no \"hook\" string")?;
        let pid = number("pid").ok_or("driver line: no \"pid\" number")?;
        let tid = number("tid").unwrap_or(pid);
        number("ts_ns").ok_or("driver line: no \"ts_ns\" number")?;
        u32::try_from(pid).map_err(|_| "driver line: pid out of range")?;
        let tid = u32::try_from(tid).map_err(|_| "driver line: tid out of range")?;
        let mut line: DriverLine =
            serde_json::from_slice(bytes).map_err(|e| format!("driver line: {e}"))?;
        line.tid = tid;
        Ok(line)
    }
}
