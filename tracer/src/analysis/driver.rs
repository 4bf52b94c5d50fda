//! The driver section of a summary (`--kernel` traces): NVIDIA ioctls by escape code,
//! RM_ALLOC by class, mmaps and kprobed functions, each with count, errors and time.

use std::collections::HashMap;

use serde::Serialize;

/// What a `"type":"driver"` line contributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverLine {
    /// `ioctl`, `mmap`, `xid`, `kprobe`.
    pub hook: String,
    /// The escape or UVM name, the function, or the raw command.
    pub what: String,
    pub rm_class: Option<String>,
    pub dur_ns: u64,
    pub failed: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DriverRow {
    pub hook: String,
    pub what: String,
    pub count: u64,
    pub errors: u64,
    pub total_ns: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DriverSummary {
    pub events: u64,
    pub total_ns: u64,
    /// By total time, longest first.
    pub by_call: Vec<DriverRow>,
    /// NV_ESC_RM_ALLOC by object class, most first.
    pub rm_alloc_classes: Vec<DriverRow>,
}

#[derive(Default)]
pub struct DriverAccumulator {
    rows: HashMap<(String, String), DriverRow>,
    classes: HashMap<String, DriverRow>,
}

fn add(row: &mut DriverRow, line: &DriverLine) {
    row.count += 1;
    row.errors += u64::from(line.failed);
    row.total_ns = row.total_ns.saturating_add(line.dur_ns);
}

impl DriverAccumulator {
    pub fn observe(&mut self, line: &DriverLine) {
        let row = self
            .rows
            .entry((line.hook.clone(), line.what.clone()))
            .or_insert_with(|| DriverRow {
                hook: line.hook.clone(),
                what: line.what.clone(),
                ..DriverRow::default()
            });
        add(row, line);
        if let Some(class) = &line.rm_class {
            let row = self
                .classes
                .entry(class.clone())
                .or_insert_with(|| DriverRow {
                    hook: "ioctl".into(),
                    what: class.clone(),
                    ..DriverRow::default()
                });
            add(row, line);
        }
    }

    pub fn finish(self) -> DriverSummary {
        let mut by_call: Vec<DriverRow> = self.rows.into_values().collect();
        by_call.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.what.cmp(&b.what)));
        let mut rm_alloc_classes: Vec<DriverRow> = self.classes.into_values().collect();
        rm_alloc_classes.sort_by(|a, b| b.count.cmp(&a.count).then(a.what.cmp(&b.what)));
        DriverSummary {
            events: by_call.iter().map(|r| r.count).sum(),
            total_ns: by_call.iter().map(|r| r.total_ns).sum(),
            by_call,
            rm_alloc_classes,
        }
    }
}

/// The fields a driver line is summarised by, borrowed from a record or a JSON line.
pub struct DriverFields<'a> {
    pub hook: &'a str,
    pub escape: Option<u64>,
    pub escape_name: Option<&'a str>,
    pub uvm_cmd: Option<u64>,
    pub uvm_name: Option<&'a str>,
    pub function: Option<&'a str>,
    pub xid: Option<u64>,
    pub cmd: Option<&'a str>,
    pub device: Option<&'a str>,
    pub rm_class: Option<&'a str>,
    pub dur_ns: u64,
    pub ret: i64,
}

impl DriverLine {
    /// The one place that decides what a driver line is counted as.
    pub fn new(f: DriverFields<'_>) -> Self {
        let what = f
            .escape_name
            .map(str::to_owned)
            .or_else(|| f.escape.map(|e| format!("escape {e:#x}")))
            .or_else(|| f.uvm_name.map(str::to_owned))
            .or_else(|| f.uvm_cmd.map(|c| format!("uvm {c:#x}")))
            .or_else(|| f.function.map(str::to_owned))
            .or_else(|| f.xid.map(|x| format!("Xid {x}")))
            .or_else(|| f.cmd.map(str::to_owned))
            .unwrap_or_else(|| f.hook.to_owned());
        let what = match (f.hook, f.device) {
            ("mmap", Some(device)) => format!("mmap {device}"),
            _ => what,
        };
        DriverLine {
            hook: f.hook.to_owned(),
            what,
            rm_class: f.rm_class.map(str::to_owned),
            dur_ns: f.dur_ns,
            failed: f.ret < 0,
        }
    }

