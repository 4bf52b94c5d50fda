"""Reads the traces of workloads/stacks_edges_gpu.sh (OUTDIR/{gpu,every2,rate50,
durations}.jsonl) and prints: each --gpu run's footer `gpu` links and `stacks` counts, and
for the --stack-every 2 run without --gpu, per function, the median duration of the calls
walked and of those sampled out. Exits 1 when a stacked run's `gpu.unlinked` differs from
the plain --gpu run's, or a trace has no footer.

usage: stacks_edges_check.py OUTDIR
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def footer(path):
    last = None
    with open(path) as lines:
        for line in lines:
            last = line
    value = json.loads(last) if last else {}
    return value if value.get("type") == "footer" else None


def main():
    out = Path(sys.argv[1])
    status = 0
    footers = {name: footer(out / f"{name}.jsonl") for name in ("gpu", "every2", "rate50")}
    for name, value in footers.items():
        if value is None:
            print(f"{name}: no footer")
            status = 1
            continue
        gpu = value.get("gpu", {})
        stacks = value.get("stacks", {})
        print(
            f"{name}: gpu linked {gpu.get('linked')} unlinked {json.dumps(gpu.get('unlinked'))}; "
            f"stacks calls {stacks.get('calls')} without "
            f"{json.dumps({k: v for k, v in stacks.get('without', {}).items() if v})}"
        )
    if footers["gpu"] is not None:
        for name in ("every2", "rate50"):
            if footers[name] is not None and footers[name].get("gpu", {}).get(
                "unlinked"
            ) != footers["gpu"].get("gpu", {}).get("unlinked"):
                print(f"{name}: unlinked differs from the plain --gpu run's")
                status = 1

    durations = defaultdict(lambda: ([], []))
    with open(out / "durations.jsonl") as lines:
        for line in lines:
            call = json.loads(line)
            if call.get("type") != "call" or "dur_ns" not in call:
                continue
            walked, skipped = durations[call["name"]]
            (walked if "stack" in call else skipped).append(call["dur_ns"])
    print("durations, --stacks --stack-every 2 (median ns: walked, sampled out or unstacked):")
    for name, (walked, skipped) in sorted(durations.items()):
        if len(walked) >= 20 and len(skipped) >= 20:
            print(
                f"  {name}: {statistics.median(walked):.0f} ({len(walked)}), "
                f"{statistics.median(skipped):.0f} ({len(skipped)})"
            )
    return status


sys.exit(main())
