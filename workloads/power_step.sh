#!/usr/bin/env bash
# GPU check of the summary's energy step (stages shorter than one step of NVML's
# readings are marked), about a minute on an H100. As root, with PyTorch:
#   workloads/power_step.sh path/to/cudatrace OUTDIR
set -uo pipefail
ct=${1:?path to the cudatrace binary}
out=${2:?output folder}
mkdir -p "$out"
here=$(dirname "$0")
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/machine.txt"
"$ct" run -q --power -o "$out/gpt2.jsonl" -- python3 $here/transformer_inference.py --tokens 200 >/dev/null
"$ct" run -q --power=5 -o "$out/mlp.jsonl" -- python3 $here/simple_inference.py --batches 200 >/dev/null
"$ct" run -q --power=1 -o "$out/mlp1.jsonl" -- python3 $here/simple_inference.py --batches 200 >/dev/null
for n in gpt2 mlp mlp1; do
  "$ct" summary "$out/$n.jsonl" > "$out/$n.summary.txt"; echo "summary $n exit $?"
  "$ct" summary --json "$out/$n.jsonl" > "$out/$n.summary.json"
  python3 "$here/power_step_check.py" "$out/$n.jsonl" "$out/$n.summary.json"
  sed -n '/^Energy by stage/,/^$/p' "$out/$n.summary.txt"
done
