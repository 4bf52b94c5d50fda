//! The tables read back with the parquet crate's own reader: exact rows of hand-written
//! traces, and docs/trace-format.md checked against every table's columns. (The
//! integration tests read them with DuckDB: `tests/parquet.rs`.)

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    path::{Path, PathBuf},
};

use arrow_array::{
    Array, ArrayRef,
    cast::AsArray,
    types::{Int32Type, Int64Type},
};
use arrow_schema::{DataType, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Value, json};

use super::{
    calls::{Calls, column_name},
    columns::{Kind, doc_type},
    link::Link,
    table::schema,
    tables::{TABLE_NAMES, schemas},
};
use crate::test_traces;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cudatrace-parquet-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Exports `text` (written to DIR/t.jsonl) into DIR/out; the rows of each table.
fn export(name: &str, text: &str) -> (PathBuf, super::Rows) {
    let dir = scratch(name);
    let trace = dir.join("t.jsonl");
    std::fs::write(&trace, text).unwrap();
    let out = dir.join("out");
    let rows = super::export(&trace, &out, false, false, None).unwrap();
    (out, rows)
}

fn value(array: &ArrayRef, row: usize) -> Value {
    if array.is_null(row) {
        return Value::Null;
    }
    match array.data_type() {
        DataType::Int32 => json!(array.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => json!(array.as_primitive::<Int64Type>().value(row)),
        DataType::Boolean => json!(array.as_boolean().value(row)),
        DataType::Utf8 => json!(array.as_string::<i32>().value(row)),
        DataType::Dictionary(_, _) => {
            let dictionary = array.as_any_dictionary();
            value(dictionary.values(), dictionary.normalized_keys()[row])
        }
        DataType::List(_) => {
            let items = array.as_list::<i32>().value(row);
            Value::Array((0..items.len()).map(|i| value(&items, i)).collect())
        }
        other => panic!("no reader for {other}"),
    }
}

/// Every row of table `name` in `dir`, as column → value; and the file's schema.
fn read(dir: &Path, name: &str) -> (Vec<BTreeMap<String, Value>>, SchemaRef) {
    let file = File::open(dir.join(format!("{name}.parquet"))).unwrap();
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let schema = builder.schema().clone();
    let mut rows = Vec::new();
    for batch in builder.build().unwrap() {
        let batch = batch.unwrap();
        for row in 0..batch.num_rows() {
            rows.push(
                schema
                    .fields()
                    .iter()
                    .zip(batch.columns())
                    .map(|(field, column)| (field.name().clone(), value(column, row)))
                    .collect(),
            );
        }
    }
    (rows, schema)
}

/// `columns` of each row.
fn pick(rows: &[BTreeMap<String, Value>], columns: &[&str]) -> Vec<Vec<Value>> {
    rows.iter()
        .map(|row| columns.iter().map(|c| row[*c].clone()).collect())
        .collect()
}

#[test]
fn every_table_is_written_with_its_schema_and_calls_keep_every_field() {
    let (out, rows) = export("known", &test_traces::known());
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let mut expected: Vec<String> = TABLE_NAMES.iter().map(|n| format!("{n}.parquet")).collect();
    expected.sort();
    assert_eq!(names, expected);
    assert_eq!(rows[0], test_traces::KNOWN_CALLS);
    let (calls, schema) = read(&out, "calls");
    assert_eq!(*schema, *super::table::schema::<Calls>());
    // The known trace's cuMemAlloc_v2, as its line has it and with the analysis's bytes.
    let alloc = calls.iter().find(|r| r["name"] == "cuMemAlloc_v2").unwrap();
    assert_eq!(
        pick(
            std::slice::from_ref(alloc),
            &[
                "trace",
                "host",
                "rank",
                "pid",
                "tid",
                "ts_ns",
                "dur_ns",
                "ret",
                "ok",
                "bytes",
                "dptr",
                "live_bytes",
                "family",
                "grid_x"
            ]
        ),
        [[
            // A header without host nor start: the file names the trace.
            json!(out.parent().unwrap().join("t.jsonl").display().to_string()),
            Value::Null,
            Value::Null,
            json!(100),
            json!(100),
            json!(test_traces::KNOWN_BASE_NS + 5_000),
            json!(1_000),
            json!(0),
            json!(true),
            json!(4_194_304),
            json!(0x7f00_0000_0000_i64),
            json!(4_194_304),
            json!("memory"),
            Value::Null,
        ]]
    );
    let launch = calls
        .iter()
        .find(|r| r["name"] == "cuLaunchKernel")
        .unwrap();
    assert_eq!(
        pick(
            std::slice::from_ref(launch),
            &[
                "grid_x", "grid_y", "grid_z", "block_x", "stream", "function"
            ]
        ),
        [[
            json!(4),
            json!(1),
            json!(1),
            json!(128),
            json!(0x10),
            json!(0x30)
        ]]
    );
    // Copies: the calls of copy functions, with the summary's direction and bytes.
    let (copies, _) = read(&out, "copies");
    let calls_of_copies = calls
        .iter()
        .filter(|r| r["name"].as_str().unwrap().starts_with("cuMemcpy"))
        .count();
    assert_eq!(copies.len(), calls_of_copies);
    let (processes, _) = read(&out, "processes");
    assert_eq!(
        pick(&processes, &["event", "pid", "ts_ns", "filename"]),
        [[
            json!("exec"),
            json!(100),
            json!(test_traces::KNOWN_BASE_NS + 500),
            json!("/bin/app")
        ]]
    );
    let (trace_rows, _) = read(&out, "traces");
    assert_eq!(
        pick(
            &trace_rows,
            &[
                "format_version",
                "command",
                "pids",
                "complete",
                "lines",
                "gpu"
            ]
        ),
        [[
            json!(1),
            json!(["./app", "--big"]),
            json!([100]),
            json!(true),
            json!(test_traces::KNOWN_LINES),
            json!(false),
        ]]
    );
    std::fs::remove_dir_all(out.parent().unwrap()).unwrap();
}

#[test]
fn collectives_are_numbered_on_their_communicator_with_their_kernels() {
    let text = test_traces::nccl_gpu();
    let (out, _) = export("nccl", &text);
    let (mut rows, _) = read(&out, "collectives");
    rows.sort_by_key(|r| r["ts_ns"].as_i64());
    let columns = [
        "name",
        "op",
        "inner_name",
        "ok",
        "comm_seq",
        "group",
        "rank",
        "comm_rank",
        "comm_nranks",
        "comm_id",
        "bytes",
        "gpu_kernels",
        "gpu_start_ns",
        "gpu_end_ns",
        "gpu_ns",
    ];
    let null = Value::Null;
    let aa = json!("aaaaaaaaaaaaaaaa");
    let row = |name: &str, op: &str, inner: Value, ok: bool, seq: Value, group: Value| {
        vec![json!(name), json!(op), inner, json!(ok), seq, group]
    };
    let rank = [json!(1), json!(1), json!(2), aa.clone()];
    let expected: Vec<Vec<Value>> = [
        (
            row(
                "ncclAllReduce",
                "AllReduce",
                null.clone(),
                true,
                json!(1),
                null.clone(),
            ),
            [
                json!(1024),
                json!(1),
                json!(2_100_000),
                json!(2_105_000),
                json!(5_000),
            ],
        ),
        (
            row(
                "ncclAllReduce",
                "AllReduce",
                null.clone(),
                true,
                json!(2),
                json!(1),
            ),
            // A quarter of the group's bytes: a quarter of its kernel's time.
            [
                json!(100),
                json!(1),
                json!(3_100_000),
                json!(3_108_000),
                json!(2_000),
            ],
        ),
        (
            row(
                "ncclBroadcast",
                "Broadcast",
                null.clone(),
                true,
                json!(3),
                json!(1),
            ),
            [
                json!(300),
                json!(1),
                json!(3_100_000),
                json!(3_108_000),
                json!(6_000),
            ],
        ),
        (
            // The inner ncclBroadcast took number 4.
            row(
                "ncclBcast",
                "Bcast",
                json!("ncclBroadcast"),
                true,
                json!(5),
                null.clone(),
            ),
            [json!(64), json!(0), null.clone(), null.clone(), json!(0)],
        ),
        (
            row(
                "ncclSend",
                "Send",
                null.clone(),
                true,
                null.clone(),
                null.clone(),
            ),
            [json!(8), json!(0), null.clone(), null.clone(), json!(0)],
        ),
        (
            row(
                "ncclAllReduce",
                "AllReduce",
                null.clone(),
                false,
                null.clone(),
                null.clone(),
            ),
            [null.clone(), json!(0), null.clone(), null.clone(), json!(0)],
        ),
    ]
    .into_iter()
    .map(|(head, tail)| {
        let mut row = head;
        row.extend(rank.iter().cloned());
        row.extend(tail);
        row
    })
    .collect();
    assert_eq!(pick(&rows, &columns), expected);
    assert!(
        rows.iter()
            .all(|r| r["trace"] == "node-a@2026-11-26T10:00:00Z"
                && r["host"] == "node-a"
                && r["wall_offset_ns"] == json!(1_795_600_000_000_000_000_i64 - 1_000_000))
    );

    // The summary's collectives section, from the same lines: the same figures.
    let mut analysis = crate::analysis::Analysis::default();
    for line in text.lines() {
        analysis.line(&mut crate::schema::parse(line.as_bytes()).unwrap());
    }
    let summary = analysis.finish().collectives;
    let mut by_op: BTreeMap<String, (u64, u64, u64, u64)> = BTreeMap::new();
    for row in &rows {
        let entry = by_op
            .entry(row["op"].as_str().unwrap().to_owned())
            .or_default();
        match row["ok"] == true {
            true => {
                entry.0 += 1;
                entry.2 += row["bytes"].as_u64().unwrap();
            }
            false => entry.1 += 1,
        }
        entry.3 += row["gpu_ns"].as_u64().unwrap();
    }
    let from_summary: BTreeMap<String, (u64, u64, u64, u64)> = summary
        .rows
        .iter()
        .map(|r| {
            let figures = (r.calls, r.errors, r.bytes, r.gpu_ns.unwrap());
            (r.op.clone(), figures)
        })
        .collect();
    assert_eq!(by_op, from_summary);

    // Every row of the process has its rank, those before its communicator too.
    let (calls, _) = read(&out, "calls");
    assert_eq!(calls[0]["name"], "cuInit");
    assert!(calls.iter().all(|r| r["rank"] == 1), "{calls:?}");
    let (kernels, _) = read(&out, "kernels");
    assert_eq!(
        pick(
            &kernels,
            &["rank", "call_tid", "call_ts_ns", "grid_x", "block_x"]
        ),
        [
            [json!(1), json!(7), json!(2_000_050), json!(2), json!(512)],
            [json!(1), json!(7), json!(3_000_350), json!(2), json!(512)]
        ]
    );
    std::fs::remove_dir_all(out.parent().unwrap()).unwrap();
}

/// The Parquet section of docs/trace-format.md: for each table (`### \`name\``, and
/// `### Every table` for the first three columns), its columns and their types.
fn documented() -> BTreeMap<String, Vec<(String, String)>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/trace-format.md");
    let text = std::fs::read_to_string(path).unwrap();
    let mut tables: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut in_section = false;
    let mut table = None;
    for line in text.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            in_section = title.starts_with("Parquet tables");
            table = None;
            continue;
        }
        if let Some(title) = line.strip_prefix("### ").filter(|_| in_section) {
            table = Some(title.trim_matches('`').to_owned());
            continue;
        }
        let (Some(table), Some(row)) = (&table, line.strip_prefix('|')) else {
            continue;
        };
        let cells: Vec<&str> = row.split(" | ").map(str::trim).collect();
        if cells[0] == "column" || cells[0].starts_with("---") {
            continue;
        }
        let names: Vec<&str> = cells[0].split(", ").map(|n| n.trim_matches('`')).collect();
        let types: Vec<&str> = cells[1].split(", ").collect();
        for (index, name) in names.iter().enumerate() {
            let given = match types.len() {
                1 => types[0],
                _ => types.get(index).expect(line),
            };
            tables
                .entry(table.clone())
                .or_default()
                .push(((*name).to_owned(), given.to_owned()));
        }
    }
    tables
}

