#!/usr/bin/env bash
# GPU overhead benchmark (issues 7 and 16): the launch-bound loop under five conditions,
# interleaved round by round so drift hits all alike, and the workloads' wall time
# with and without tracing. Usage (as root): workloads/bench_gpu.sh CUDATRACE OUTDIR [ROUNDS]
#
# `bystander`: the loop untraced while `cudatrace run` traces another CUDA process (a
# Python process holding a CUDA context); with per-process probes (uprobe_multi, Linux
# 6.6+) the loop takes no uprobe trap and should cost what `baseline` costs.
set -uo pipefail
cudatrace=${1:?path to the cudatrace binary}
out=${2:?output folder}
rounds=${3:-5}
here=$(dirname "$0")
mkdir -p "$out"
loop="python3 $here/launch_loop.py --iters 20000 --repeats 5"
for round in $(seq "$rounds"); do
    echo "round $round"
    $loop | sed 's/^/baseline /' >>"$out/loop.txt"
    "$cudatrace" run -q -o /tmp/bench.jsonl -- $loop | sed 's/^/cudatrace /' >>"$out/loop.txt"
    "$cudatrace" run -q --kernel -o /tmp/bench.jsonl -- $loop | sed 's/^/cudatrace_kernel /' >>"$out/loop.txt"
    $loop --profiler | sed 's/^/torch_profiler /' >>"$out/loop.txt"
    rm -f "$out/bystander.jsonl"
    "$cudatrace" run -q -o "$out/bystander.jsonl" -- python3 -c \
        'import time, torch; torch.zeros(1, device="cuda"); torch.cuda.synchronize(); time.sleep(3600)' &
    tracer=$!
    until grep -q '"type":"call"' "$out/bystander.jsonl" 2>/dev/null; do sleep 0.2; done
    sleep 2
    $loop | sed 's/^/bystander /' >>"$out/loop.txt"
    kill -TERM "$tracer"; wait "$tracer"
    cp "$out/bystander.jsonl" "$out/bystander-$round.jsonl"
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
import glob
strays = 0
for path in glob.glob(f"{out}/bystander-*.jsonl"):
    lines = [json.loads(l) for l in open(path)]
    command = lines[0]["pids"][0]
    strays += sum(1 for l in lines if l["type"] == "call" and l["pid"] != command)
    scope = lines[0].get("attach", {}).get("scope")
print(f"  bystander traces: attach scope {scope}, calls of other pids: {strays} (must be 0)")
walls = collections.defaultdict(lambda: ([], []))
for line in open(f"{out}/wall.txt"):
    w, start, mid, end = line.split()
    walls[w][0].append(float(mid) - float(start)); walls[w][1].append(float(end) - float(mid))
for w, (b, t) in walls.items():
    print(f"  {w:22} wall s: baseline {statistics.median(b):.2f}  cudatrace {statistics.median(t):.2f}  x{statistics.median(t)/statistics.median(b):.2f}")
PY
