#!/usr/bin/env bash
# GPU validation: trace the workloads with cudatrace and print per-name call counts.
# Usage (as root, on a machine with an NVIDIA GPU and PyTorch):
#   workloads/validate_gpu.sh path/to/cudatrace OUTDIR
set -uo pipefail
cudatrace=${1:?path to the cudatrace binary}
out=${2:?output folder}
mkdir -p "$out"
here=$(dirname "$0")
{
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    uname -r
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} 2>&1 | tee "$out/machine.txt"

trace() {
    local name=$1
    shift
    echo "== $name: $*"
    "$cudatrace" run -o "$out/$name.jsonl" "$@"
    echo "exit code $?"
    python3 "$here/trace_counts.py" "$out/$name.jsonl" | tee "$out/$name.counts.txt"
}

"$cudatrace" doctor | tee "$out/doctor.txt"
trace simple -- python3 "$here/simple_inference.py"
trace transformer -- python3 "$here/transformer_inference.py"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True trace simple_vmm -- python3 "$here/simple_inference.py"
trace simple_kernel --kernel -- python3 "$here/simple_inference.py"
for name in simple transformer simple_vmm simple_kernel; do
    "$cudatrace" summary "$out/$name.jsonl" >"$out/$name.summary.txt" 2>&1
done
