"""GPU checks of `cudatrace run --power` (issue 13); workloads/power_check.sh runs them all.

Subcommands:
  burst [--seconds 10] [--size 8192] [--idle 2]
      The workload: idle, then a steady burst of large fp16 matmuls (synchronised every
      50), then idle again. Prints its own phase times (CLOCK_MONOTONIC ns, the trace's
      clock) as one JSON line.
  poll [--seconds 8] [--device 0] [--nvml PATH] [--load SECONDS]
      How often NVML's energy counter and power readings change: polls
      nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetPowerUsage and the field
      NVML_FI_DEV_POWER_INSTANT in a tight loop through ctypes (while a matmul burst runs
      in a child process, unless --load 0), and prints the intervals between changes and
      what one call costs, as one JSON line.
  report OUTDIR
      Reads what power_check.sh left in OUTDIR and prints the tables.
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time


def monotonic_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# ---------------------------------------------------------------- burst

def burst(args) -> None:
    import torch

    device = torch.device("cuda")
    torch.cuda.init()
    n = args.size
    a = torch.randn(n, n, device=device, dtype=torch.float16)
    b = torch.randn(n, n, device=device, dtype=torch.float16)
    c = torch.empty(n, n, device=device, dtype=torch.float16)
    torch.matmul(a, b, out=c)  # cuBLAS picks its kernel before the timed part
    torch.cuda.synchronize()
    phases = {"idle_start_ns": monotonic_ns()}
    time.sleep(args.idle)
    phases["burst_start_ns"] = monotonic_ns()
    matmuls = 0
    while monotonic_ns() - phases["burst_start_ns"] < args.seconds * 1e9:
        for _ in range(50):
            torch.matmul(a, b, out=c)
        matmuls += 50
        torch.cuda.synchronize()
    phases["burst_end_ns"] = monotonic_ns()
    time.sleep(args.idle)
    phases["idle_end_ns"] = monotonic_ns()
    phases["matmuls"] = matmuls
    phases["tflops"] = 2 * n ** 3 * matmuls / ((phases["burst_end_ns"] - phases["burst_start_ns"]) / 1e9) / 1e12
    del a, b, c
    torch.cuda.empty_cache()
    print(json.dumps(phases), flush=True)


# ---------------------------------------------------------------- poll

class FieldValue(ctypes.Structure):
    # nvml.h's nvmlFieldValue_t (40 bytes).
    _fields_ = [
        ("fieldId", ctypes.c_uint),
        ("scopeId", ctypes.c_uint),
        ("timestamp", ctypes.c_longlong),
        ("latencyUsec", ctypes.c_longlong),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_ulonglong),
    ]


FI_DEV_POWER_INSTANT = 186


def load_nvml(path):
    candidates = [path] if path else ["libnvidia-ml.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1"]
    for candidate in candidates:
        try:
            nvml = ctypes.CDLL(candidate)
        except OSError:
            continue
        if nvml.nvmlInit_v2() == 0:
            return nvml
    sys.exit(f"power_check: cannot load and start NVML from {candidates}")


def intervals(changes):
    gaps = [(b - a) / 1e6 for a, b in zip(changes, changes[1:])]
    if len(gaps) < 3:
        return {"changes": len(changes), "median_ms": None, "p10_ms": None, "p90_ms": None}
    gaps.sort()
    return {
        "changes": len(changes),
        "median_ms": statistics.median(gaps),
        "p10_ms": gaps[len(gaps) // 10],
        "p90_ms": gaps[len(gaps) * 9 // 10],
    }


def poll(args) -> None:
    nvml = load_nvml(args.nvml)
    handle = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByIndex_v2(args.device, ctypes.byref(handle)) != 0:
        sys.exit(f"power_check: no NVML device {args.device}")
    load = None
    if args.load > 0:
        load = subprocess.Popen(
            [sys.executable, __file__, "burst", "--seconds", str(args.load), "--idle", "0"],
            stdout=subprocess.DEVNULL,
        )
        time.sleep(3)  # past CUDA's start-up, into the burst
    energy, power = ctypes.c_ulonglong(), ctypes.c_uint()
    field = FieldValue(fieldId=FI_DEV_POWER_INSTANT)
    last = {"energy": None, "power": None, "instant": None}
    changes = {"energy": [], "power": [], "instant": []}
    cost = {"energy": [], "power": [], "instant": []}
    end = monotonic_ns() + args.seconds * 1e9
    while monotonic_ns() < end:
        for name in ("energy", "power", "instant"):
            t0 = monotonic_ns()
            if name == "energy":
                rc = nvml.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(energy))
                value = energy.value
            elif name == "power":
                rc = nvml.nvmlDeviceGetPowerUsage(handle, ctypes.byref(power))
                value = power.value
            else:
                rc = nvml.nvmlDeviceGetFieldValues(handle, 1, ctypes.byref(field))
                rc = rc or field.nvmlReturn
                value = field.value & 0xFFFFFFFF
            t1 = monotonic_ns()
            cost[name].append(t1 - t0)
            if rc != 0:
                continue
            if value != last[name]:
                if last[name] is not None:
                    changes[name].append(t1)
                last[name] = value
    if load is not None:
        load.wait()
    result = {
        name: {**intervals(changes[name]), "call_us_median": statistics.median(cost[name]) / 1e3 if cost[name] else None}
        for name in changes
    }
    result["seconds"] = args.seconds
    result["under_load"] = args.load > 0
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- report

def lines_of(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def interpolate(points, t):
    """Linear interpolation of [(ts, value)] at t, clamped."""
    if not points:
        return None
    if t <= points[0][0]:
        return points[0][1]
    if t >= points[-1][0]:
        return points[-1][1]
    lo, hi = 0, len(points) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if points[mid][0] <= t:
            lo = mid
        else:
            hi = mid
    (t0, v0), (t1, v1) = points[lo], points[hi]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1


def trapezoid(points, start, end):
    """∫ power dt (points: [(ts, mW)]) over [start, end], in J."""
    total = 0.0
    for (t0, p0), (t1, p1) in zip(points, points[1:]):
        a, b = max(t0, start), min(t1, end)
        if b <= a:
            continue
        pa = p0 + (p1 - p0) * (a - t0) / (t1 - t0)
        pb = p0 + (p1 - p0) * (b - t0) / (t1 - t0)
        total += (pa + pb) / 2 * (b - a) / 1e12
    return total


def series(trace, device, field):
    return [(l["ts_ns"], l[field]) for l in trace if l["type"] == "power" and l["device"] == device and field in l]


def summary(out, name):
    path = os.path.join(out, f"{name}.summary.json")
    return json.load(open(path)) if os.path.exists(path) else None


def row(cells, widths):
    return "  " + " ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def report(args) -> None:
    out = args.outdir
    print(open(os.path.join(out, "machine.txt")).read().strip())

    print("\n== 1. Steady matmul burst: the energy counter vs integrated power (agree within 5%?)")
    trace = lines_of(os.path.join(out, "burst.jsonl"))
    phases = json.load(open(os.path.join(out, "burst.phases.json")))
    header = trace[0]["power"]
    widths = [24, 12, 14, 9, 14, 9]
    print(row(["window (GPU 0)", "counter J", "instant ∫ J", "diff %", "1 s avg ∫ J", "diff %"], widths))
    energy = series(trace, 0, "energy_mj")
    instant = series(trace, 0, "power_instant_mw")
    average = series(trace, 0, "power_mw")
    windows = [
        ("whole run (samples)", energy[0][0], energy[-1][0]),
        ("burst", phases["burst_start_ns"], phases["burst_end_ns"]),
        ("idle before the burst", phases["idle_start_ns"], phases["burst_start_ns"]),
    ]
    verdicts = []
    for label, start, end in windows:
        counter = (interpolate(energy, end) - interpolate(energy, start)) / 1e3
        by_instant = trapezoid(instant, start, end) if instant else float("nan")
        by_average = trapezoid(average, start, end)
        diff_i = (by_instant - counter) / counter * 100 if counter else float("nan")
        diff_a = (by_average - counter) / counter * 100 if counter else float("nan")
        print(row([label, f"{counter:.2f}", f"{by_instant:.2f}", f"{diff_i:+.2f}", f"{by_average:.2f}", f"{diff_a:+.2f}"], widths))
        if label == "burst":
            verdicts.append(abs(diff_i) <= 5)
    s = summary(out, "burst")
    d = s["power"]["devices"][0]
    print(f"  summary: {d['energy_j']:.2f} J from the {d['energy_source']}, {d['integrated_j']:.2f} J integrated; "
          f"mean {d['mean_w']:.1f} W, peak {d['peak_w']:.1f} W, limit {d.get('power_limit_w')} W; "
          f"{phases['matmuls']} matmuls at {phases['tflops']:.0f} TFLOP/s")
    print(f"  counter vs instant power over the burst within 5%: {'YES' if all(verdicts) else 'NO'}")

    print("\n== 2. Energy per stage adds up (counter, interpolated at the boundaries)")
    widths = [18, 8, 16, 22, 10]
    print(row(["trace", "stages", "sum of stages J", "counter over calls J", "diff mJ"], widths))
    for name in ("burst", "gpt2", "mlp"):
        s = summary(out, name)
        if not s:
            continue
        trace = lines_of(os.path.join(out, f"{name}.jsonl"))
        for process in s["power"]["stages"]:
            stages = process["stages"]
            total = sum(st["energy_j"] for st in stages)
            start = stages[0]["start_ns"]
            end = stages[-1]["start_ns"] + stages[-1]["duration_ns"]
            counter = sum(
                (interpolate(series(trace, d["index"], "energy_mj"), end)
                 - interpolate(series(trace, d["index"], "energy_mj"), start)) / 1e3
                for d in s["power"]["devices"] if d["energy_source"] == "counter"
            )
            print(row([f"{name} pid {process['pid']}", len(stages), f"{total:.3f}", f"{counter:.3f}",
                       f"{(total - counter) * 1e3:+.1f}"], widths))

    print("\n== 3. Idle and busy power, GPT-2 (workloads/transformer_inference.py --tokens 200)")
    s = summary(out, "gpt2")
    idle = s["power"].get("before_first_launch")
    if idle:
        print(f"  before the first launch: {idle['mean_w']:.1f} W over {idle['duration_ns'] / 1e6:.0f} ms")
    widths = [20, 12, 12, 10]
    print(row(["stage", "duration ms", "energy J", "mean W"], widths))
    for stage in s["power"]["stages"][0]["stages"]:
        print(row([stage["name"], f"{stage['duration_ns'] / 1e6:.1f}", f"{stage['energy_j']:.3f}", f"{stage['mean_w']:.1f}"], widths))
    d = s["power"]["devices"][0]
    print(f"  GPU 0: mean {d['mean_w']:.1f} W, peak {d['peak_w']:.1f} W; the picture: gpt2.png")

    print("\n== 4. Sampling cost on the launch loop (x.add_(1), median µs per launch, interleaved rounds)")
    runs = {}
    for line in open(os.path.join(out, "loop.txt")):
        name, _, payload = line.partition(" ")
        runs.setdefault(name, []).append(json.loads(payload)["us_per_iter_median"])
    base = statistics.median(runs["untraced"])
    widths = [28, 8, 8, 40]
    print(row(["condition", "median", "ratio", "rounds"], widths))
    for name, values in runs.items():
        med = statistics.median(values)
        print(row([name, f"{med:.2f}", f"x{med / base:.3f}", " ".join(f"{v:.2f}" for v in values)], widths))
    traced, sampled = statistics.median(runs["cudatrace"]), statistics.median(runs["cudatrace_power10"])
    print(f"  --power=10 vs none: {(sampled / traced - 1) * 100:+.2f}% (round-to-round spread of cudatrace: "
          f"{(max(runs['cudatrace']) - min(runs['cudatrace'])) / traced * 100:.1f}%)")

    print("\n== 5. How often NVML's readings change (tight ctypes polling, matmul burst running)")
    poll_result = json.load(open(os.path.join(out, "poll.json")))
    widths = [34, 8, 10, 8, 8, 12]
    print(row(["reading", "changes", "median ms", "p10", "p90", "call µs"], widths))
    for name, label in [("energy", "nvmlDeviceGetTotalEnergyConsumption"),
                        ("power", "nvmlDeviceGetPowerUsage (1 s avg)"),
                        ("instant", "NVML_FI_DEV_POWER_INSTANT")]:
        r = poll_result[name]
        fmt = lambda v: "-" if v is None else f"{v:.2f}"
        print(row([label, r["changes"], fmt(r["median_ms"]), fmt(r["p10_ms"]), fmt(r["p90_ms"]), fmt(r["call_us_median"])], widths))

    print("\n== 6. Energy per kernel name (top 8 of each)")
    for name in ("mlp", "gpt2", "mlp_gpu", "gpt2_gpu"):
        s = summary(out, name)
        if not s:
            if name.endswith("_gpu"):
                print(f"  {name}: not run (this cudatrace has no --gpu)")
            continue
        kernels = s["power"]["kernels"]
        print(f"  {name}: {kernels['method']}; outside any window {kernels.get('outside_windows_j', 0):.3f} J "
              f"of {s['power']['energy_j']:.3f} J")
        for d in kernels.get("devices", []):
            print(f"    CUDA device {d['cuda_device']} = NVML GPU {d.get('nvml_index', '?')}: {d['how']}")
        for k in kernels["kernels"][:8]:
            print(f"    {k['energy_j']:9.4f} J {k['share'] * 100:5.1f}% {k['launches']:6} launches  {k['kernel'][:90]}")

    print("\n== 7. The sampler: reads per sample, ticks kept")
    widths = [10, 9, 14, 12, 10, 10, 8]
    print(row(["trace", "samples", "read µs mean", "read µs max", "skipped", "dropped", "errors"], widths))
    for name in ("burst", "gpt2", "mlp", "period1"):
        path = os.path.join(out, f"{name}.jsonl")
        if not os.path.exists(path):
            continue
        footer = lines_of(path)[-1].get("power", {})
        print(row([name, footer.get("samples"), f"{footer.get('read_ns_mean', 0) / 1e3:.1f}",
                   f"{footer.get('read_ns_max', 0) / 1e3:.1f}", footer.get("skipped_ticks"),
                   footer.get("dropped_samples"), sum(footer.get("read_errors", {}).values())], widths))
    trace = lines_of(os.path.join(out, "period1.jsonl"))
    energy = series(trace, 0, "energy_mj")
    changes = [t for (t, e), (_, e0) in zip(energy[1:], energy) if e != e0]
    gaps = sorted((b - a) / 1e6 for a, b in zip(changes, changes[1:]))
    if len(gaps) > 3:
        print(f"  --power=1 on the burst: the counter changed {len(changes)} times in {len(energy)} samples; "
              f"median {statistics.median(gaps):.1f} ms between changes (p10 {gaps[len(gaps) // 10]:.1f}, "
              f"p90 {gaps[len(gaps) * 9 // 10]:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("burst")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--size", type=int, default=8192)
    p.add_argument("--idle", type=float, default=2)
    p = sub.add_parser("poll")
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--nvml")
    p.add_argument("--load", type=float, default=14, help="seconds of matmul burst in a child (0: none)")
    p = sub.add_parser("report")
    p.add_argument("outdir")
    args = parser.parse_args()
    {"burst": burst, "poll": poll, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
