"""Checks a cudatrace trace of workloads/allreduce.py against what the workload did.

    python3 workloads/allreduce_check.py TRACE.jsonl SUMMARY.json RESULTS_DIR

RESULTS_DIR holds the workload's rank{R}.json. Exact checks (any mismatch exits 1):
  - every rank's process is in the trace (one trace, all pids);
  - per rank and op: the calls of the workload's size (count and float32) number exactly
    `iters`, each with bytes = count x 4, rank = the process's rank, nranks = world size;
  - devices: the device each rank's primary context was retained on
    (cuDevicePrimaryCtxRetain) includes the rank's GPU; in a --gpu trace, every NCCL
    kernel of the process ran on the rank's GPU.
Compared, not checked (a --gpu trace): cudatrace's bus bandwidth per rank and op (GPU time
of the NCCL kernels) against the workload's own (CUDA events around each call).
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


def main():
    trace_path, summary_path, results_dir = sys.argv[1:4]
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

    traced_pids = {c["pid"] for c in calls if c["name"].lstrip("p").startswith("nccl")}
    check("processes calling NCCL in the trace", sorted(traced_pids), sorted(ranks))

    for pid, result in sorted(ranks.items(), key=lambda item: item[1]["rank"]):
        rank = result["rank"]
        print(f"rank {rank} (pid {pid}, GPU {result['device']}):")
        mine = [c for c in calls if c["pid"] == pid]
        for op, names in OPS.items():
            want = result["ops"][op]
            same = [
                c
                for c in mine
                if c["name"].lstrip("p") in names
                and c.get("count") == want["count"]
                and c.get("datatype") == "float32"
                and c.get("ret") == 0
            ]
            check(f"{op} calls of {want['count']} float32", len(same), result["iters"])
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
            others = [
                c for c in mine if c["name"].lstrip("p") in names and c not in same
            ]
            if others:
                print(f"  note {len(others)} other {op} calls (PyTorch's own)")
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
            {c.get("device") for c in mine if c["name"].lstrip("p") == "ncclCommCuDevice"},
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

    with open(summary_path) as f:
        summary = json.load(f)
    rows = summary.get("collectives", {}).get("rows", [])
    print("\ncudatrace's collectives section:")
    for row in rows:
        print(
            f"  {row['communicator']:<18} rank {row.get('rank')} of {row.get('nranks')} "
            f"pid {row['pid']} {row['op']:<10} calls {row['calls']} bytes {row['bytes']} "
            f"host {row['host_ns'] / 1e6:.2f} ms gpu {row.get('gpu_ns', 0) / 1e6:.2f} ms "
            f"kernels {row.get('gpu_kernels', 0)} busbw {row.get('busbw_gb_s')}"
        )
    communicators = {r["communicator"] for r in rows if r["pid"] in ranks}
    print(f"communicators seen by the ranks: {sorted(communicators)}")
    if gpu_trace:
        print("\nbus bandwidth, cudatrace (GPU time of NCCL kernels) vs workload (CUDA events):")
        for pid, result in sorted(ranks.items(), key=lambda item: item[1]["rank"]):
            for op, names in OPS.items():
                row_names = {name[len("nccl"):] for name in names}
                row = [r for r in rows if r["pid"] == pid and r["op"] in row_names]
                own = result["ops"][op]["busbw_gb_s"]
                if not row or row[0].get("busbw_gb_s") is None:
                    print(f"  rank {result['rank']} {op:<10} cudatrace - workload {own:.1f} GB/s")
                    failures.append(f"rank {result['rank']} {op} has no bus bandwidth")
                    continue
                # Rows also hold PyTorch's own calls of the op, if any: say so.
                ours = row[0]["busbw_gb_s"]
                print(
                    f"  rank {result['rank']} {op:<10} cudatrace {ours:8.1f} GB/s "
                    f"({row[0]['calls']} calls)  workload {own:8.1f} GB/s "
                    f"({result['iters']} calls)  ratio {ours / own:.2f}"
                )
    if failures:
        print(f"\n{len(failures)} MISMATCHES: {', '.join(failures)}")
        return 1
    print("\nall exact checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
