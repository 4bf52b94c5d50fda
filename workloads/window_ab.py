"""The table of workloads/window_ab.sh: each traced window's iterations against the untraced
stretches just before and after it, in one process.

usage: window_ab.py WINDOWS.txt ITERS.jsonl MODE

WINDOWS.txt: one line per window, "ROUND CONDITION START_NS END_NS TRACE" (CLOCK_MONOTONIC
around the `cudatrace run -p` command). ITERS.jsonl: the target's iterations, {"t_ns" (its
end), "dt_ns"}. An iteration is traced when it lies between the window's first and last
call line (the probes were attached throughout); untraced when it lies more than 0.2 s from
every command's span. A window's baseline is the untraced iterations of the stretch before
it and the stretch after it (each the median of its own), averaged. Per condition: the
median of the windows' ratios (traced median over baseline), and the added time per
iteration (traced median less baseline); in launch mode also per launch (200 an
iteration). Where the target wrote them (attach_target.py does), the same for what the
iteration's thread used: its CPU time ("cpu_ns": the probes' traps and programs are the
thread's system time), minor faults and context switches, so that time the thread spent
elsewhere (waiting, or slowed without using more CPU) can be told from time it ran. Exits 1
if a window has no traced iteration or no baseline. Where window_ab.sh timed the tracer
(r*.time beside each trace: real, user and system seconds), the CPUs it used.
"""

import json
import statistics
import sys

MARGIN_NS = 200_000_000
LAUNCHES = {"launch": 200}
# What an iteration's thread used, where the target writes it: (field, unit, divisor).
USAGE = [("cpu_ns", "µs of thread CPU", 1000), ("minflt", "minor faults", 1),
         ("nvcsw", "voluntary switches", 1), ("nivcsw", "involuntary switches", 1)]


def footer_of(trace):
    """The trace's footer (its last line), or {} where it has none."""
    last = None
    for last in open(trace):
        pass
    try:
        line = json.loads(last) if last else {}
    except json.JSONDecodeError:
        return {}
    return line if line.get("type") == "footer" else {}


