#!/usr/bin/env python3
"""Checks a `cudatrace run --launch-entry-only` trace against a full trace of the same
workload (issue 16, item 3). Exit 0 when every check passes, 1 otherwise.

    launch_entry_only_check.py FULL.jsonl LEAN.jsonl

Checks, with exact values:
- LEAN's header says `launch_entry_only: true`; FULL's does not;
- every launch line of LEAN (cuLaunchKernel*, cuLaunchCooperativeKernel*, cuGraphLaunch*)
  has no `ret` and no `dur_ns`, and every other call line has both;
- every launch line of FULL has both;
- both traces have the same number of launches per kernel name (the workload is
  deterministic), and 0 lost events;
- when the traces have `gpu_kernel` lines (--gpu): as many kernel lines as launches, each
  linked (`call_ts_ns`) in both traces.
"""
import collections
import json
import sys

LAUNCH_PREFIXES = ("cuLaunchKernel", "cuLaunchCooperativeKernel", "cuGraphLaunch")


def read(path):
    t = {
        "header": None,
        "footer": None,
        "launches": collections.Counter(),
        "launch_untimed": 0,
        "launch_timed": 0,
        "other_untimed": 0,
        "other": 0,
        "gpu_kernels": 0,
        "gpu_linked": 0,
    }
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            kind = d.get("type")
            if kind == "header":
                t["header"] = d
            elif kind == "footer":
                t["footer"] = d
            elif kind == "call":
                timed = "ret" in d and "dur_ns" in d
                if d["name"].startswith(LAUNCH_PREFIXES):
                    t["launches"][d.get("kernel", d["name"])] += 1
                    t["launch_timed" if timed else "launch_untimed"] += 1
                else:
                    t["other"] += 1
                    if not timed:
                        t["other_untimed"] += 1
            elif kind == "gpu_kernel":
                t["gpu_kernels"] += 1
                if "call_ts_ns" in d:
                    t["gpu_linked"] += 1
    return t


def main():
    full, lean = read(sys.argv[1]), read(sys.argv[2])
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    check(lean["header"].get("launch_entry_only") is True, "LEAN header launch_entry_only true")
    check(not full["header"].get("launch_entry_only"), "FULL header without launch_entry_only")
    n_full, n_lean = sum(full["launches"].values()), sum(lean["launches"].values())
    check(lean["launch_timed"] == 0, f"LEAN launches without ret/dur: {lean['launch_untimed']} of {n_lean}")
    check(lean["other_untimed"] == 0, f"LEAN other calls with ret/dur: {lean['other'] - lean['other_untimed']} of {lean['other']}")
    check(full["launch_untimed"] == 0, f"FULL launches with ret/dur: {full['launch_timed']} of {n_full}")
    check(full["launches"] == lean["launches"], f"launches per kernel equal: FULL {n_full}, LEAN {n_lean}, {len(full['launches'])} kernels")
    for name, t in (("FULL", full), ("LEAN", lean)):
        lost = (t["footer"] or {}).get("lost", {})
        total = lost.get("total", 0) if isinstance(lost, dict) else lost
        check(t["footer"] is not None and not total, f"{name} footer present, lost {json.dumps(lost)}")
        if t["gpu_kernels"] or (t["header"] or {}).get("gpu"):
            n = sum(t["launches"].values())
            check(t["gpu_kernels"] == n, f"{name} gpu_kernel lines {t['gpu_kernels']} = launches {n}")
            check(t["gpu_linked"] == t["gpu_kernels"], f"{name} linked {t['gpu_linked']} of {t['gpu_kernels']}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
