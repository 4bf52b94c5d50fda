"""Checks `cudatrace summary --json A B` of workloads/straggler.py's two ranks against what
the workload did (workloads/jobs_gpu.sh runs it):

    python3 workloads/jobs_check.py SUMMARY.json WORKLOAD_DIR [--tolerance-ms 1]

- the communicator with the job's ranks matched every all-reduce of the workload's size
  (warm-up + iters) on both ranks;
- the timed all-reduces rank 0 waited for more than 5 ms are exactly those before which
  the last rank slept, the last rank is named last in each, and rank 0's wait is the
  sleep within the tolerance;
- the last rank is the first straggler;
- the second trace's clock was fitted on the collectives (its offset and uncertainty are
  printed: near 0 for two node agents on one host).
Prints a table; exits 1 on a mismatch.
"""

import argparse
import glob
import json
import os
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("summary")
    parser.add_argument("workload")
    parser.add_argument("--tolerance-ms", type=float, default=1.0)
    args = parser.parse_args()
    report = json.load(open(args.summary))
    ranks = {}
    for path in glob.glob(os.path.join(args.workload, "rank*.json")):
        info = json.load(open(path))
        ranks[info["rank"]] = info
    world = ranks[0]["world"]
    last = world - 1
    failures = []

    for trace in report["traces"]:
        clock = trace["clock"]
        print(
            f"trace {trace['file']} host {trace['host']}: clock {clock['method']}, offset "
            f"{clock['offset_ns']} ns, uncertainty {clock.get('uncertainty_ns')} ns, "
            f"{clock['collectives_used']} collectives"
        )
    fitted = [t for t in report["traces"] if t["clock"]["method"] == "collectives"]
    if len(fitted) != len(report["traces"]) - 1:
        failures.append("not every trace but the reference was fitted on collectives")

    comms = [c for c in report["communicators"] if c.get("nranks") == world and c["matched"]]
    if len(comms) != 1:
        failures.append(f"{len(comms)} communicators of {world} ranks with matched collectives")
        comm = None
    else:
        comm = comms[0]
    if comm:
        size = ranks[0]["bytes"]
        ours = [c for c in comm["collectives"] if c["op"] == "AllReduce" and c["bytes"] == size]
        expected = ranks[0]["iters"] + ranks[0]["warmup"]
        print(f"communicator {comm['comm_id']}: {comm['matched']} matched, {len(ours)} all-reduces of {size} bytes (expected {expected}), ready from {comm['ready_from']}")
        if len(ours) != expected:
            failures.append(f"{len(ours)} all-reduces of {size} bytes matched, expected {expected}")
        timed = ours[ranks[0]["warmup"]:]
        late = set(ranks[last]["late"])
        sleep = ranks[last]["sleep_ms"]
        print(f"{'n':>3} {'seq':>5} {'last':>4} {'wait on rank 0 (ms)':>20} {'transfer (us)':>14} {'busbw (GB/s)':>13}")
        waited = set()
        for n, c in enumerate(timed, start=1):
            wait0 = next(r["wait_ns"] for r in c["ranks"] if r["rank"] == 0) / 1e6
            if wait0 > 5:
                waited.add(n)
            mark = " late" if n in late else ""
            transfer = c.get("transfer_ns")
            print(f"{n:>3} {c['seq']:>5} {c['last_rank']:>4} {wait0:>20.3f} {transfer / 1e3 if transfer else float('nan'):>14.1f} {c.get('busbw_gb_s') or float('nan'):>13.1f}{mark}")
            if n in late:
                if c["last_rank"] != last:
                    failures.append(f"all-reduce {n}: last rank {c['last_rank']}, expected {last}")
                if abs(wait0 - sleep) > args.tolerance_ms:
                    failures.append(f"all-reduce {n}: rank 0 waited {wait0:.3f} ms, expected {sleep} +- {args.tolerance_ms}")
        if waited != late:
            failures.append(f"rank 0 waited > 5 ms in {sorted(waited)}, the last rank slept before {sorted(late)}")
        if not comm["stragglers"] or comm["stragglers"][0] != last:
            failures.append(f"stragglers {comm['stragglers']}, expected rank {last} first")
        for r in comm["ranks"]:
            print(f"rank {r['rank']} ({r['host']} pid {r['pid']}): last {r['last']}, others waited {r['caused_wait_ns'] / 1e6:.3f} ms, own wait {r['waited_ns'] / 1e6:.3f} ms, GPU busy {r.get('gpu_busy_ns', 0) / 1e6:.3f} ms, overlap {r.get('overlap_share')}")
    for note in report["notes"]:
        print("note:", note)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
