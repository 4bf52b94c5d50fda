"""Checks a cudatrace trace of workloads/allreduce.py against what the workload did.

    python3 workloads/allreduce_check.py TRACE.jsonl SUMMARY.json RESULTS_DIR [EXPORT.json]

RESULTS_DIR holds the workload's rank{R}.json; EXPORT.json is `cudatrace export`'s Chrome
JSON of TRACE. Exact checks (any mismatch exits 1):
  - every rank's process is in the trace (one trace, all pids);
  - per rank and op: the calls of the workload's size (count and float32) that ran
    inside no other NCCL collective of their thread number exactly iters + warmup, each
    with bytes = count x 4, rank = the process's rank, nranks = world size; NCCL's own
    inner calls (ncclBcast runs as ncclBroadcast) are counted and printed apart;
  - the summary's row of each rank and op: calls and bytes of those outer calls, and
    inner_calls = the inner calls counted;
  - devices: the device each rank's primary context was retained on
    (cuDevicePrimaryCtxRetain) includes the rank's GPU; every launch, copy, memset and
    device allocation/free of the rank's process says the rank's GPU (`device`); in a
    --gpu trace, every NCCL kernel of the process ran on the rank's GPU;
  - EXPORT.json: one rank track per process, named NCCL rank R/N, with one slice per
    outer collective call of the process.
Compared, not checked (a --gpu trace): cudatrace's bus bandwidth per rank and op (GPU time
of the NCCL kernels of all its calls, warm-up included) against the workload's own (the
MEDIAN of the CUDA-event times of its timed calls).
"""

import glob
import json
import os
import sys

OPS = {
    "AllReduce": ("ncclAllReduce",),
    "Broadcast": ("ncclBroadcast", "ncclBcast"),
    "AllGather": ("ncclAllGather",),
}
COLLECTIVES = {
    "ncclAllReduce", "ncclBroadcast", "ncclBcast", "ncclReduce", "ncclAllGather",
    "ncclReduceScatter", "ncclAlltoAll", "ncclGather", "ncclScatter", "ncclSend", "ncclRecv",
}
# Calls that carry the device they went to (cudatrace's analysis adds `device`).
DEVICE_CALLS = ("cuLaunch", "cuGraphLaunch", "cuMemcpy", "cuMemset", "cuMemAlloc", "cuMemFree")
HOST_MEMORY = ("cuMemAllocHost", "cuMemFreeHost")


def function(call):
    """The function a call line names, its pnccl profiling alias as ncclX."""
    name = call["name"]
    return name[1:] if name.startswith("pnccl") else name


def split_nested(calls):
    """The NCCL collective calls, as (outer, inner): an inner call ran inside another
    collective call of its thread ([ts, ts + dur] within the other's)."""
    by_thread = {}
    for call in calls:
        if function(call) in COLLECTIVES:
            by_thread.setdefault((call["pid"], call["tid"]), []).append(call)
    outer, inner = [], []
    for thread_calls in by_thread.values():
        # Outermost first: by start, the longer first.
        thread_calls.sort(key=lambda c: (c["ts_ns"], -c["dur_ns"]))
        open_end = -1
        for call in thread_calls:
            end = call["ts_ns"] + call["dur_ns"]
            if end <= open_end:
                inner.append(call)
            else:
                outer.append(call)
                open_end = end
    return outer, inner


