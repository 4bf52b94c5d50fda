//! The injection library on its own (no cudatrace, no eBPF, no root): the stand-in libcuda
//! loads it at cuInit as the driver does, it drives the stand-in libcupti, and its debug
//! file shows every record it hands to `cudatrace_gpu_records`, with exact values.

mod common;

use common::gpu::{
    DRIVER_GPU_CALLS, DRIVER_GPU_RECORDS, INJECT_LIB, api_record, driver_kernel_names, of_kind,
    run_driver, u,
};
use object::{Object, ObjectSymbol, ObjectSymbolTable};
use serde_json::Value;
use tracer_common::{ClockPair, GPU_TEXT_LEN, gpu_flags, gpu_record, gpu_stage};

fn stderr(run: &common::gpu::GpuRun) -> String {
    String::from_utf8_lossy(&run.output.stderr).into_owned()
}

/// The GPU records of `cudatrace-driver gpu`, checked against the stand-in's rules
/// (standin/libcupti_standin.c): everything but the clock the times are on.
fn assert_driver_gpu_records(records: &[Value], pid: u32) {
    let apis = of_kind(records, gpu_record::API);
    let calls: Vec<(u64, u64, u64)> = apis
        .iter()
        .map(|a| (u(&a["correlation_id"]), u(&a["cbid"]), u(&a["result"])))
        .collect();
    assert_eq!(calls, DRIVER_GPU_CALLS);
    for api in &apis {
        // SYSTEM thread ids: the kernel tid of the main thread, which is the pid.
        assert_eq!(
            (u(&api["record_pid"]), u(&api["tid"])),
            (pid.into(), pid.into())
        );
        assert!(u(&api["start"]) <= u(&api["end"]), "{api}");
    }

    // (correlation id, grid, block, dynamic shared memory, stream id, name id)
    let kernels: Vec<(u64, Value, Value, u64, u64, u64)> = of_kind(records, gpu_record::KERNEL)
        .iter()
        .map(|k| {
            (
                u(&k["correlation_id"]),
                k["grid"].clone(),
                k["block"].clone(),
                u(&k["dynamic_shared_mem"]),
                u(&k["stream_id"]),
                u(&k["name_id"]),
            )
        })
        .collect();
    let j = |v: [u64; 3]| serde_json::json!(v);
    assert_eq!(
        kernels,
        vec![
            (2, j([4096, 2, 1]), j([256, 1, 3]), 1024, 0x1010, 1),
            (3, j([128, 64, 2]), j([32, 8, 4]), 2048, 0x1010, 1),
            (4, j([7, 1, 1]), j([64, 1, 1]), 0, 7, 2),
            (5, j([1, 1, 1]), j([32, 1, 1]), 0, 0x1010, 3),
        ]
    );
    for kernel in of_kind(records, gpu_record::KERNEL) {
        let api = api_record(records, u(&kernel["correlation_id"]));
        let blocks: u64 = kernel["grid"].as_array().unwrap().iter().map(u).product();
        assert_eq!(u(&kernel["start"]), u(&api["end"]) + 1000, "{kernel}");
        assert_eq!(u(&kernel["end"]) - u(&kernel["start"]), blocks, "{kernel}");
        assert_eq!(
            (
                u(&kernel["registers_per_thread"]),
                u(&kernel["static_shared_mem"]),
                u(&kernel["device_id"]),
                u(&kernel["context_id"])
            ),
            (40, 512, 0, 1)
        );
    }

    // (correlation id, copy kind, src kind, dst kind, bytes, async, stream id)
    let copies: Vec<(u64, u64, u64, u64, u64, bool, u64)> = of_kind(records, gpu_record::MEMCPY)
        .iter()
        .map(|c| {
            (
                u(&c["correlation_id"]),
                u(&c["copy_kind"]),
                u(&c["src_kind"]),
                u(&c["dst_kind"]),
                u(&c["bytes"]),
                u(&c["flags"]) as u32 & gpu_flags::ASYNC != 0,
                u(&c["stream_id"]),
            )
        })
        .collect();
    assert_eq!(
        copies,
        vec![
            (1, 1, 1, 3, 1048576, false, 7),
            (9, 2, 3, 1, 65536, true, 0x1010)
        ]
    );
    // (correlation id, bytes, value, async, stream id)
    let memsets: Vec<(u64, u64, u64, bool, u64)> = of_kind(records, gpu_record::MEMSET)
        .iter()
        .map(|m| {
            (
                u(&m["correlation_id"]),
                u(&m["bytes"]),
                u(&m["memset_value"]),
                u(&m["flags"]) as u32 & gpu_flags::ASYNC != 0,
                u(&m["stream_id"]),
            )
        })
        .collect();
    assert_eq!(
        memsets,
        vec![(7, 777, 0xab, false, 7), (8, 400, 7, true, 0x1010)]
    );
    for work in of_kind(records, gpu_record::MEMCPY)
        .into_iter()
        .chain(of_kind(records, gpu_record::MEMSET))
    {
        let api = api_record(records, u(&work["correlation_id"]));
        assert_eq!(u(&work["start"]), u(&api["end"]) + 1000, "{work}");
        assert_eq!(u(&work["end"]) - u(&work["start"]), u(&work["bytes"]));
    }

    // Each name once, before the first kernel that uses it; the 5,000-byte one cut to 4 KiB.
    let names = of_kind(records, gpu_record::NAME);
    let expected = driver_kernel_names();
    assert_eq!(names.len(), 3);
    for (index, (name, text)) in names.iter().zip(&expected).enumerate() {
        let id = index as u64 + 1;
        assert_eq!(u(&name["name_id"]), id);
        let sent = &text[..text.len().min(GPU_TEXT_LEN)];
        assert_eq!(name["text"], sent);
        assert_eq!(
            (u(&name["text_len"]), u(&name["text_full_len"])),
            (sent.len() as u64, text.len() as u64)
        );
        let defined_at = records.iter().position(|r| r == *name).unwrap();
        let first_use = records
            .iter()
            .position(|r| r["what"] == gpu_record::KERNEL && r["name_id"] == id)
            .unwrap();
        assert!(defined_at < first_use, "name {id} defined after its use");
    }
    assert_eq!(
        names
            .iter()
            .map(|n| u(&n["text_full_len"]))
            .collect::<Vec<_>>(),
        vec![23, 1500, 5000]
    );
}