/// A table's columns after the three every table has, and their documented types.
fn columns(schema: &SchemaRef) -> Vec<(String, String)> {
    schema
        .fields()
        .iter()
        .skip(3)
        .map(|field| (field.name().clone(), doc_type(field)))
        .collect()
}

/// A column added to a table (or a field to call lines) and not to docs/trace-format.md,
/// or documented with another type, fails here.
#[test]
fn the_format_doc_describes_every_column_of_every_table_with_its_type() {
    let mut documented = documented();
    // The GPU tables' link columns are documented once, for every table that ends with them.
    let link_doc = documented
        .remove("GPU link columns")
        .expect("docs/trace-format.md's `### GPU link columns`");
    let mut link_fields = Vec::new();
    <Link as Kind>::fields("link", &mut link_fields);
    let link: Vec<&String> = link_fields.iter().map(|field| field.name()).collect();
    let mut linked = 0;
    for (table, schema) in schemas() {
        let names: Vec<&String> = schema.fields().iter().map(|field| field.name()).collect();
        if names.ends_with(&link) {
            linked += 1;
            let columns = documented.get_mut(table).expect(table);
            columns.extend(link_doc.iter().cloned());
        }
    }
    assert!(linked > 0, "no table ends with the link columns");
    let every = schema::<Calls>()
        .fields()
        .iter()
        .take(3)
        .map(|field| (field.name().clone(), doc_type(field)))
        .collect::<Vec<_>>();
    let mut expected: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    expected.insert("Every table".into(), every);
    for (table, schema) in schemas() {
        expected.insert(table.to_owned(), columns(&schema));
    }
    assert_eq!(
        expected.keys().collect::<Vec<_>>(),
        documented.keys().collect::<Vec<_>>()
    );
    for (table, columns) in &expected {
        // The doc groups columns of one type: compare as sets, then the order's count.
        let want: BTreeSet<&(String, String)> = columns.iter().collect();
        let got: BTreeSet<&(String, String)> = documented[table].iter().collect();
        let undocumented: Vec<_> = want.difference(&got).collect();
        let unknown: Vec<_> = got.difference(&want).collect();
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "{table}: not in the doc (or with another type): {undocumented:?}; \
             in the doc, not in the table: {unknown:?}"
        );
        assert_eq!(
            columns.len(),
            documented[table].len(),
            "{table}: a column twice"
        );
    }
    // The renamed call fields are the ones the doc explains.
    assert_eq!(
        ["rank", "nranks", "host", "dptr"].map(column_name),
        ["comm_rank", "comm_nranks", "host_ptr", "dptr"]
    );
}