def main():
    trace_path, summary_path, results_dir = sys.argv[1:4]
    export_path = sys.argv[4] if len(sys.argv) > 4 else None
    ranks = {}
    for path in sorted(glob.glob(os.path.join(results_dir, "rank*.json"))):
        with open(path) as f:
            result = json.load(f)
        ranks[result["pid"]] = result
    failures = []

    def check(what, got, want):
        ok = got == want
        print(f"  {'ok  ' if ok else 'FAIL'} {what}: {got} (expected {want})")
        if not ok:
            failures.append(what)

    if not ranks:
        print(f"FAIL no rank*.json in {results_dir}: the workload did not finish")
        return 1
    world = next(iter(ranks.values()))["world"]
    check("rank files", len(ranks), world)

    lines = []
    with open(trace_path) as f:
        for line in f:
            lines.append(json.loads(line))
    calls = [l for l in lines if l.get("type") == "call"]
    gpu_trace = any(l.get("type") == "gpu_kernel" for l in lines)
    libraries = [l for l in lines if l.get("type") == "library"]
    print("libraries: " + ", ".join(f"{l['set']} {l['path']}" for l in libraries))
    print(f"{len(calls)} calls, gpu lines: {gpu_trace}")

    traced_pids = {c["pid"] for c in calls if function(c).startswith("nccl")}
    check("processes calling NCCL in the trace", sorted(traced_pids), sorted(ranks))
    outer, inner = split_nested(calls)
    outer_ids = {id(c) for c in outer}
    inner_ids = {id(c) for c in inner}
    with open(summary_path) as f:
        summary = json.load(f)
    rows = summary.get("collectives", {}).get("rows", [])

    for pid, result in sorted(ranks.items(), key=lambda item: item[1]["rank"]):
        rank = result["rank"]
        print(f"rank {rank} (pid {pid}, GPU {result['device']}):")
        mine = [c for c in calls if c["pid"] == pid]
        for op, names in OPS.items():
            want = result["ops"][op]
            calls_made = result["iters"] + result.get("warmup", 0)
            sized = [
                c
                for c in mine
                if function(c) in names
                and c.get("count") == want["count"]
                and c.get("datatype") == "float32"
                and c.get("ret") == 0
            ]
            same = [c for c in sized if id(c) in outer_ids]
            nested = [c for c in sized if id(c) in inner_ids]
            check(
                f"{op} calls of {want['count']} float32 (iters + warm-up)",
                len(same),
                calls_made,
            )
            check(
                f"{op} bytes",
                sorted({c.get("bytes") for c in same}),
                [want["bytes"]],
            )
            check(
                f"{op} rank/nranks",
                sorted({(c.get("rank"), c.get("nranks")) for c in same}, key=str),
                [(rank, world)],
            )
            outer_names = sorted({c["name"] for c in same})
            inner_names = sorted({c["name"] for c in nested})
            print(
                f"       ({op}: {len(same)} calls of {outer_names}, {len(nested)} calls of "
                f"{inner_names} inside them)"
            )
            others = [
                c
                for c in mine
                if function(c) in names and id(c) in outer_ids and c not in same
            ]
            if others:
                print(f"  note {len(others)} other {op} calls (PyTorch's own)")
            # The summary's row: the op of the outer calls, all of them (ours and others).
            row_ops = {function(c)[len("nccl"):] for c in same}
            row = [r for r in rows if r["pid"] == pid and r["op"] in row_ops]
            mine_outer = [
                c for c in mine if id(c) in outer_ids and function(c)[len("nccl"):] in row_ops
            ]
            mine_inner = [
                c
                for c in mine
                if id(c) in inner_ids
                and any(
                    o["tid"] == c["tid"]
                    and o["ts_ns"] <= c["ts_ns"]
                    and c["ts_ns"] + c["dur_ns"] <= o["ts_ns"] + o["dur_ns"]
                    for o in mine_outer
                )
            ]
            check(
                f"{op} summary rows {sorted(row_ops)}: calls, bytes, inner_calls",
                [(r["calls"], r["bytes"], r.get("inner_calls", 0)) for r in row],
                [
                    (
                        len([c for c in mine_outer if c.get("ret") == 0]),
                        sum(c.get("bytes", 0) for c in mine_outer if c.get("ret") == 0),
                        len(mine_inner),
                    )
                ],
            )
            if nested:
                check(
                    f"{op} no summary row of its inner calls alone",
                    [
                        r["op"]
                        for r in rows
                        if r["pid"] == pid
                        and r["op"] in {function(c)[len("nccl"):] for c in nested}
                    ],
                    [],
                )
        placed = [
            c
            for c in mine
            if c["name"].startswith(DEVICE_CALLS)
            and not c["name"].startswith(HOST_MEMORY)
            and c.get("ret") == 0
        ]
        devices = {}
        for c in placed:
            devices[c.get("device")] = devices.get(c.get("device"), 0) + 1
        check(
            f"devices of its {len(placed)} launches, copies, memsets, device allocations/frees",
            sorted(devices, key=str),
            [result["device"]],
        )
        print(f"       (calls per device: {dict(sorted(devices.items(), key=str))})")
        retained = sorted(
            {c.get("device") for c in mine if c["name"] == "cuDevicePrimaryCtxRetain"},
            key=str,
        )
        check(
            "primary context retained on the rank's GPU",
            result["device"] in retained,
            True,
        )
        print(f"       (devices retained: {retained})")
        cu_device = sorted(
            {c.get("device") for c in mine if function(c) == "ncclCommCuDevice"},
            key=str,
        )
        if cu_device:
            check("ncclCommCuDevice", cu_device, [result["device"]])
        if gpu_trace:
            devices = sorted(
                {
                    l["device"]
                    for l in lines
                    if l.get("type") == "gpu_kernel"
                    and l["pid"] == pid
                    and "nccl" in l.get("kernel", "")
                }
            )
            check("devices of its NCCL kernels", devices, [result["device"]])

    if export_path:
        check_export(export_path, ranks, outer, check)
    print("\ncudatrace's collectives section:")
    for row in rows:
        print(
            f"  {row['communicator']:<18} rank {row.get('rank')} of {row.get('nranks')} "
            f"pid {row['pid']} {row['op']:<10} calls {row['calls']} bytes {row['bytes']} "
            f"host {row['host_ns'] / 1e6:.2f} ms gpu {row.get('gpu_ns', 0) / 1e6:.2f} ms "
            f"kernels {row.get('gpu_kernels', 0)} busbw {row.get('busbw_gb_s')}"
            + (
                f" (ran as {', '.join(row['inner_functions'])}: {row['inner_calls']} calls)"
                if row.get("inner_calls")
                else ""
            )
        )
    communicators = {r["communicator"] for r in rows if r["pid"] in ranks}
    print(f"communicators seen by the ranks: {sorted(communicators)}")
    if gpu_trace:
        print(
            "\nbus bandwidth, cudatrace (GPU time of the NCCL kernels of all its calls) vs "
            "workload (median of its timed calls' CUDA-event times):"
        )
        for pid, result in sorted(ranks.items(), key=lambda item: item[1]["rank"]):
            for op, names in OPS.items():
                # The row of the outer calls of this size: Bcast for dist.broadcast.
                want = result["ops"][op]
                row_ops = {
                    function(c)[len("nccl"):]
                    for c in outer
                    if c["pid"] == pid
                    and function(c) in names
                    and c.get("count") == want["count"]
                }
                row = [r for r in rows if r["pid"] == pid and r["op"] in row_ops]
                own = want["busbw_gb_s"]
                calls_made = result["iters"] + result.get("warmup", 0)
                if len(row) != 1 or row[0].get("busbw_gb_s") is None:
                    print(
                        f"  rank {result['rank']} {op:<10} cudatrace - ({len(row)} rows of "
                        f"{sorted(row_ops)}) workload {own:.1f} GB/s"
                    )
                    failures.append(f"rank {result['rank']} {op} has no bus bandwidth")
                    continue
                ours = row[0]["busbw_gb_s"]
                print(
                    f"  rank {result['rank']} {op:<10} cudatrace {ours:8.1f} GB/s "
                    f"({row[0]['op']}, {row[0]['calls']} calls)  workload {own:8.1f} GB/s "
                    f"(median of {result['iters']} of {calls_made} calls)  "
                    f"ratio {ours / own:.2f}"
                )
    if failures:
        print(f"\n{len(failures)} MISMATCHES: {', '.join(failures)}")
        return 1
    print("\nall exact checks passed")
    return 0


