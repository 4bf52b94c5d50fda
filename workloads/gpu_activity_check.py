"""Checks a `cudatrace run --gpu` trace (no PyTorch needed).

  python3 gpu_activity_check.py TRACE.jsonl [--events EVENTS.json] [--name NAME] [--json OUT]

Kernels against launches (issue 11's validation 1):
  - kernel lines == successful launch calls (cuLaunchKernel*, cuLaunchCooperativeKernel*,
    cuLaunch, cuLaunchGrid*; not cuGraphLaunch, whose kernels share one call);
  - every kernel line is linked (call_tid, call_ts_ns) to a call line of its process that
    is a launch, and no launch call has two kernels;
  - the same for copies and memsets (linked to a copy or memset call);
  - nothing lost, no gpu_error line.
With --events (workloads/matmul_events.py's output), durations against CUDA events
(validation 2): the last 2*iters cuEventRecord calls of the process that printed them
pair up as (start, end) of each timed matmul; the GPU time of the kernels launched
between them (first start to last end) must agree with the event's elapsed time within
2% or 5 us, whichever is larger.

Prints `ok`/`FAIL` lines and one summary row; exits 1 on any FAIL.
"""

import argparse
import collections
import json
import statistics
import sys

LAUNCH_PREFIXES = ("cuLaunchKernel", "cuLaunchCooperativeKernel", "cuLaunchGrid")
WORK_TYPES = ("gpu_kernel", "gpu_copy", "gpu_memset")


def is_launch(name):
    return name.startswith(LAUNCH_PREFIXES) or name == "cuLaunch"


def is_copy(name):
    return name.startswith("cuMemcpy")


