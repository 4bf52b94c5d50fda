//! Root tests of the NCCL probe set: the stand-in libnccl (`standin/libnccl_standin.c`,
//! `nccl*` and `pnccl*` at one address) `dlopen()`ed by `tests/c/nccl_caller.c` from a
//! path given nowhere else and called at once. Every call's decoded arguments (counts,
//! bytes, datatypes, ops, roots and peers, streams), each communicator's rank and nranks
//! on the calls that use it, groups, aliases listed once, and the summary's collectives
//! section, exactly.

mod common;

use std::process::Command;

use common::{nccl::*, *};
use serde_json::{Value, json};

/// The keys a test compares: everything but times, ids and the pid (and the
/// communicators' names and numbers, compared on their own).
fn decoded(call: &Value) -> Value {
    let mut call = call.clone();
    let object = call.as_object_mut().unwrap();
    for key in [
        "type", "pid", "tid", "ts_ns", "dur_ns", "lib", "comm_id", "comm_seq",
    ] {
        object.remove(key);
    }
    call
}

#[test]
fn nccl_calls_are_decoded_exactly_from_a_library_dlopened_from_anywhere() {
    let Some(_guard) = root() else { return };
    let dir = scratch("nccl-calls");
    let lines = trace_nccl_caller(&dir);

    let libraries: Vec<&Value> = lines.iter().filter(|l| l["type"] == "library").collect();
    assert_eq!(libraries.len(), 1);
    let library = libraries[0];
    assert_eq!(library["set"], "libnccl");
    assert_eq!(library["found"], "opened");
    assert_eq!(library["standin"], true);
    assert_eq!(
        library["path"].as_str().unwrap(),
        nccl_standin().lib.to_str().unwrap()
    );
    // 28 catalog functions, each attached once; every pncclX listed once as ncclX's alias.
    let probes = library["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 28);
    assert!(
        probes
            .iter()
            .all(|p| p["symbol"].as_str().unwrap().starts_with("nccl"))
    );
    let aliases = library["aliases"].as_array().unwrap();
    assert_eq!(aliases.len(), 28);
    assert!(aliases.contains(&json!(["pncclAllReduce", "ncclAllReduce"])));
    assert!(aliases.contains(&json!(["pncclCommInitRank", "ncclCommInitRank"])));

    let pid = lines[0]["pids"][0].as_u64().unwrap();
    // Every call on a known communicator names it across processes; each successful
    // collective (not send or receive) has its number on it.
    let named: Vec<(&str, &Value, &Value)> = calls(&lines)
        .into_iter()
        .map(|c| (c["name"].as_str().unwrap(), &c["comm_id"], &c["comm_seq"]))
        .collect();
    let (id, child_id, all_id) = (
        json!("0001020304050607"),
        json!("0001020304050607/1c7"),
        json!(format!("{pid}:0x2020")),
    );
    let none = Value::Null;
    let mut expected_names = vec![
        ("ncclGetVersion", &none, none.clone()),
        ("ncclCommInitRank", &id, none.clone()),
        ("ncclCommCuDevice", &id, none.clone()),
    ];
    let collectives = [
        "ncclAllReduce",
        "ncclAllReduce",
        "ncclAllReduce",
        "ncclAllReduce",
        "ncclBroadcast",
        "ncclBroadcast",
        "ncclBcast",
        "ncclReduce",
        "ncclAllGather",
        "ncclReduceScatter",
        "ncclAlltoAll",
        "ncclGather",
        "ncclScatter",
    ];
    for (n, name) in collectives.into_iter().enumerate() {
        expected_names.push((name, &id, json!(n + 1)));
    }
    expected_names.extend([
        ("ncclGroupStart", &none, none.clone()),
        ("ncclSend", &id, none.clone()),
        ("ncclRecv", &id, none.clone()),
        ("ncclGroupEnd", &none, none.clone()),
        ("ncclCommSplit", &id, none.clone()),
        ("ncclAllReduce", &child_id, json!(1)),
        ("ncclCommUserRank", &child_id, none.clone()),
        ("ncclCommCount", &child_id, none.clone()),
        ("ncclAllReduce", &child_id, json!(2)),
        ("ncclCommInitAll", &none, none.clone()),
        ("ncclAllReduce", &all_id, json!(1)),
        ("ncclAllReduce", &id, none.clone()),
        ("ncclGroupEnd", &none, none.clone()),
        ("ncclCommDestroy", &all_id, none.clone()),
        ("ncclCommDestroy", &all_id, none.clone()),
        ("ncclCommFinalize", &id, none.clone()),
        ("ncclCommDestroy", &id, none.clone()),
    ]);
    let expected_names: Vec<(&str, &Value, &Value)> = expected_names
        .iter()
        .map(|(name, id, seq)| (*name, *id, seq))
        .collect();
    assert_eq!(named, expected_names);

    let calls: Vec<Value> = calls(&lines).into_iter().map(decoded).collect();
    let ok = json!("ncclSuccess");
    let with = |name: &str, fields: Value| {
        let mut call = json!({"name": name, "ret": 0, "ret_name": ok});
        call.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        call
    };
    let comm = json!("0x2000");
    let child = json!("0x2010");
    let buffers = |count: u64, datatype: &str, size: u64| {
        json!({"src": "0x10000", "dst": "0x20000", "stream": "0x5150", "count": count,
               "datatype": datatype, "datatype_size": size, "bytes": count * size})
    };
    let merged = |a: Value, b: Value| {
        let mut a = a;
        a.as_object_mut()
            .unwrap()
            .extend(b.as_object().unwrap().clone());
        a
    };
    let id: String = (0u8..32).map(|b| format!("{b:02x}")).collect();
    let mut expected = vec![
        with("ncclGetVersion", json!({"version": 22809})),
        with(
            "ncclCommInitRank",
            json!({"comm": comm, "rank": 1, "nranks": 2, "unique_id": id}),
        ),
        with(
            "ncclCommCuDevice",
            json!({"comm": comm, "device": 0, "rank": 1, "nranks": 2}),
        ),
    ];
    let on_comm = json!({"comm": comm, "rank": 1, "nranks": 2});
    for _ in 0..3 {
        expected.push(with(
            "ncclAllReduce",
            merged(
                merged(buffers(1000, "float32", 4), on_comm.clone()),
                json!({"op": "sum"}),
            ),
        ));
    }
    // pncclAllReduce is the same address: the call line names the symbol attached.
    expected.push(with(
        "ncclAllReduce",
        merged(
            merged(buffers(10, "float16", 2), on_comm.clone()),
            json!({"op": "max"}),
        ),
    ));
    expected.push(with(
        "ncclBroadcast",
        merged(
            merged(buffers(4096, "int8", 1), on_comm.clone()),
            json!({"root": 1}),
        ),
    ));
    let mut bcast = merged(
        merged(buffers(100, "int32", 4), on_comm.clone()),
        json!({"root": 0}),
    );
    bcast.as_object_mut().unwrap().remove("src");
    // The stand-in's ncclBcast, like NCCL's, calls ncclBroadcast(buff, buff, ...) through
    // the exported symbol: its line comes first (it returns first).
    let mut in_place = bcast.clone();
    in_place["src"] = json!("0x20000");
    expected.push(with("ncclBroadcast", in_place));
    expected.push(with("ncclBcast", bcast));
    expected.push(with(
        "ncclReduce",
        merged(
            merged(buffers(10, "float64", 8), on_comm.clone()),
            json!({"op": "min", "root": 1, "stream": "0x5151"}),
        ),
    ));
    expected.push(with(
        "ncclAllGather",
        merged(buffers(256, "bfloat16", 2), on_comm.clone()),
    ));
    expected.push(with(
        "ncclReduceScatter",
        merged(
            merged(buffers(128, "int64", 8), on_comm.clone()),
            json!({"op": "avg"}),
        ),
    ));
    expected.push(with(
        "ncclAlltoAll",
        merged(buffers(64, "uint8", 1), on_comm.clone()),
    ));
    expected.push(with(
        "ncclGather",
        merged(
            merged(buffers(32, "uint32", 4), on_comm.clone()),
            json!({"root": 0}),
        ),
    ));
    expected.push(with(
        "ncclScatter",
        merged(
            merged(buffers(16, "uint64", 8), on_comm.clone()),
            json!({"root": 1}),
        ),
    ));
    expected.push(with("ncclGroupStart", json!({"group": 1})));
    let mut send = merged(
        merged(buffers(100, "float16", 2), on_comm.clone()),
        json!({"peer": 0, "group": 1}),
    );
    send.as_object_mut().unwrap().remove("dst");
    expected.push(with("ncclSend", send));
    let mut recv = merged(
        merged(buffers(100, "float16", 2), on_comm.clone()),
        json!({"peer": 0, "group": 1}),
    );
    recv.as_object_mut().unwrap().remove("src");
    expected.push(with("ncclRecv", recv));
    expected.push(with("ncclGroupEnd", json!({"group": 1})));
    expected.push(with(
        "ncclCommSplit",
        json!({"comm": comm, "new_comm": child, "color": 7, "key": 3, "rank": 1, "nranks": 2}),
    ));
    // The child's rank is not known until the program asks NCCL.
    expected.push(with(
        "ncclAllReduce",
        merged(
            buffers(5, "float32", 4),
            json!({"comm": child, "op": "sum"}),
        ),
    ));
    expected.push(with("ncclCommUserRank", json!({"comm": child, "rank": 0})));
    expected.push(with(
        "ncclCommCount",
        json!({"comm": child, "rank": 0, "nranks": 1}),
    ));
    expected.push(with(
        "ncclAllReduce",
        merged(
            buffers(6, "float32", 4),
            json!({"comm": child, "op": "sum", "rank": 0, "nranks": 1}),
        ),
    ));
    expected.push(with(
        "ncclCommInitAll",
        json!({"comms": ["0x2020", "0x2030"], "nranks": 2}),
    ));
    expected.push(with(
        "ncclAllReduce",
        merged(
            buffers(8, "float32", 4),
            json!({"comm": "0x2030", "op": "prod", "rank": 1, "nranks": 2}),
        ),
    ));
    let mut bad = merged(
        merged(buffers(8, "float32", 4), on_comm.clone()),
        json!({"op": "sum", "datatype": "type_12", "ret": 4, "ret_name": "ncclInvalidArgument"}),
    );
    for key in ["datatype_size", "bytes"] {
        bad.as_object_mut().unwrap().remove(key);
    }
    expected.push(merged(with("ncclAllReduce", json!({})), bad));
    expected.push(json!({"name": "ncclGroupEnd", "ret": 5, "ret_name": "ncclInvalidUsage"}));
    expected.push(with(
        "ncclCommDestroy",
        json!({"comm": "0x2020", "rank": 0, "nranks": 2}),
    ));
    expected.push(with(
        "ncclCommDestroy",
        json!({"comm": "0x2030", "rank": 1, "nranks": 2}),
    ));
    expected.push(with("ncclCommFinalize", on_comm.clone()));
    expected.push(with("ncclCommDestroy", on_comm.clone()));

    assert_eq!(calls.len(), expected.len());
    for (index, (got, want)) in calls.iter().zip(&expected).enumerate() {
        assert_eq!(got, want, "call {index}");
    }
}

/// A collectives row: communicator, op, rank, nranks, calls, errors, bytes, size.
type Row = (String, String, Value, Value, u64, u64, u64, Value);

#[test]
fn the_summary_has_a_collectives_row_per_communicator_rank_and_op() {
    let Some(_guard) = root() else { return };
    let dir = scratch("nccl-summary");
    let lines = trace_nccl_caller(&dir);
    let pid = lines[0]["pids"][0].as_u64().unwrap();
    let output = Command::new(CUDATRACE)
        .args(["summary", "--json"])
        .arg(dir.join("t.jsonl"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    let rows = summary["collectives"]["rows"].as_array().unwrap();
    let brief: Vec<Row> = rows
        .iter()
        .map(|r| {
            (
                r["communicator"].as_str().unwrap().to_owned(),
                r["op"].as_str().unwrap().to_owned(),
                r["rank"].clone(),
                r["nranks"].clone(),
                r["calls"].as_u64().unwrap(),
                r["errors"].as_u64().unwrap(),
                r["bytes"].as_u64().unwrap(),
                r["size_bytes"].clone(),
            )
        })
        .collect();
    let id = "0001020304050607".to_owned();
    let row = |op: &str, calls, errors, bytes, size: Value| {
        (
            id.clone(),
            op.to_owned(),
            json!(1),
            json!(2),
            calls,
            errors,
            bytes,
            size,
        )
    };
    assert_eq!(
        brief,
        vec![
            row("AllGather", 1, 0, 512, json!(1024)),
            row("AllReduce", 4, 1, 12020, json!(12020)),
            row("AlltoAll", 1, 0, 64, json!(128)),
            row("Bcast", 1, 0, 400, json!(400)),
            row("Broadcast", 1, 0, 4096, json!(4096)),
            row("Gather", 1, 0, 128, json!(256)),
            row("Recv", 1, 0, 200, json!(200)),
            row("Reduce", 1, 0, 80, json!(80)),
            row("ReduceScatter", 1, 0, 1024, json!(2048)),
            row("Scatter", 1, 0, 128, json!(256)),
            row("Send", 1, 0, 200, json!(200)),
            (
                "0001020304050607/1c7".into(),
                "AllReduce".into(),
                json!(0),
                json!(1),
                2,
                0,
                44,
                json!(44)
            ),
            (
                format!("{pid}:0x2020"),
                "AllReduce".into(),
                json!(1),
                json!(2),
                1,
                0,
                32,
                json!(32)
            ),
        ]
    );
    let grouped: Vec<u64> = rows
        .iter()
        .map(|r| r["grouped"].as_u64().unwrap())
        .collect();
    assert_eq!(grouped, [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0]);
    // ncclBcast's inner ncclBroadcast is in the Bcast row, not the Broadcast row.
    let inner: Vec<(&str, &Value, &Value)> = rows
        .iter()
        .filter(|r| r.get("inner_calls").is_some() || r.get("inner_functions").is_some())
        .map(|r| {
            (
                r["op"].as_str().unwrap(),
                &r["inner_calls"],
                &r["inner_functions"],
            )
        })
        .collect();
    assert_eq!(
        inner,
        [("Bcast", &json!(1), &json!(["ncclBroadcast"]))],
        "{rows:?}"
    );
    // No --gpu: no GPU figures.
    assert!(rows.iter().all(|r| r.get("gpu_ns").is_none()));
    let text = Command::new(CUDATRACE)
        .arg("summary")
        .arg(dir.join("t.jsonl"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("NCCL collectives, by communicator and rank"),
        "{text}"
    );
    assert!(text.contains("1 of 2"), "{text}");
    assert!(
        text.contains("ran as ncclBroadcast inside it (1 calls, counted once, here)"),
        "{text}"
    );
}
