#!/usr/bin/env bash
# GPU overhead benchmark (issue 7): the launch-bound loop under four conditions,
# interleaved round by round so drift hits all alike, and the workloads' wall time
# with and without tracing. Usage (as root): workloads/bench_gpu.sh CUDATRACE OUTDIR [ROUNDS]
set -uo pipefail
cudatrace=${1:?path to the cudatrace binary}
out=${2:?output folder}
rounds=${3:-3}
here=$(dirname "$0")
mkdir -p "$out"
loop="python3 $here/launch_loop.py --iters 20000 --repeats 5"
for round in $(seq "$rounds"); do
    echo "round $round"
    $loop | sed 's/^/baseline /' >>"$out/loop.txt"
    "$cudatrace" run -q -o /tmp/bench.jsonl -- $loop | sed 's/^/cudatrace /' >>"$out/loop.txt"
    "$cudatrace" run -q --kernel -o /tmp/bench.jsonl -- $loop | sed 's/^/cudatrace_kernel /' >>"$out/loop.txt"
    $loop --profiler | sed 's/^/torch_profiler /' >>"$out/loop.txt"
done
for workload in simple_inference transformer_inference; do
    for round in $(seq "$rounds"); do
        start=$EPOCHREALTIME
        python3 "$here/$workload.py" >/dev/null
        mid=$EPOCHREALTIME
        "$cudatrace" run -q -o /tmp/bench.jsonl -- python3 "$here/$workload.py" >/dev/null
        end=$EPOCHREALTIME
        echo "$workload $start $mid $end" >>"$out/wall.txt"
    done
done
python3 - "$out" <<'PY'
import json, statistics, sys, collections
out = sys.argv[1]
runs = collections.defaultdict(list)
for line in open(f"{out}/loop.txt"):
    name, _, payload = line.partition(" ")
    runs[name].append(json.loads(payload)["us_per_iter_median"])
base = statistics.median(runs["baseline"])
print("launch-bound loop, median of per-round medians (us/iter):")
for name, values in runs.items():
    med = statistics.median(values)
    print(f"  {name:18} {med:6.2f}  x{med / base:4.2f}  rounds {[round(v, 2) for v in values]}")
walls = collections.defaultdict(lambda: ([], []))
for line in open(f"{out}/wall.txt"):
    w, start, mid, end = line.split()
    walls[w][0].append(float(mid) - float(start)); walls[w][1].append(float(end) - float(mid))
for w, (b, t) in walls.items():
    print(f"  {w:22} wall s: baseline {statistics.median(b):.2f}  cudatrace {statistics.median(t):.2f}  x{statistics.median(t)/statistics.median(b):.2f}")
PY
