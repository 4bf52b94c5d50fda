#!/usr/bin/env bash
# GPU check of cudatrace's NCCL probes (issue 12): workloads/allreduce.py under torchrun,
# one process per GPU, traced twice: `cudatrace run` and `cudatrace run --gpu`.
#
# Usage (as root, on the GPU machine, from the repository root; needs python3 and torch,
# builds nothing):
#   workloads/allreduce_gpu.sh path/to/cudatrace OUTDIR [NPROC]
#
# NPROC defaults to 2 when the machine has 2 GPUs or more, else 1 (the single-GPU
# fallback: one process, NCCL with one rank). For each run it prints, per rank and op,
# exact counts and bytes (iters + 1 warm-up calls; ncclBcast's inner ncclBroadcast counted
# apart), the summary's rows, rank and nranks, the devices of each rank's launches, copies
# and allocations, the pids in the trace and the rank-track slices of `cudatrace export`
# against what the workload did (workloads/allreduce_check.py), and for the --gpu run the
# bus bandwidth from cudatrace against the workload's own (median CUDA-event time). Exits 1 on
# any exact mismatch, 2 when a run failed. Takes about 2 minutes; each run is capped at
# 4 minutes.
#
# NVLink multicast stays off (shared GPUs): NCCL_NVLS_ENABLE=0,
# TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are set for everything here.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=$(realpath -m "${2:?output folder}")
here=$(cd "$(dirname "$0")" && pwd)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nproc=${3:-$(( gpus >= 2 ? 2 : 1 ))}
mkdir -p "$out"
status=0

echo "== $(date -u) $gpus GPUs, $nproc processes; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
"$cudatrace" --version 2>/dev/null || true

for mode in plain gpu; do
    flags=()
    [ "$mode" = gpu ] && flags=(--gpu)
    rm -rf "$out/$mode"
    echo
    echo "== cudatrace run ${flags[*]} -- torchrun --nproc_per_node $nproc workloads/allreduce.py"
    start=$(date +%s)
    timeout -s INT 240 "$cudatrace" run "${flags[@]}" -o "$out/$mode.jsonl" -- \
        python3 -m torch.distributed.run --standalone --nproc_per_node "$nproc" \
        "$here/allreduce.py" --out "$out/$mode" --iters 20 \
        >"$out/$mode.log" 2>&1
    rc=$?
    echo "exit $rc after $(( $(date +%s) - start )) s (log: $out/$mode.log)"
    grep '^cudatrace:' "$out/$mode.log"
    if [ "$rc" -ne 0 ]; then
        tail -20 "$out/$mode.log"
        status=2
        continue
    fi
    "$cudatrace" summary "$out/$mode.jsonl" >"$out/$mode.summary.txt"
    "$cudatrace" summary --json "$out/$mode.jsonl" >"$out/$mode.summary.json"
    "$cudatrace" export "$out/$mode.jsonl" -o "$out/$mode.export.json" \
        || { echo "FAIL cudatrace export"; status=1; }
    sed -n '/^NCCL collectives/,/^$/p' "$out/$mode.summary.txt"
    python3 "$here/allreduce_check.py" "$out/$mode.jsonl" "$out/$mode.summary.json" "$out/$mode" \
        "$out/$mode.export.json" || { [ "$status" -eq 0 ] && status=1; }
done
echo
echo "== done: status $status (0 all exact checks passed, 1 a mismatch, 2 a run failed)"
exit "$status"
