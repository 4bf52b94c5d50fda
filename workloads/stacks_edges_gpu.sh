#!/usr/bin/env bash
# GPU check of issue 32's edges of `--stacks` (a walked call's entry stamped after its
# walk; `--stack-rate`). Usage, as root, on the GPU machine:
#
#   workloads/stacks_edges_gpu.sh CUDATRACE OUTDIR
#
# GPT-2 decoding (transformer_inference.py, 20 tokens) under `cudatrace run --gpu`, then
# `--gpu --stacks --stack-every 2`, then `--gpu --stacks --stack-rate 50`: a walked
# launch's entry is now its walk's end, and CUPTI's record of the call must still lie
# inside it, so the footers' `gpu.unlinked` must be the plain `--gpu` run's (0 there on
# 2026-11-27). Then `run --stacks --stack-every 2` without --gpu: per function, the
# median duration of the calls walked and of those sampled out, which should agree (the
# walk left out). stacks_edges_check.py prints it all and fails on a difference of links.
set -uo pipefail
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=$(realpath -m "${2:?output folder}")
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
gpt2=("$here/transformer_inference.py" --tokens 20)
run() {
    local name=$1
    shift
    "$cudatrace" run -q "$@" -o "$out/$name.jsonl" -- python3 "${gpt2[@]}" \
        >"$out/$name.log" 2>"$out/$name.stderr"
    echo "$name: cudatrace run exit $?"
}
run gpu --gpu
run every2 --gpu --stacks --stack-every 2
run rate50 --gpu --stacks --stack-rate 50
run durations --stacks --stack-every 2
python3 "$here/stacks_edges_check.py" "$out" | tee "$out/check.txt"
exit "${PIPESTATUS[0]}"
