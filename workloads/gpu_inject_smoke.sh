#!/usr/bin/env bash
# GPU smoke check of cudatrace's CUDA injection library (cupti-inject/), before
# `cudatrace run --gpu` uses it: runs PyTorch workloads with CUDA_INJECTION64_PATH set and
# the library's debug file on, then checks the records (workloads/gpu_inject_check.py):
# counts per kind, errors, drops, kernels against launch API records, names, timing. With a
# cudatrace binary it runs each workload under `cudatrace run` too and checks that every
# CUPTI API record falls inside the traced call it belongs to (same pid and tid, call entry
# <= API start, API end <= call return): the link `run --gpu` will make.
#
# Usage (as root, on the GPU machine, from the repository root):
#   workloads/gpu_inject_smoke.sh path/to/libcudatrace_inject.so OUTDIR [path/to/cudatrace]
# Build the library here with `cargo build -p cudatrace` (it lands in
# target/inject/release/libcudatrace_inject.so) and carry it, and cudatrace, over.
# CUDATRACE_CUPTI=PATH overrides the libcupti found in the wheels; CUDATRACE_RUN_ARGS adds
# arguments to `cudatrace run` (e.g. "--libcuda PATH").
set -uo pipefail
lib=$(realpath "${1:?path to libcudatrace_inject.so}")
out=${2:?output folder}
cudatrace=${3:-}
here=$(dirname "$0")
mkdir -p "$out"

# libcupti from the Python's NVIDIA wheels, as `run --gpu` will look for it.
cupti=$(python3 - <<'EOF'
import glob, os, site, sys
for base in site.getsitepackages():
    for pattern in ("nvidia/cu13/lib/libcupti.so.13", "nvidia/cuda_cupti/lib/libcupti.so*"):
        for path in sorted(glob.glob(os.path.join(base, pattern))):
            print(path)
            sys.exit(0)
sys.exit(1)
EOF
) || { echo "no libcupti in the Python's NVIDIA wheels: pass CUDATRACE_CUPTI=PATH" >&2; exit 1; }
cupti=${CUDATRACE_CUPTI:-$cupti}
{
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    echo "libcupti: $cupti"
    echo "library: $lib ($(stat -c %s "$lib") bytes)"
    nm -D "$lib" | grep -E ' T (InitializeInjection|cudatrace_gpu_records)$'
} 2>&1 | tee "$out/machine.txt"

status=0
run() {
    local name=$1
    shift
    local records=$out/$name.records.jsonl
    rm -f "$records" "$out/$name.trace.jsonl"
    local inject=(env CUDA_INJECTION64_PATH="$lib" CUDATRACE_CUPTI="$cupti"
        CUDATRACE_INJECT_DEBUG_FILE="$records")
    echo "== $name: $*"
    if [ -n "$cudatrace" ]; then
        # shellcheck disable=SC2086 # CUDATRACE_RUN_ARGS is a list of words
        "$cudatrace" run ${CUDATRACE_RUN_ARGS:-} -o "$out/$name.trace.jsonl" -- \
            "${inject[@]}" "$@" 2>&1 |
            tee "$out/$name.log"
    else
        "${inject[@]}" "$@" 2>&1 | tee "$out/$name.log"
    fi
    echo "exit code ${PIPESTATUS[0]}"
    local trace=()
    [ -n "$cudatrace" ] && trace=("$out/$name.trace.jsonl")
    python3 "$here/gpu_inject_check.py" "$records" "${trace[@]}" | tee "$out/$name.check.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
}

run simple python3 "$here/simple_inference.py"
run launch_loop python3 "$here/launch_loop.py" --iters 30000 --repeats 3
run transformer python3 "$here/transformer_inference.py"

# First look at the cost: the launch loop without anything, then with the library alone.
echo "== launch loop, untraced"
python3 "$here/launch_loop.py" --iters 30000 --repeats 3 | tee "$out/launch_loop.untraced.txt"
echo "== launch loop, injection library only"
CUDA_INJECTION64_PATH="$lib" CUDATRACE_CUPTI="$cupti" \
    python3 "$here/launch_loop.py" --iters 30000 --repeats 3 | tee "$out/launch_loop.inject.txt"
exit $status
