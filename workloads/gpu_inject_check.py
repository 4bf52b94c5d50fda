#!/usr/bin/env python3
"""Checks the records of cudatrace's CUDA injection library (stdlib only).

Reads the JSON lines the library writes to CUDATRACE_INJECT_DEBUG_FILE (one per record it
hands to cudatrace_gpu_records; fields as in tracer-common's GpuRecord plus "text" and the
writer's "pid") and prints counts per record kind, errors, drops, and sanity figures.
With a cudatrace trace of the same run (`cudatrace run -- env CUDA_INJECTION64_PATH=...`),
it also links each API record to the traced call the way `run --gpu` will: same pid and
tid, call entry <= API start and API end <= call return.

Usage: python3 gpu_inject_check.py RECORDS.jsonl [TRACE.jsonl]
Exit status: 0 when every check holds, 1 otherwise.
"""
import bisect
import collections
import json
import statistics
import sys

KINDS = {1: "kernel", 2: "memcpy", 3: "memset", 4: "api", 5: "name", 6: "dropped",
         7: "error", 8: "clock", 9: "info"}
# Launch callback ids (cupti-inject/src/cbids.rs).
LAUNCH_CBIDS = {115, 116, 117, 307, 442, 477, 478, 480, 514, 515, 652, 653}
TIMESTAMP_CALLBACK = 1 << 3
CUPTI_CLOCK = 1 << 0
NO_TIMESTAMPS = 1 << 1


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def main():
    try:
        records = [json.loads(line) for line in open(sys.argv[1])]
    except FileNotFoundError:
        print(f"FAIL  no {sys.argv[1]}: the library never started (no cuInit? "
              "CUDA_INJECTION64_PATH not honoured?)")
        return 1
    trace = sys.argv[2] if len(sys.argv) > 2 else None
    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    by_kind = collections.Counter(KINDS.get(r["what"], r["what"]) for r in records)
    print("records:", len(records), dict(sorted(by_kind.items())))
    print("writer pids:", dict(collections.Counter(r["pid"] for r in records)))
    for info in (r for r in records if r["what"] == 9):
        print(f"info: CUPTI {info['detail']} from {info['text']}, timestamp callback: "
              f"{bool(info['flags'] & TIMESTAMP_CALLBACK)}")
    for error in (r for r in records if r["what"] == 7):
        print(f"error: stage {error['stage']} result {error['result']} "
              f"detail {error['detail']} flags {error['flags']}: {error['text']}")
    dropped = sum(r["dropped"] for r in records if r["what"] == 6)
    check(by_kind["error"] == 0, "no error records")
    check(dropped == 0, f"CUPTI dropped {dropped} records")

    # Clock: CLOCK_MONOTONIC through the callback, else convert with the latest pair.
    pairs = {}
    for r in records:
        if r["what"] == 8:
            pairs.setdefault(r["pid"], []).append((r["start"], r["end"]))

    def mono(r, ts):
        if not r["flags"] & CUPTI_CLOCK or ts == 0:
            return ts
        cupti, monotonic = pairs[r["pid"]][0]
        return ts - cupti + monotonic

    timed = [r for r in records if r["what"] in (1, 2, 3, 4)]
    untimed = [r for r in timed if r["flags"] & NO_TIMESTAMPS]
    check(not untimed, f"{len(untimed)} records without timestamps")
    check(all(r["start"] <= r["end"] for r in timed), "start <= end everywhere")

    apis = {(r["pid"], r["correlation_id"]): r for r in records if r["what"] == 4}
    kernels = [r for r in records if r["what"] == 1]
    launches = [r for r in apis.values() if r["cbid"] in LAUNCH_CBIDS]
    succeeded = [r for r in launches if r["result"] == 0]
    print(f"kernels {len(kernels)}, launch API records {len(launches)} "
          f"({len(succeeded)} succeeded)")
    unlinked = [k for k in kernels if (k["pid"], k["correlation_id"]) not in apis]
    check(not unlinked, f"{len(unlinked)} of {len(kernels)} kernels have no API record")
    delays = [mono(k, k["start"]) - mono(apis[(k["pid"], k["correlation_id"])],
                                         apis[(k["pid"], k["correlation_id"])]["end"])
              for k in kernels if (k["pid"], k["correlation_id"]) in apis]
    if delays:
        print(f"launch end -> kernel start, ns: min {min(delays)} p50 {pct(delays, 0.5)} "
              f"p99 {pct(delays, 0.99)} (negative: the kernel started before the call "
              f"returned, which CUDA allows)")
    durations = [k["end"] - k["start"] for k in kernels]
    if durations:
        print(f"kernel duration, ns: min {min(durations)} p50 {pct(durations, 0.5)} "
              f"max {max(durations)} total {sum(durations)}")
    names = {r["name_id"]: r for r in records if r["what"] == 5}
    if names:
        longest = max(names.values(), key=lambda n: n["text_full_len"])
        print(f"names {len(names)}, longest {longest['text_full_len']} bytes, "
              f"cut {sum(1 for n in names.values() if n['text_full_len'] > n['text_len'])}")
    check(all(k["name_id"] in names for k in kernels), "every kernel's name was sent")
    copies = collections.Counter(r["copy_kind"] for r in records if r["what"] == 2)
    print("copies by CUPTI kind (1 HtoD, 2 DtoH, 8 DtoD):", dict(copies))

    if trace:
        calls = collections.defaultdict(list)
        launch_calls = 0
        for line in open(trace):
            rec = json.loads(line)
            if rec.get("type") != "call":
                continue
            calls[(rec["pid"], rec["tid"])].append((rec["ts_ns"], rec["ts_ns"] + rec.get("dur_ns", 0),
                                                    rec["name"]))
            if rec["name"].startswith(("cuLaunch", "cuGraphLaunch")):
                launch_calls += 1
        for spans in calls.values():
            spans.sort()
        linked = collections.Counter()
        missing = []
        for api in apis.values():
            spans = calls.get((api["record_pid"], api["tid"]), [])
            start, end = mono(api, api["start"]), mono(api, api["end"])
            # Innermost call that contains the API record's interval.
            i = bisect.bisect_right(spans, (start, float("inf"), "")) - 1
            found = None
            while i >= 0 and found is None:
                if spans[i][0] <= start and end <= spans[i][1]:
                    found = spans[i][2]
                i -= 1
            if found is None:
                missing.append(api)
            else:
                linked[(api["cbid"], found)] += 1
        print(f"launch call lines in the trace: {launch_calls}")
        check(launch_calls == len(launches),
              f"launch calls traced ({launch_calls}) == launch API records ({len(launches)})")
        check(not missing, f"{len(missing)} of {len(apis)} API records inside no traced call"
              + (f" (first: {missing[0]})" if missing else ""))
        print("cbid -> traced call name:", dict(linked.most_common(12)))
    print("RESULT:", "ok" if not failures else f"{len(failures)} checks failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
