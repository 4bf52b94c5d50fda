"""Checks one `cudatrace run -p PID --gpu --stacks --duration 5s` of workloads/attach_gpu.sh.

    python3 attach_check.py NAME TRACE ITERS STDERR TIMES

TRACE is cudatrace's trace, ITERS the target's per-iteration lines (attach_target.py),
STDERR cudatrace's stderr, TIMES "command_start_ns command_end_ns" (CLOCK_MONOTONIC around
the cudatrace command). Prints one markdown table row and exits 1 if a check failed:

- kernels = launches in the window: every launch line of the window has a kernel
  (footer gpu.issuing: with_work + not_recorded = calls, missing/not_flushed/no_api_record 0),
  every kernel line is linked (call_ts_ns set), CUPTI dropped nothing;
- stacks: launch lines carry a Python stack (`stack` or `py_stack` field) -- counted, not
  required (the share is printed);
- iteration time before / during / after the window (medians, ms), after within 10% of
  before (the target: x1.00; noise on this host is larger, so the row says the ratio);
- attach latency: command start to the first GPU record (gpu_info ts), <= 1 s;
- detach latency: window end to the command's end, <= 1 s;
- the target's longest pause: the stop the attach line reports (thread stopped N us), and
  the longest iteration during the window minus the median before, <= 50 ms.
"""

import json
import re
import statistics
import sys


def main():
    name, trace_path, iters_path, stderr_path, times = sys.argv[1:6]
    command_start, command_end = (int(v) for v in times.split())
    lines = [json.loads(line) for line in open(trace_path)]
    header, footer = lines[0], lines[-1]
    window = header.get("window") or {}
    start, end = window.get("start_monotonic_ns", 0), window.get("end_monotonic_ns", 0)
    failed = []
    gpu = footer.get("gpu", {})
    issuing = gpu.get("issuing", {})
    if issuing.get("with_work", 0) + issuing.get("not_recorded", 0) != issuing.get("calls", -1):
        failed.append(f"accounting {issuing}")
    for reason in ("missing", "not_flushed", "no_api_record", "cupti_held"):
        if issuing.get(reason, 0):
            failed.append(f"{reason} {issuing[reason]}")
    if footer.get("lost", {}).get("cupti_dropped", 0):
        failed.append("cupti dropped records")
    kernels = [l for l in lines if l.get("type") == "gpu_kernel"]
    unlinked = [k for k in kernels if "call_ts_ns" not in k]
    if unlinked:
        failed.append(f"{len(unlinked)} kernels unlinked")
    launches = [
        l for l in lines
        if l.get("type") == "call" and str(l.get("name", "")).startswith("cuLaunchKernel")
    ]
    with_stack = sum(1 for l in launches if "stack" in l or "py_stack" in l)
    infos = [l for l in lines if l.get("type") == "gpu_info"]
    attach_ms = (infos[0]["ts_ns"] - command_start) / 1e6 if infos else float("inf")
    detach_ms = (command_end - end) / 1e6 if end else float("inf")
    if attach_ms > 1000:
        failed.append(f"attach {attach_ms:.0f} ms")
    if detach_ms > 1000:
        failed.append(f"detach {detach_ms:.0f} ms")
    said = open(stderr_path).read()
    stopped = re.search(r"stopped (\d+) µs", said)
    stopped_us = int(stopped.group(1)) if stopped else -1
    iters = [json.loads(line) for line in open(iters_path)]
    before = [i["dt_ns"] for i in iters if i["t_ns"] < command_start]
    during = [i["dt_ns"] for i in iters if start <= i["t_ns"] <= end]
    after = [i["dt_ns"] for i in iters if i["t_ns"] > command_end + 1_000_000_000]
    med = lambda v: statistics.median(v) / 1e6 if v else float("nan")  # noqa: E731
    pause_ms = (max(during) / 1e6 - med(before)) if during and before else float("nan")
    if not (pause_ms <= 50):
        failed.append(f"longest pause {pause_ms:.1f} ms")
    ratio = med(after) / med(before) if before and after else float("nan")
    print(
        f"| {name} | {len(launches)} | {len(kernels)} | {issuing.get('not_recorded')} | "
        f"{with_stack} | {med(before):.3f} | {med(during):.3f} | {med(after):.3f} | "
        f"x{ratio:.2f} | {attach_ms:.0f} | {detach_ms:.0f} | {stopped_us} | {pause_ms:.1f} | "
        f"{'ok' if not failed else 'FAIL: ' + '; '.join(failed)} |"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
