#!/usr/bin/env bash
# Program time per call, A/B: cudatrace binaries run in turn on the stand-in bench loop
# (cuLaunchKernel, 1 thread), interleaved round by round, each with CUDATRACE_BPF_STATS=1
# (the kernel's run time and count of each cudatrace program). Usage, as root:
#
#   workloads/bpf_stats_ab.sh STANDIN OUTDIR NAME=CUDATRACE [NAME=CUDATRACE ...]
#
# STANDIN: a folder with the stand-in libcuda.so.1 and cudatrace-bench-loop (`cargo xtask
# bench` builds them into target/standin/). ROUNDS (default 5) and CALLS (default 200000)
# from the environment. Prints one line per run, then per binary the median [min-max] of
# the loop's ns per call (with the statistics on) and of each program's ns per run.
# Every run must trace every call (CALLS + the loop's 1,000 warm-up calls), none lost.
set -uo pipefail
standin=$(realpath "${1:?folder with the stand-in libcuda.so.1 and cudatrace-bench-loop}")
out=$(realpath -m "${2:?output folder}")
shift 2
[ $# -ge 1 ] || { echo "give at least one NAME=CUDATRACE" >&2; exit 2; }
rounds=${ROUNDS:-5}
calls=${CALLS:-200000}
mkdir -p "$out"
rm -f "$out/runs.txt"
for round in $(seq "$rounds"); do
    for spec in "$@"; do
        name=${spec%%=*}
        bin=${spec#*=}
        result=$(CUDATRACE_BPF_STATS=1 "$bin" run -q --missing-probes ignore \
            --libcuda "$standin/libcuda.so.1" -o "$out/$name.jsonl" -- \
            "$standin/cudatrace-bench-loop" "$calls" 0 1 cuLaunchKernel 2>"$out/$name-$round.stderr")
        python3 - "$name" "$round" "$result" "$out/$name.jsonl" "$out/$name-$round.stderr" \
            "$((calls + 1000))" <<'PY' | tee -a "$out/runs.txt"
import json, re, sys
name, round_, result, trace, stderr, expected = sys.argv[1:7]
footer = json.loads(open(trace).read().splitlines()[-1])
traced, lost = footer["events"]["call"], footer["lost"]["calls"]
if traced != int(expected) or lost:
    sys.exit(f"{name} round {round_}: {traced} calls traced, {lost} lost, {expected} made")
programs = {m[1]: int(m[3]) / int(m[2]) for m in re.finditer(
    r"bpf-stats (\S+) id=\d+ run_cnt=(\d+) run_time_ns=(\d+)", open(stderr).read()) if int(m[2])}
print(json.dumps({"name": name, "round": int(round_),
                  "loop_ns_per_call": json.loads(result)["ns_per_call"], "traced": traced,
                  "lost": lost, **{f"{p}_ns_per_run": round(v, 1) for p, v in programs.items()}}))
PY
    done
done
python3 - "$out/runs.txt" <<'PY'
import collections, json, statistics, sys
by = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    r = json.loads(line)
    for key, value in r.items():
        if key.endswith("_ns_per_call") or key.endswith("_ns_per_run"):
            by[r["name"]][key].append(value)
for name, figures in by.items():
    print(name + ": " + ", ".join(
        f"{key} {statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}]"
        for key, v in sorted(figures.items())) + f" ({len(next(iter(figures.values())))} runs)")
PY