#[test]
fn known_gpu_work_gives_exact_records_on_the_trace_clock() {
    let cupti = common::gpu::cupti_standin();
    let run = run_driver("gpu-inject-exact", &cupti.lib, |_| {});
    assert!(run.output.status.success(), "{}", stderr(&run));
    assert_eq!(stderr(&run), "", "no complaint from the injection library");
    let records = &run.records;
    assert_eq!(records.len(), DRIVER_GPU_RECORDS, "{records:#?}");

    let info = &records[0];
    assert_eq!(info["what"], gpu_record::INFO);
    assert_eq!(u(&info["flags"]) as u32, gpu_flags::TIMESTAMP_CALLBACK);
    assert_eq!(u(&info["detail"]), 130001, "the stand-in's CUPTI version");
    assert_eq!(info["text"], cupti.lib.to_str().unwrap());
    assert_driver_gpu_records(records, run.pid);

    // CUPTI stamped everything through the callback: CLOCK_MONOTONIC, no conversion.
    let (before, after) = run.window;
    for record in of_kind(records, gpu_record::API) {
        assert_eq!(u(&record["flags"]), 0);
        assert!(
            before <= u(&record["start"]) && u(&record["end"]) <= after,
            "{record} outside {before}..{after}"
        );
    }
    assert!(of_kind(records, gpu_record::CLOCK).is_empty());
    assert!(of_kind(records, gpu_record::ERROR).is_empty());
    assert!(of_kind(records, gpu_record::DROPPED).is_empty());
}

