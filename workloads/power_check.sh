#!/usr/bin/env bash
# GPU checks of `cudatrace run --power` (issue 13), about 4 minutes on an H100.
# Usage (as root, on a machine with an NVIDIA GPU and PyTorch):
#   workloads/power_check.sh path/to/cudatrace OUTDIR [ROUNDS]
# Leaves the traces, summaries and pictures in OUTDIR and prints the tables of
# power_check.py report (also OUTDIR/report.txt):
#   1. a steady matmul burst: the energy counter vs integrated power (within 5%?)
#   2. energy per stage adds up to the counter's energy over the calls
#   3. idle and busy power on GPT-2
#   4. sampling every 10 ms vs not, on the launch loop (ROUNDS interleaved rounds, 6)
#   5. how often NVML's energy counter and power readings change
#   6. energy per kernel name, MLP and GPT-2 (with --gpu too when this cudatrace has it)
#   7. the sampler: read time per sample, ticks skipped, errors; the counter at --power=1
set -uo pipefail
cudatrace=${1:?path to the cudatrace binary}
out=${2:?output folder}
rounds=${3:-6}
here=$(dirname "$0")
mkdir -p "$out"
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
    uname -r
    python3 -c 'import torch; print("torch", torch.__version__)'
} >"$out/machine.txt" 2>&1

step() { echo "power_check: $*" >&2; }

step "burst (10 s of 8192x8192 fp16 matmuls between 2 s idle), sampled every 20 ms"
"$cudatrace" run -q --power -o "$out/burst.jsonl" -- \
    python3 "$here/power_check.py" burst >"$out/burst.phases.json"
step "the same, shorter, sampled every 1 ms"
"$cudatrace" run -q --power=1 -o "$out/period1.jsonl" -- \
    python3 "$here/power_check.py" burst --seconds 4 --idle 0.5 >/dev/null
step "GPT-2, 200 tokens"
"$cudatrace" run -q --power -o "$out/gpt2.jsonl" -- \
    python3 "$here/transformer_inference.py" --tokens 200 >/dev/null
step "MLP, 200 batches"
"$cudatrace" run -q --power -o "$out/mlp.jsonl" -- \
    python3 "$here/simple_inference.py" --batches 200 >/dev/null
names="burst period1 gpt2 mlp"
if "$cudatrace" run --help | grep -q -- '--gpu'; then
    step "MLP and GPT-2 with --gpu"
    "$cudatrace" run -q --power --gpu -o "$out/mlp_gpu.jsonl" -- \
        python3 "$here/simple_inference.py" --batches 200 >/dev/null
    "$cudatrace" run -q --power --gpu -o "$out/gpt2_gpu.jsonl" -- \
        python3 "$here/transformer_inference.py" --tokens 200 >/dev/null
    names="$names mlp_gpu gpt2_gpu"
fi
for name in $names; do
    "$cudatrace" summary --json "$out/$name.jsonl" >"$out/$name.summary.json"
    "$cudatrace" summary "$out/$name.jsonl" >"$out/$name.summary.txt"
done
"$cudatrace" plot "$out/gpt2.jsonl" -o "$out/gpt2.png"
"$cudatrace" plot "$out/burst.jsonl" -o "$out/burst.png"
"$cudatrace" export "$out/burst.jsonl" --format perfetto

step "launch loop: untraced, traced, traced with --power=10; $rounds interleaved rounds"
loop="python3 $here/launch_loop.py --iters 30000 --repeats 5"
: >"$out/loop.txt"
for round in $(seq "$rounds"); do
    step "  round $round"
    $loop | sed 's/^/untraced /' >>"$out/loop.txt"
    "$cudatrace" run -q -o "$out/loop.jsonl" -- $loop | sed 's/^/cudatrace /' >>"$out/loop.txt"
    "$cudatrace" run -q --power=10 -o "$out/loop_power.jsonl" -- $loop |
        sed 's/^/cudatrace_power10 /' >>"$out/loop.txt"
done

step "polling NVML in a tight loop during a burst"
python3 "$here/power_check.py" poll >"$out/poll.json"

python3 "$here/power_check.py" report "$out" | tee "$out/report.txt"
