"""Compares `cudatrace summary --json`'s GPU time by layer (a `run --gpu --stacks` trace)
with torch.profiler's module hierarchy for the same workload (layers_reference.py's JSON),
and checks that the layers' GPU time adds up to the kernels' (workloads/layers_gpu.sh,
issue 23).

Prints one row per layer: kernels and GPU time by each, and each one's share of its own
total (the two ran separately, so times differ by run-to-run variation; kernel counts
should not). Exit 0 when the layers' GPU time equals the kernels' exactly and every layer
has the same number of kernels in both; 1 otherwise.

usage: python3 layers_check.py SUMMARY.json REFERENCE.json
"""

import json
import sys


def main():
    summary = json.load(open(sys.argv[1]))
    reference = json.load(open(sys.argv[2]))
    stacks = summary["stacks"]
    kernels_ns = sum(k["total_ns"] for k in summary["gpu"]["kernel_time"])
    kernels_n = sum(k["count"] for k in summary["gpu"]["kernel_time"])
    layers_ns = sum(row["gpu_ns"] for row in stacks["layers"])
    layers_n = sum(row["gpu_kernels"] for row in stacks["layers"])
    ok = True
    print(f"cudatrace: {kernels_n} kernels, {kernels_ns / 1e6:.3f} ms of GPU time; "
          f"layers: {layers_n} kernels, {layers_ns / 1e6:.3f} ms")
    if (layers_n, layers_ns) != (kernels_n, kernels_ns):
        print("FAIL: the layers do not add up to the kernels")
        ok = False
    print(f"kernels without a call: {stacks['kernels_without_call']}, calls without a "
          f"stack: {stacks['kernels_call_without_stack']}")
    print(f"torch.profiler: {reference['kernels']} kernels, {reference['gpu_ns'] / 1e6:.3f} ms; "
          f"{reference['kernels_without_launch']} without their launch")

    ours = {row["name"]: (row["gpu_kernels"], row["gpu_ns"]) for row in stacks["layers"]}
    theirs = {name: tuple(v) for name, v in reference["layers"].items()}
    # The rows cudatrace has but the profiler files elsewhere.
    if "(no stack)" in ours and "(no stack)" not in theirs:
        theirs["(no stack)"] = (0, 0)
    names = sorted(set(ours) | set(theirs), key=lambda n: -ours.get(n, (0, 0))[1])
    print(f"{'layer':28} {'kernels':>8} {'GPU ms':>9} {'share':>7} | {'profiler':>8} "
          f"{'GPU ms':>9} {'share':>7}")
    for name in names:
        a, b = ours.get(name, (0, 0)), theirs.get(name, (0, 0))
        mark = "" if a[0] == b[0] else "  <- kernels differ"
        if a[0] != b[0]:
            ok = False
        print(f"{name:28} {a[0]:8} {a[1] / 1e6:9.3f} {a[1] / max(layers_ns, 1):7.1%} | "
              f"{b[0]:8} {b[1] / 1e6:9.3f} {b[1] / max(reference['gpu_ns'], 1):7.1%}{mark}")
    print("OK" if ok else "DIFFERENT")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
