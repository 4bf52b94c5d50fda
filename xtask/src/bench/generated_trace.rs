//! A large trace for timing `summary` and `export`: the demo trace's calls repeated.

use std::{
    collections::BTreeMap,
    fs::{self, File},
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::{Context, Result, ensure};
use serde::Deserialize;
use serde_json::json;

/// What the generator reads of a demo trace line; the line itself is copied as it is.
#[derive(Deserialize)]
struct DemoLine {
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    name: String,
}

/// A call line split around its `ts_ns` value.
struct Template {
    before: Vec<u8>,
    after: Vec<u8>,
    ts: u64,
    name: String,
}

fn split_ts(line: &str) -> Option<(Vec<u8>, Vec<u8>, u64)> {
    const KEY: &str = "\"ts_ns\":";
    let start = line.find(KEY)? + KEY.len();
    let digits = line[start..].bytes().take_while(u8::is_ascii_digit).count();
    let ts = line[start..start + digits].parse().ok()?;
    Some((
        line.as_bytes()[..start].to_vec(),
        line.as_bytes()[start + digits..].to_vec(),
        ts,
    ))
}

/// Writes `events` call lines made of the demo trace's calls repeated (the demo's own
/// spacing, each repetition 50 µs after the last), between its header and process lines
/// and a footer with the matching counts. Deterministic for a given demo trace.
pub fn generate_trace(demo: &Path, out: &Path, events: u64) -> Result<u64> {
    let text = fs::read_to_string(demo)?;
    let mut header = None;
    let mut process = Vec::new();
    let mut templates = Vec::new();
    for line in text.lines() {
        let demo_line: DemoLine = serde_json::from_str(line)?;
        match demo_line.kind.as_deref() {
            Some("header") => header = Some(line.to_owned()),
            Some("process") => process.push(line.to_owned()),
            Some("call") => {
                let (before, after, ts) = split_ts(line).context("a call line without ts_ns")?;
                templates.push(Template {
                    before,
                    after,
                    ts,
                    name: demo_line.name,
                });
            }
            _ => {}
        }
    }
    let header = header.context("the demo trace has no header")?;
    ensure!(!templates.is_empty(), "the demo trace has no calls");
    let first = templates.iter().map(|t| t.ts).min().unwrap_or(0);
    let last = templates.iter().map(|t| t.ts).max().unwrap_or(0);
    let period = last - first + 50_000;
    let mut names: BTreeMap<&str, u64> = BTreeMap::new();
    let mut w = BufWriter::with_capacity(1 << 20, File::create(out)?);
    writeln!(w, "{header}")?;
    if let Some(exec) = process.iter().find(|l| l.contains("\"event\":\"exec\"")) {
        writeln!(w, "{exec}")?;
    }
    let mut ts = first;
    for i in 0..events {
        let t = &templates[(i % templates.len() as u64) as usize];
        ts = first + (i / templates.len() as u64) * period + (t.ts - first);
        w.write_all(&t.before)?;
        write!(w, "{ts}")?;
        w.write_all(&t.after)?;
        w.write_all(b"\n")?;
        *names.entry(&t.name).or_insert(0) += 1;
    }
    let mut process_lines = 0;
    if let Some(exit) = process.iter().find(|l| l.contains("\"event\":\"exit\"")) {
        let (before, after, _) = split_ts(exit).context("an exit line without ts_ns")?;
        w.write_all(&before)?;
        write!(w, "{}", ts + 1000)?;
        w.write_all(&after)?;
        w.write_all(b"\n")?;
        process_lines = 2;
    }
    let footer = json!({
        "type": "footer",
        "end_wall": "2026-11-21T00:00:00Z",
        "duration_ns": ts + 1000 - first,
        "events": {"call": events, "process": process_lines, "lost": 0, "driver": 0},
        "calls_by_name": names,
        "lost": {"ring_full": 0, "too_deep": 0, "frames_full": 0, "process_ring_full": 0,
                 "driver_ring_full": 0, "calls": 0, "total": 0},
        "entries_seen": events,
        "unmatched_returns": 0,
        "undecodable": 0,
        "exit_code": 0,
        "generated_by": "cargo xtask bench (demo calls repeated)",
    });
    writeln!(w, "{footer}")?;
    w.flush()?;
    Ok(fs::metadata(out)?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_repeat_with_their_spacing_between_the_demos_header_process_lines_and_a_footer() {
        let dir = std::env::temp_dir().join(format!("xtask-generated-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let demo = dir.join("demo.jsonl");
        fs::write(
            &demo,
            concat!(
                r#"{"type":"header","version":1}"#,
                "\n",
                r#"{"type":"process","event":"exec","pid":7,"ts_ns":50}"#,
                "\n",
                r#"{"type":"call","name":"cuInit","pid":7,"ts_ns":100,"dur_ns":5}"#,
                "\n",
                r#"{"type":"call","name":"cuMemAlloc_v2","pid":7,"ts_ns":300,"dur_ns":5}"#,
                "\n",
                r#"{"type":"process","event":"exit","pid":7,"ts_ns":400}"#,
                "\n",
                r#"{"type":"footer","events":{"call":2}}"#,
                "\n",
            ),
        )
        .unwrap();
        let out = dir.join("generated.jsonl");
        let bytes = generate_trace(&demo, &out, 5).unwrap();
        let text = fs::read_to_string(&out).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(bytes, text.len() as u64);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "header", "process", "call", "call", "call", "call", "call", "process", "footer"
            ]
        );
        // Each repetition starts 50 us after the last call of the one before.
        let call_ts: Vec<u64> = lines[2..7]
            .iter()
            .map(|l| l["ts_ns"].as_u64().unwrap())
            .collect();
        assert_eq!(call_ts, [100, 300, 50_300, 50_500, 100_500]);
        assert_eq!(lines[7]["ts_ns"], 101_500);
        let footer = &lines[8];
        assert_eq!(footer["events"]["call"], 5);
        assert_eq!(footer["events"]["process"], 2);
        assert_eq!(footer["entries_seen"], 5);
        assert_eq!(footer["calls_by_name"]["cuInit"], 3);
        assert_eq!(footer["calls_by_name"]["cuMemAlloc_v2"], 2);
        assert_eq!(footer["duration_ns"], 101_400);
    }

    #[test]
    fn a_call_line_splits_around_its_timestamp() {
        let line = r#"{"type":"call","name":"cuInit","pid":1,"tid":1,"ts_ns":2283275219678,"dur_ns":47931,"ret":0}"#;
        let (before, after, ts) = split_ts(line).unwrap();
        assert_eq!(ts, 2283275219678);
        let rebuilt = [before, b"42".to_vec(), after].concat();
        assert_eq!(
            String::from_utf8(rebuilt).unwrap(),
            line.replace("2283275219678", "42")
        );
    }
}