def main() -> int:
    windows_path, iters_path, mode = sys.argv[1:4]
    windows = []
    reads = {}
    tracer_cpu = {}
    for line in open(windows_path):
        round_, condition, start, end, trace = line.split()
        calls = [
            json.loads(text)["ts_ns"]
            for text in open(trace)
            if '"type":"call"' in text
        ]
        windows.append((int(round_), condition, int(start), int(end), calls))
        timing = trace.removesuffix(".jsonl") + ".time"
        try:
            real, user, system = (float(x) for x in open(timing).read().split()[:3])
            tracer_cpu.setdefault(condition, []).append((user + system) / real)
        except (OSError, ValueError):
            pass
        stacks = footer_of(trace).get("stacks", {})
        if stacks.get("memory_reads") and calls:
            reads.setdefault(condition, []).append(
                (stacks["memory_reads"] / len(calls), stacks.get("memory_read_bytes", 0) / len(calls))
            )
    iters = [json.loads(line) for line in open(iters_path)]
    spans = [(it["t_ns"] - it["dt_ns"], it["t_ns"], it) for it in iters]
    busy = [(start - MARGIN_NS, end + MARGIN_NS) for _, _, start, end, _ in windows]
    usage = [field for field, _, _ in USAGE if iters and field in iters[0]]

    def untraced(lo, hi):
        return [
            it
            for begin, end, it in spans
            if lo <= begin
            and end <= hi
            and not any(b < end and begin < e for b, e in busy)
        ]

    rows, status = {}, 0
    for index, (round_, condition, start, end, calls) in enumerate(windows):
        if not calls:
            print(f"round {round_} {condition}: no call line in the trace", file=sys.stderr)
            status = 1
            continue
        first, last = min(calls), max(calls)
        traced = [it for begin, stop, it in spans if first <= begin and stop <= last]
        before_lo = windows[index - 1][3] if index > 0 else 0
        after_hi = windows[index + 1][2] if index + 1 < len(windows) else 1 << 62
        sides = [side for side in (untraced(before_lo, start), untraced(end, after_hi)) if side]
        if not traced or not sides:
            print(f"round {round_} {condition}: {len(traced)} traced iterations, "
                  f"{len(sides)} untraced stretches", file=sys.stderr)
            status = 1
            continue
        base = statistics.mean(statistics.median(it["dt_ns"] for it in side) for side in sides)
        med = statistics.median(it["dt_ns"] for it in traced)
        used = {}
        for field in usage:
            # Means, not medians: faults and switches are mostly 0 an iteration.
            traced_mean = statistics.mean(it[field] for it in traced)
            base_mean = statistics.mean(
                statistics.mean(it[field] for it in side) for side in sides
            )
            used[field] = (traced_mean, base_mean)
        rows.setdefault(condition, []).append(
            (round_, med / base, med - base, len(traced), base, used)
        )
    per = LAUNCHES.get(mode)
    for condition, results in rows.items():
        ratios = [r[1] for r in results]
        added = [r[2] / 1000 for r in results]
        print(f"{mode} {condition}: x{statistics.median(ratios):.3f} of untraced "
              f"(median of {len(results)} windows' ratios; each window's median iteration "
              f"against the untraced stretches beside it) {[round(r, 3) for r in ratios]}")
        print(f"{mode} {condition}: +{statistics.median(added):.1f} µs an iteration (median) "
              f"{[round(a, 1) for a in added]}; untraced iteration "
              f"{statistics.median(r[4] for r in results) / 1000:.1f} µs; "
              f"{sum(r[3] for r in results)} traced iterations")
        if per:
            print(f"{mode} {condition}: +{statistics.median(added) / per:.3f} µs a launch")
        for field, unit, divisor in USAGE:
            if field not in usage:
                continue
            traced_values = [r[5][field][0] / divisor for r in results]
            deltas = [(r[5][field][0] - r[5][field][1]) / divisor for r in results]
            print(f"{mode} {condition}: {unit} an iteration (mean) "
                  f"{statistics.median(traced_values):.2f}, "
                  f"{statistics.median(deltas):+.2f} against untraced (median of windows) "
                  f"{[round(d, 2) for d in deltas]}")
        if condition in tracer_cpu:
            print(f"{mode} {condition}: the tracer used "
                  f"{statistics.median(tracer_cpu[condition]):.3f} CPUs over its command "
                  f"(user and system time over real, median of windows)")
        if condition in reads:
            print(f"{mode} {condition}: {statistics.median(r for r, _ in reads[condition]):.2f} "
                  f"reads of process memory a call, "
                  f"{statistics.median(b for _, b in reads[condition]):.0f} bytes (the footer's "
                  f"stacks.memory_reads and memory_read_bytes, medians of windows)")
    if "run" in rows and "stacks" in rows and per:
        by_round = {r[0]: r[2] for r in rows["run"]}
        diff = [(r[2] - by_round[r[0]]) / 1000 / per for r in rows["stacks"] if r[0] in by_round]
        print(f"{mode} stacks against run: +{statistics.median(diff):.3f} µs a launch (median of "
              f"{len(diff)} rounds) {[round(d, 3) for d in diff]}")
    for base in [c for c in rows if c.endswith("_base") and c.removesuffix("_base") in rows]:
        # Another build's windows (window_ab.sh's run_base, stacks_base) against this one's,
        # round by round: each against its own untraced stretches.
        condition = base.removesuffix("_base")
        by_round = {r[0]: r[2] for r in rows[base]}
        diff = [(r[2] - by_round[r[0]]) / 1000 for r in rows[condition] if r[0] in by_round]
        print(f"{mode} {condition} against {base}: {statistics.median(diff):+.1f} µs an "
              f"iteration (median of {len(diff)} rounds' differences) "
              f"{[round(d, 1) for d in diff]}")
    return status


if __name__ == "__main__":
    sys.exit(main())
