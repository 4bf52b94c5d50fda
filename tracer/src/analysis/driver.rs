//! The driver section of a summary (`--kernel` traces): NVIDIA ioctls by escape code,
//! RM_ALLOC by class, mmaps and kprobed functions, each with count, errors and time.

use foldhash::HashMap;

use serde::Serialize;

use crate::schema::DriverLine;

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
    row.errors += u64::from(line.failed());
    row.total_ns = row.total_ns.saturating_add(line.dur_ns);
}

impl DriverAccumulator {
    pub fn observe(&mut self, line: &DriverLine) {
        let what = line.what();
        let row = self
            .rows
            .entry((line.hook.to_string(), what.clone()))
            .or_insert_with(|| DriverRow {
                hook: line.hook.to_string(),
                what,
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
            acc.observe(&serde_json::from_value::<DriverLine>(line).unwrap());
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
        assert_eq!(
            crate::schema::parse(br#"{"type":"driver","pid":1,"ts_ns":1,"dur_ns":1}"#),
            Err("driver line: no \"hook\" string".into())
        );
    }

    #[test]
    fn a_written_line_reads_back_the_same() {
        let record = DriverLine {
            hook: "ioctl".into(),
            dur_ns: 42,
            ret: -25,
            device: Some("nvidia0".into()),
            escape: Some(0x2b),
            escape_name: Some("NV_ESC_RM_ALLOC".into()),
            rm_class: Some("0xc86f".into()),
            ..DriverLine::default()
        };
        let text = serde_json::to_string(&record).unwrap();
        let crate::schema::Line::Driver(read) = crate::schema::parse(text.as_bytes()).unwrap()
        else {
            panic!("not a driver line: {text}")
        };
        assert_eq!(*read, record);
        assert!(read.failed());
        assert_eq!(read.what(), "NV_ESC_RM_ALLOC");
    }
}