def check_export(export_path, ranks, outer, check):
    """The export's rank tracks: one per rank's process, named NCCL rank R/N, with one
    slice per outer collective call of the process (inner calls have none)."""
    with open(export_path) as f:
        events = json.load(f)["traceEvents"]
    track_names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "thread_name"
        and e["args"]["name"].startswith("NCCL rank ")
    }
    slices = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "nccl_rank":
            key = (e["pid"], e["tid"])
            slices[key] = slices.get(key, 0) + 1
    print(f"\nexport {export_path}: rank tracks")
    for pid, result in sorted(ranks.items(), key=lambda item: item[1]["rank"]):
        world = result["world"]
        tracks = sorted(name for (p, _), name in track_names.items() if p == pid)
        check(
            f"rank {result['rank']} rank tracks",
            [name.split(" (")[0] for name in tracks],
            [f"NCCL rank {result['rank']}/{world}"],
        )
        want = len([c for c in outer if c["pid"] == pid])
        got = sum(n for (p, _), n in slices.items() if p == pid)
        check(f"rank {result['rank']} rank-track slices (outer collective calls)", got, want)
        ours = 3 * (result["iters"] + result.get("warmup", 0))
        check(f"rank {result['rank']} of them the workload's (3 ops x (iters + warm-up))", want, ours)


if __name__ == "__main__":
    sys.exit(main())
