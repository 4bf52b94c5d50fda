#!/usr/bin/env bash
# GPU check of one job traced on every node (issue 25): two torchrun node agents on one
# host (--nnodes 2 --nproc_per_node 1, rendezvous on 127.0.0.1, one GPU each), each under
# its own `cudatrace run --gpu`, the last rank sleeping 50 ms before every third all-reduce
# (workloads/straggler.py). Then:
#   1. `cudatrace summary A B --json` checked by workloads/jobs_check.py: the late
#      all-reduces named, rank 0's wait 50 ms +- 1 ms, the clock offset and uncertainty;
#      `cudatrace merge A B -o job.pftrace`;
#   2. the same job with one window on both nodes (--start-at, --duration): the headers'
#      windows, the lines inside them, the command running on after it, the summary;
#   3. JAX driving both GPUs from one process (workloads/jax_psum.py) under --gpu: the
#      cross-rank section of its own summary (not fatal: JAX may be missing).
#
# Usage (as root, on a 2-GPU machine, from the repository root):
#   workloads/jobs_gpu.sh path/to/cudatrace OUTDIR
# Exits 1 when a check fails, 2 when a run failed.
#
# NVLink multicast stays off (shared GPUs).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=$(realpath -m "${2:?output folder}")
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
status=0

echo "== $(date -u)"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'

# Two node agents, each under its own cudatrace; $1: a tag, the rest: cudatrace flags
# then `--` and the workload's flags.
job() {
    local tag=$1; shift
    local flags=() port=$((29500 + RANDOM % 400))
    while [ "$1" != -- ]; do flags+=("$1"); shift; done; shift
    for node in 0 1; do
        CUDA_VISIBLE_DEVICES=$node timeout -s INT 150 "$cudatrace" run --gpu "${flags[@]}" \
            -o "$out/$tag-node$node-%h.jsonl" -- \
            python3 -m torch.distributed.run --nnodes 2 --nproc_per_node 1 --node_rank $node \
            --master_addr 127.0.0.1 --master_port $port "$here/straggler.py" --out "$out/$tag" "$@" \
            >"$out/$tag-node$node.log" 2>&1 &
    done
    local failed=0
    for node in 0 1; do wait -n || failed=$?; done
    for node in 0 1; do grep '^cudatrace:' "$out/$tag-node$node.log" | sed "s/^/node$node /"; done
    return $failed
}

echo; echo "== 1. two node agents, rank 1 late by 50 ms before every third all-reduce"
start=$(date +%s)
if ! job straggler -q -- --iters 12; then echo "a run failed"; status=2; fi
echo "took $(( $(date +%s) - start )) s"
traces=("$out"/straggler-node0-*.jsonl "$out"/straggler-node1-*.jsonl)
"$cudatrace" summary "${traces[@]}" >"$out/straggler.summary.txt" 2>"$out/straggler.summary.err"
"$cudatrace" summary --json "${traces[@]}" >"$out/straggler.summary.json" 2>>"$out/straggler.summary.err"
cat "$out/straggler.summary.txt" "$out/straggler.summary.err"
python3 "$here/jobs_check.py" "$out/straggler.summary.json" "$out/straggler" || status=1
"$cudatrace" merge "${traces[@]}" -o "$out/straggler.pftrace" || status=1

echo; echo "== 2. one window on both nodes"
at=$(python3 -c 'import time; print(f"{time.time() + 14:.3f}")')
start=$(date +%s)
if ! job window --start-at "$at" --duration 2s -- --seconds 20; then echo "a run failed"; status=2; fi
echo "took $(( $(date +%s) - start )) s"
wtraces=("$out"/window-node0-*.jsonl "$out"/window-node1-*.jsonl)
python3 - "${wtraces[@]}" <<'PY' || status=1
import json, sys
windows = []
for path in sys.argv[1:]:
    lines = [json.loads(l) for l in open(path)]
    header, footer = lines[0], lines[-1]
    w = header["window"]
    timed = [l["ts_ns"] for l in lines if l["type"] in ("call", "process")]
    inside = all(w["start_monotonic_ns"] <= t < w["end_monotonic_ns"] for t in timed)
    collectives = [l for l in lines if l["type"] == "call" and l.get("comm_seq")]
    print(path, "window", w["start_wall"], "->", w["end_wall"], "lines", len(timed), "all inside", inside,
          "collectives", len(collectives), "with comm_id", sum("comm_id" in l for l in collectives),
          "footer window", footer.get("window"), "exit_code", footer.get("exit_code"))
    windows.append((w["start_wall_ns"], w["end_wall_ns"]))
    if not inside or footer.get("type") != "footer":
        sys.exit(1)
if windows[0] != windows[1]:
    print("the windows differ:", windows); sys.exit(1)
PY
grep -h "window\|exited" "$out"/window-node*.log | head -8
"$cudatrace" summary "${wtraces[@]}" >"$out/window.summary.txt" 2>&1 || status=1
head -30 "$out/window.summary.txt"

echo; echo "== 3. JAX: both GPUs from one process"
if python3 -c 'import jax' 2>/dev/null; then
    timeout -s INT 120 "$cudatrace" run --gpu -q -o "$out/jax.jsonl" -- python3 "$here/jax_psum.py" 10 \
        >"$out/jax.log" 2>&1
    echo "exit $?"; tail -3 "$out/jax.log"
    "$cudatrace" summary "$out/jax.jsonl" >"$out/jax.summary.txt" 2>&1
    sed -n '/NCCL collectives/,$p' "$out/jax.summary.txt" | head -40
else
    echo "no JAX here"
fi
ls -la "$out"
exit $status
