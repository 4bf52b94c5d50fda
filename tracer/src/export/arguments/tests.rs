//! The arguments against what `serde_json::to_value` makes of the same lines.

use super::*;
use crate::schema::{CallLine, Hex};

/// What the export wrote before: `to_value`, keys removed, a JSON map.
fn as_map(call: &CallLine, skip: &[&str]) -> Map<String, Value> {
    let Value::Object(mut map) = serde_json::to_value(call).unwrap() else {
        panic!("not an object")
    };
    for key in skip {
        map.remove(*key);
    }
    map
}

fn as_value(arg: Arg<'_>) -> Value {
    match arg {
        Arg::Unsigned(n) => n.into(),
        Arg::Signed(n) => n.into(),
        Arg::Float(x) => x.into(),
        Arg::Bool(b) => b.into(),
        Arg::Text(text) => text.into(),
        Arg::Hex(value) => format!("{value:#x}").into(),
        Arg::Json(json) => serde_json::from_str(json).unwrap(),
    }
}

#[test]
fn a_call_gives_what_to_value_gives_in_key_order() {
    let call = CallLine {
        name: "cuLaunchKernel".into(),
        pid: 1,
        tid: 2,
        ts_ns: 3,
        dur_ns: Some(4),
        ret: Some(0),
        grid: Some([1, 2, 3]),
        stream: Some(Hex(0x10)),
        device: Some(0),
        version: Some(-7),
        kernel: Some("k\"é".into()),
        warnings: vec!["entry_read_failed".into()],
        ..CallLine::default()
    };
    let skip = ["type", "name", "pid", "tid", "dur_ns"];
    let mut arguments = Arguments::default();
    arguments.fill(&call, |key| skip.contains(&key));
    arguments.insert_text("call", "cuLaunchKernel");
    arguments.sort();
    let mut expected = as_map(&call, &skip);
    expected.insert("call".into(), "cuLaunchKernel".into());
    let got: Vec<(String, Value)> = arguments
        .iter()
        .map(|(k, v)| (k.to_owned(), as_value(v)))
        .collect();
    let want: Vec<(String, Value)> = expected.into_iter().collect();
    assert_eq!(got, want);
    // As `to_value` numbers them: a non-negative i32 is unsigned.
    let device = arguments.iter().find(|(k, _)| *k == "device").unwrap().1;
    assert_eq!(device, Arg::Unsigned(0));
    let version = arguments.iter().find(|(k, _)| *k == "version").unwrap().1;
    assert_eq!(version, Arg::Signed(-7));
    let grid = arguments.iter().find(|(k, _)| *k == "grid").unwrap().1;
    assert_eq!(grid, Arg::Json("[1,2,3]"));
    let warnings = arguments.iter().find(|(k, _)| *k == "warnings").unwrap().1;
    assert_eq!(warnings, Arg::Json(r#"["entry_read_failed"]"#));

    // Reused: cleared, then filled again.
    arguments.clear();
    assert_eq!(arguments.iter().count(), 0);
    arguments.fill(&call, |_| false);
    assert_eq!(
        arguments.iter().next().unwrap(),
        ("type", Arg::Text("call"))
    );
}

/// Values of every shape, as `to_value` and a JSON map would have them.
#[test]
fn any_line_gives_what_to_value_gives() {
    #[derive(Serialize)]
    struct Line {
        zebra: Vec<Vec<u32>>,
        apple: (i8, f32, Option<bool>, String, char),
        nested: std::collections::HashMap<String, Vec<String>>,
        mixed: Vec<Option<f64>>,
        escaped: Vec<&'static str>,
        unit: (),
        nothing: Option<u8>,
        not_finite: f64,
        a: u8,
        aa: u8,
        ab_longer_than_eight: u8,
        ab_longer_than_eigh: u8,
    }
    let line = Line {
        zebra: vec![vec![1], vec![]],
        apple: (-1, 0.1, None, "é\"".into(), 'x'),
        nested: [("k".to_owned(), vec!["v".to_owned()]), ("a".into(), vec![])]
            .into_iter()
            .collect(),
        mixed: vec![Some(1.5), None, Some(-0.0)],
        escaped: vec!["a\nb", "\\", "plain"],
        unit: (),
        nothing: None,
        not_finite: f64::NAN,
        a: 1,
        aa: 2,
        ab_longer_than_eight: 3,
        ab_longer_than_eigh: 4,
    };
    let mut arguments = Arguments::default();
    arguments.fill(&line, |key| key == "a");
    arguments.sort();
    let Value::Object(mut expected) = serde_json::to_value(&line).unwrap() else {
        panic!()
    };
    expected.remove("a");
    let got: Vec<(String, Value)> = arguments
        .iter()
        .map(|(k, v)| (k.to_owned(), as_value(v)))
        .collect();
    let want: Vec<(String, Value)> = expected.clone().into_iter().collect();
    assert_eq!(got, want);
    // And the JSON texts are the map's own.
    for (key, arg) in arguments.iter() {
        if let Arg::Json(json) = arg {
            assert_eq!(json, expected[key].to_string(), "{key}");
        }
    }
}

/// A struct with a flattened part serialises as a map: its entries, as `to_value` has
/// them, and a second line of the same shape the same way.
#[test]
fn a_flattened_struct_gives_what_to_value_gives() {
    #[derive(Serialize)]
    struct Link {
        zeta: u32,
        #[serde(skip_serializing_if = "Option::is_none")]
        beta: Option<i64>,
    }
    #[derive(Serialize)]
    struct Line {
        kernel: String,
        pid: u32,
        #[serde(flatten)]
        link: Link,
    }
    for beta in [Some(-200), None, Some(5)] {
        let line = Line {
            kernel: "k".into(),
            pid: 7,
            link: Link { zeta: 3, beta },
        };
        let mut arguments = Arguments::default();
        arguments.fill(&line, |key| key == "pid");
        arguments.sort();
        let Value::Object(mut expected) = serde_json::to_value(&line).unwrap() else {
            panic!()
        };
        expected.remove("pid");
        let got: Vec<(String, Value)> = arguments
            .iter()
            .map(|(k, v)| (k.to_owned(), as_value(v)))
            .collect();
        let want: Vec<(String, Value)> = expected.into_iter().collect();
        assert_eq!(got, want);
        assert_eq!(got.len(), 2 + usize::from(beta.is_some()));
    }
}

#[test]
fn a_map_gives_its_entries() {
    let map: Map<String, Value> = serde_json::from_str(
        r#"{"a":1,"b":-2,"c":1.5,"d":true,"e":"x","f":[1,"y"],"g":{"z":null},"h":null}"#,
    )
    .unwrap();
    let arguments = Arguments::from_map(&map);
    let got: Vec<(&str, Arg<'_>)> = arguments.iter().collect();
    assert_eq!(
        got,
        [
            ("a", Arg::Unsigned(1)),
            ("b", Arg::Signed(-2)),
            ("c", Arg::Float(1.5)),
            ("d", Arg::Bool(true)),
            ("e", Arg::Text("x")),
            ("f", Arg::Json(r#"[1,"y"]"#)),
            ("g", Arg::Json(r#"{"z":null}"#)),
            ("h", Arg::Json("null")),
        ]
    );
}