#[test]
fn without_the_timestamp_callback_clock_pairs_convert_cupti_times() {
    let cupti = common::gpu::cupti_standin();
    let run = run_driver(
        "gpu-inject-clock",
        &cupti.without_timestamp_callback,
        |_| {},
    );
    assert!(run.output.status.success(), "{}", stderr(&run));
    let records = &run.records;
    assert_eq!(records[0]["what"], gpu_record::INFO);
    assert_eq!(u(&records[0]["flags"]), 0, "no timestamp callback");
    // One pair at start, one after the flush at exit (one more per 200 ms flush period).
    let clocks = of_kind(records, gpu_record::CLOCK);
    assert!(clocks.len() >= 2, "{clocks:?}");
    assert_eq!(
        records[1]["what"],
        gpu_record::CLOCK,
        "a pair before any record"
    );
    let others: Vec<Value> = records
        .iter()
        .filter(|r| r["what"] != gpu_record::CLOCK)
        .cloned()
        .collect();
    assert_eq!(others.len(), DRIVER_GPU_RECORDS);
    assert_driver_gpu_records(&others, run.pid);

    let pair = ClockPair {
        cupti_ns: u(&clocks[0]["start"]),
        monotonic_ns: u(&clocks[0]["end"]),
    };
    // CUPTI's default clock: ns since the epoch.
    assert!(pair.cupti_ns > 1_600_000_000_000_000_000, "{pair:?}");
    let (before, after) = run.window;
    for clock in &clocks {
        assert!(before <= u(&clock["end"]) && u(&clock["end"]) <= after);
    }
    for record in of_kind(records, gpu_record::API)
        .into_iter()
        .chain(of_kind(records, gpu_record::KERNEL))
    {
        assert_eq!(
            u(&record["flags"]) as u32,
            gpu_flags::CUPTI_CLOCK,
            "{record}"
        );
        let start = pair.to_monotonic(u(&record["start"]));
        let end = pair.to_monotonic(u(&record["end"]));
        // Converted with one pair: differences are kept exactly.
        assert_eq!(end - start, u(&record["end"]) - u(&record["start"]));
        if record["what"] == gpu_record::API {
            // On the trace's clock, within the run (1 ms for the realtime/monotonic pair's
            // error, which a clock step during the run could exceed).
            assert!(
                before - 1_000_000 <= start && end <= after + 1_000_000,
                "{start}..{end} outside {before}..{after}"
            );
        }
    }
}

#[test]
fn dropped_records_are_one_record_with_their_count() {
    let cupti = common::gpu::cupti_standin();
    let run = run_driver("gpu-inject-dropped", &cupti.lib, |command| {
        command.env("CUPTI_STANDIN_DROPPED", "5");
    });
    assert!(run.output.status.success(), "{}", stderr(&run));
    let dropped = of_kind(&run.records, gpu_record::DROPPED);
    assert_eq!(dropped.len(), 1, "{:#?}", run.records);
    assert_eq!(u(&dropped[0]["dropped"]), 5);
    assert_eq!(run.records.len(), DRIVER_GPU_RECORDS + 1);
}

#[test]
fn cupti_refusing_is_one_fatal_error_and_the_program_runs_on() {
    let cupti = common::gpu::cupti_standin();
    let run = run_driver("gpu-inject-refused", &cupti.lib, |command| {
        command.env("CUPTI_STANDIN_ENABLE_ERROR", "35");
    });
    assert!(run.output.status.success(), "{}", stderr(&run));
    let whats: Vec<u64> = run.records.iter().map(|r| u(&r["what"])).collect();
    assert_eq!(
        whats,
        vec![u64::from(gpu_record::INFO), u64::from(gpu_record::ERROR)],
        "nothing recorded after the refusal"
    );
    let error = &run.records[1];
    assert_eq!(
        (
            u(&error["stage"]) as u32,
            u(&error["result"]),
            u(&error["detail"]),
            u(&error["flags"]) as u32
        ),
        (gpu_stage::ENABLE_ACTIVITY, 35, 10, gpu_flags::FATAL)
    );
    let message = "CUPTI refused to record kernel activity: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES";
    assert!(
        error["text"].as_str().unwrap().starts_with(message),
        "{error}"
    );
    assert!(
        stderr(&run).starts_with(&format!("cudatrace-inject: {message}")),
        "{}",
        stderr(&run)
    );
}