    /// From a record as `cudatrace run` writes it (no JSON round trip on the hot path).
    pub fn from_record(record: &crate::kernel_hooks::DriverRecord) -> Self {
        DriverLine::new(DriverFields {
            hook: record.hook,
            escape: record.escape.map(u64::from),
            escape_name: record.escape_name,
            uvm_cmd: record.uvm_cmd,
            uvm_name: record.uvm_name,
            function: record.function.as_deref(),
            xid: record.xid,
            cmd: record.cmd.as_deref(),
            device: record.device.as_deref(),
            rm_class: record.rm_class.as_deref(),
            dur_ns: record.dur_ns,
            ret: record.ret,
        })
    }

    /// From a parsed `"type":"driver"` line.
    pub fn from_value(value: &serde_json::Value) -> Result<Self, String> {
        let text = |key: &str| value.get(key).and_then(serde_json::Value::as_str);
        let number = |key: &str| value.get(key).and_then(serde_json::Value::as_u64);
        let hook = text("hook").ok_or("driver line: no \"hook\" string")?;
        Ok(DriverLine::new(DriverFields {
            hook,
            escape: number("escape"),
            escape_name: text("escape_name"),
            uvm_cmd: number("uvm_cmd"),
            uvm_name: text("uvm_name"),
            function: text("function"),
            xid: number("xid"),
            cmd: text("cmd"),
            device: text("device"),
            rm_class: text("rm_class"),
            dur_ns: number("dur_ns").unwrap_or(0),
            ret: value
                .get("ret")
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ioctls_group_by_escape_and_class_with_time() {
        let mut acc = DriverAccumulator::default();
        for (line, _) in [
            (
                json!({"hook":"ioctl","escape":0x2b,"escape_name":"NV_ESC_RM_ALLOC","rm_class":"0xc86f","dur_ns":100,"ret":0}),
                (),
            ),
            (
                json!({"hook":"ioctl","escape":0x2b,"escape_name":"NV_ESC_RM_ALLOC","rm_class":"0x40","dur_ns":50,"ret":-22}),
                (),
            ),
            (
                json!({"hook":"ioctl","escape":0x2b,"escape_name":"NV_ESC_RM_ALLOC","rm_class":"0xc86f","dur_ns":30,"ret":0}),
                (),
            ),
            (json!({"hook":"ioctl","escape":0xd6,"dur_ns":7,"ret":0}), ()),
            (
                json!({"hook":"mmap","device":"nvidiactl","dur_ns":9,"ret":140000}),
                (),
            ),
        ] {
            acc.observe(&DriverLine::from_value(&line).unwrap());
        }
        let summary = acc.finish();
        assert_eq!(summary.events, 5);
        assert_eq!(summary.total_ns, 196);
        assert_eq!(
            summary.by_call[0],
            DriverRow {
                hook: "ioctl".into(),
                what: "NV_ESC_RM_ALLOC".into(),
                count: 3,
                errors: 1,
                total_ns: 180
            }
        );
        assert_eq!(summary.by_call[1].what, "mmap nvidiactl");
        assert_eq!(summary.by_call[2].what, "escape 0xd6");
        assert_eq!(summary.rm_alloc_classes[0].what, "0xc86f");
        assert_eq!(
            (
                summary.rm_alloc_classes[0].count,
                summary.rm_alloc_classes[0].total_ns
            ),
            (2, 130)
        );
        assert!(DriverLine::from_value(&json!({"dur_ns": 1})).is_err());
    }

    #[test]
    fn a_record_and_its_json_line_count_the_same() {
        use crate::kernel_hooks::DriverRecord;
        let record = DriverRecord {
            record_type: "driver",
            hook: "ioctl",
            dur_ns: 42,
            ret: -25,
            device: Some("nvidia0".into()),
            escape: Some(0x2b),
            escape_name: Some("NV_ESC_RM_ALLOC"),
            rm_class: Some("0xc86f".into()),
            ..DriverRecord::default()
        };
        let from_json = DriverLine::from_value(&serde_json::to_value(&record).unwrap()).unwrap();
        assert_eq!(DriverLine::from_record(&record), from_json);
        assert!(from_json.failed);
        assert_eq!(from_json.what, "NV_ESC_RM_ALLOC");
    }
}
