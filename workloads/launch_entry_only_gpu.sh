#!/usr/bin/env bash
# GPU check of `cudatrace run --launch-entry-only` (issue 16, item 3): the MLP with --gpu
# and GPT-2 without, each traced with and without the flag; launch_entry_only_check.py
# compares each pair (exact launch counts per kernel, no ret/dur on the lean launches
# only, every GPU kernel linked). Its cost is bench_gpu.sh's `lean` condition.
#
# Usage (as root, on the GPU machine, from the repository root):
#   workloads/launch_entry_only_gpu.sh path/to/cudatrace OUTDIR
# Exit 0 when every check passes.
set -uo pipefail
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=$(realpath -m "${2:?output folder}")
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
"$cudatrace" --version
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
status=0
for workload in "mlp simple_inference.py --gpu" "gpt2 transformer_inference.py"; do
    read -r name script gpu <<<"$workload"
    for mode in full lean; do
        flags=(${gpu:+"$gpu"})
        [ "$mode" = lean ] && flags+=(--launch-entry-only)
        "$cudatrace" run -q "${flags[@]}" -o "$out/$name-$mode.jsonl" -- \
            python3 "$here/$script" >"$out/$name-$mode.stdout" 2>"$out/$name-$mode.stderr"
        echo "$name $mode: exit $?"
    done
    echo "== $name"
    python3 "$here/launch_entry_only_check.py" "$out/$name-full.jsonl" "$out/$name-lean.jsonl" || status=1
done
"$cudatrace" summary "$out/gpt2-lean.jsonl" >"$out/gpt2-lean.summary.txt" || status=1
head -30 "$out/gpt2-lean.summary.txt"
exit "$status"