def is_memset(name):
    return name.startswith("cuMemset")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--events", help="matmul_events.py's JSON output")
    parser.add_argument("--name", default="", help="a label for the summary row")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    calls = {}  # (pid, tid, ts) -> call line
    launches_ok = 0
    work = collections.defaultdict(list)
    errors, infos, lost = [], [], collections.Counter()
    footer = {}
    with open(args.trace) as f:
        for line in f:
            line = json.loads(line)
            kind = line["type"]
            if kind == "call":
                calls[(line["pid"], line["tid"], line["ts_ns"])] = line
                if line.get("ret", 0) == 0 and is_launch(line["name"]):  # no ret: --launch-entry-only
                    launches_ok += 1
            elif kind in WORK_TYPES:
                work[kind].append(line)
            elif kind == "gpu_error":
                errors.append(line)
            elif kind == "gpu_info":
                infos.append(line)
            elif kind == "lost":
                lost[line["reason"]] += line["count"]
            elif kind == "footer":
                footer = line

    failures = []

    def check(ok, text):
        print(f"{'ok  ' if ok else 'FAIL'} {text}")
        if not ok:
            failures.append(text)

    for info in infos:
        print(f"info: pid {info['pid']}: CUPTI {info['cupti_version']}, {info['libcupti']}, "
              f"times {info['clock']}")
    for error in errors:
        print(f"error: pid {error['pid']} ({error['stage']}, fatal {error['fatal']}): "
              f"{error['message']}")
    check(not errors, f"{len(errors)} gpu_error lines")
    check(bool(infos), f"{len(infos)} processes started GPU recording")
    check(sum(lost.values()) == 0, f"lost: {dict(lost) or 0}")

    kernels = work["gpu_kernel"]
    check(len(kernels) == launches_ok,
          f"kernel lines {len(kernels)} == successful launch calls {launches_ok}")
    figures = {"name": args.name, "launches": launches_ok}
    for kind, accepts in (("gpu_kernel", is_launch), ("gpu_copy", is_copy),
                          ("gpu_memset", is_memset)):
        lines = work[kind]
        per_call = collections.Counter()
        unlinked = collections.Counter()
        wrong = 0
        for w in lines:
            if "call_tid" not in w:
                unlinked[w.get("unlinked", "?")] += 1
                continue
            call = calls.get((w["pid"], w["call_tid"], w["call_ts_ns"]))
            if call is None or not accepts(call["name"]):
                wrong += 1
                continue
            per_call[(w["pid"], w["call_tid"], w["call_ts_ns"])] += 1
        shared = sum(1 for n in per_call.values() if n > 1)
        check(not unlinked and wrong == 0 and shared == 0,
              f"{kind}: {len(lines)} lines, {sum(per_call.values())} linked to one call each; "
              f"unlinked {dict(unlinked) or 0}, linked to no such call {wrong}, "
              f"calls with several {shared}")
        figures[kind] = len(lines)
        figures[f"{kind}_unlinked"] = sum(unlinked.values())
    queued = [w["queued_ns"] for w in kernels if "queued_ns" in w]
    if queued:
        queued.sort()
        figures["queued_p50_us"] = queued[len(queued) // 2] / 1e3
        figures["queued_p99_us"] = queued[min(len(queued) - 1, len(queued) * 99 // 100)] / 1e3
        print(f"launch end -> kernel start: p50 {figures['queued_p50_us']:.1f} us, "
              f"p99 {figures['queued_p99_us']:.1f} us, "
              f"{sum(1 for q in queued if q < 0)} negative")
    gpu = footer.get("gpu", {})
    print(f"footer gpu: {json.dumps(gpu)}")

    if args.events:
        with open(args.events) as f:
            events = json.loads(f.read().strip().splitlines()[-1])
        event_ms = events["event_ms"]
        records = sorted((c for c in calls.values()
                          if c["name"].startswith("cuEventRecord") and c["ret"] == 0),
                         key=lambda c: c["ts_ns"])
        records = records[-2 * len(event_ms):]
        by_call = collections.defaultdict(list)
        for k in kernels:
            if "call_tid" in k:
                by_call[(k["pid"], k["call_tid"], k["call_ts_ns"])].append(k)
        launch_calls = sorted((key for key in by_call), key=lambda key: key[2])
        rows = []
        for i, ms in enumerate(event_ms):
            start, end = records[2 * i], records[2 * i + 1]
            inside = [k for key in launch_calls
                      if key[0] == start["pid"] and key[1] == start["tid"]
                      and start["ts_ns"] < key[2] < end["ts_ns"]
                      for k in by_call[key]]
            if not inside:
                rows.append((i, ms * 1e6, None, 0))
                continue
            first = min(k["ts_ns"] for k in inside)
            last = max(k["ts_ns"] + k["dur_ns"] for k in inside)
            rows.append((i, ms * 1e6, last - first, len(inside)))
        bad = []
        diffs = []
        for i, event_ns, gpu_ns, n in rows:
            if gpu_ns is None:
                bad.append(f"matmul {i}: no kernel between its events")
                continue
            allowed = max(0.02 * event_ns, 5_000)
            diffs.append(gpu_ns - event_ns)
            if abs(gpu_ns - event_ns) > allowed:
                bad.append(f"matmul {i}: events {event_ns / 1e3:.1f} us, cudatrace "
                           f"{gpu_ns / 1e3:.1f} us ({n} kernels)")
        for text in bad[:10]:
            print(f"     {text}")
        kernels_each = sorted({n for *_, n in rows})
        check(not bad,
              f"durations: {len(rows) - len(bad)} of {len(rows)} matmuls within 2% or 5 us of "
              f"their CUDA events (size {events['size']}, kernels per matmul {kernels_each})")
        if diffs:
            event_med = statistics.median(r[1] for r in rows)
            figures.update({
                "matmul_size": events["size"],
                "matmuls": len(rows),
                "matmuls_within": len(rows) - len(bad),
                "event_median_us": event_med / 1e3,
                "diff_median_us": statistics.median(diffs) / 1e3,
                "diff_max_abs_us": max(abs(d) for d in diffs) / 1e3,
            })
            print(f"event median {event_med / 1e3:.1f} us; cudatrace - event: median "
                  f"{figures['diff_median_us']:+.2f} us, max |diff| "
                  f"{figures['diff_max_abs_us']:.2f} us")

    figures["ok"] = not failures
    print("row: " + json.dumps(figures))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