#[test]
fn an_unloadable_libcupti_is_one_fatal_error_naming_it() {
    let run = run_driver(
        "gpu-inject-nocupti",
        "/nonexistent/libcupti.so.13".as_ref(),
        |_| {},
    );
    assert!(run.output.status.success(), "{}", stderr(&run));
    assert_eq!(run.records.len(), 1, "{:#?}", run.records);
    let error = &run.records[0];
    assert_eq!(error["what"], gpu_record::ERROR);
    assert_eq!(u(&error["stage"]) as u32, gpu_stage::LOAD_CUPTI);
    assert_eq!(u(&error["flags"]) as u32, gpu_flags::FATAL);
    let text = error["text"].as_str().unwrap();
    assert!(
        text.starts_with("cannot load libcupti (/nonexistent/libcupti.so.13: "),
        "{text}"
    );
    assert!(stderr(&run).contains("/nonexistent/libcupti.so.13"));
}

#[test]
fn a_chained_injection_library_is_started_after_ours() {
    let cupti = common::gpu::cupti_standin();
    let dir = common::scratch("gpu-inject-chain");
    let chained = common::gpu::chained_library(&dir);
    let marker = dir.join("marker");
    let run = run_driver("gpu-inject-chain-run", &cupti.lib, |command| {
        command
            .env("CUDATRACE_INJECT_CHAIN", &chained)
            .env("CHAINED_MARKER", &marker);
    });
    assert!(run.output.status.success(), "{}", stderr(&run));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        format!("chained {}", run.pid)
    );
    assert_eq!(run.records.len(), DRIVER_GPU_RECORDS);

    let missing = dir.join("missing.so");
    let run = run_driver("gpu-inject-chain-missing", &cupti.lib, |command| {
        command.env("CUDATRACE_INJECT_CHAIN", &missing);
    });
    assert!(run.output.status.success(), "{}", stderr(&run));
    let errors = of_kind(&run.records, gpu_record::ERROR);
    assert_eq!(errors.len(), 1);
    assert_eq!(u(&errors[0]["stage"]) as u32, gpu_stage::CHAIN);
    assert_eq!(u(&errors[0]["flags"]), 0, "not fatal: ours still records");
    assert!(
        errors[0]["text"]
            .as_str()
            .unwrap()
            .contains(missing.to_str().unwrap())
    );
    assert_eq!(run.records.len(), DRIVER_GPU_RECORDS + 1);
}

#[test]
fn the_library_exports_the_injection_entry_and_the_uprobed_function() {
    let bytes = std::fs::read(INJECT_LIB).unwrap();
    let elf = object::File::parse(&*bytes).unwrap();
    let exported: Vec<String> = elf
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.kind() == object::SymbolKind::Text)
        .map(|s| s.name().unwrap().to_owned())
        .collect();
    for name in ["InitializeInjection", tracer_common::GPU_RECORDS_SYMBOL] {
        assert!(
            exported.iter().any(|e| e == name),
            "{name} not in {exported:?}"
        );
    }
    // Calls to it are bound at link time (-Bsymbolic-functions): no dynamic relocation
    // names it, so the loader cannot send the batches to another object's function.
    let dynamic_symbols = elf.dynamic_symbol_table().expect(".dynsym");
    let by_name: Vec<String> = elf
        .dynamic_relocations()
        .expect("dynamic relocations")
        .filter_map(|(_, relocation)| match relocation.target() {
            object::RelocationTarget::Symbol(index) => Some(
                dynamic_symbols
                    .symbol_by_index(index)
                    .ok()?
                    .name()
                    .ok()?
                    .to_owned(),
            ),
            _ => None,
        })
        .collect();
    assert!(
        !by_name
            .iter()
            .any(|name| name == tracer_common::GPU_RECORDS_SYMBOL),
        "{by_name:?}"
    );
}
