#!/usr/bin/env bash
# GPU check of cudatrace's fidelity (issue 14): long kernel names, and `--functions all`
# against NVIDIA's own count of every driver API call.
#
# Usage (as root, on the GPU machine, from the repository root):
#   workloads/fidelity_gpu.sh path/to/cudatrace OUTDIR
#
# 1. names: GPT-2 in half precision (random weights, `.half()`) traced; every launch must
#    name its kernel whole and demangled (workloads/fidelity_check.py names). Then a
#    half-precision `uniform_` on the GPU, which launches PyTorch's
#    distribution_elementwise_grid_stride_kernel (a mangled name of 400+ bytes): its
#    `kernel` must be the demangled name, with nothing cut.
# 2. counts: the MLP (workloads/simple_inference.py) traced with `--functions all` while
#    CUPTI's callback API counts every driver API call in the same process
#    (workloads/cupti_api_count.c, built here); the per-function table is in
#    OUTDIR/counts.txt (workloads/fidelity_check.py counts).
# 3. cost: the launch loop (30,000 x.add_(1) launches, 3 repeats) untraced, under
#    `cudatrace run`, and under `cudatrace run --functions all`, 6 interleaved rounds;
#    median microseconds per launch of each round in OUTDIR/cost.txt. And the MLP's
#    calls and run time with each selection.
#
# 4. signals: the stand-in libcuda's bench loop (built here with gcc) with 12 threads
#    calling flat out under `cudatrace run`; SIGINT after 2 s must end cudatrace with a
#    footer within 1 s (3 rounds, OUTDIR/sigint.txt).
#
# CUDATRACE_CUPTI_INCLUDE / CUDATRACE_CUPTI_LIB override where CUPTI's headers and library
# are found (default: the Python's NVIDIA wheels); CUDA_INCLUDE where cuda.h is (default:
# nvcc's toolkit, /usr/local/cuda/include).
set -uo pipefail
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=$(realpath -m "${2:?output folder}")
here=$(dirname "$0")
mkdir -p "$out"
status=0

{
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
    "$cudatrace" --version 2>/dev/null || true
} 2>&1 | tee "$out/machine.txt"

echo "== 1. names"
"$cudatrace" run -q -o "$out/gpt2_fp16.jsonl" -- \
    python3 "$here/transformer_inference.py" --dtype float16 | tee "$out/gpt2_fp16.log"
python3 "$here/fidelity_check.py" names "$out/gpt2_fp16.jsonl" | tee "$out/gpt2_fp16.names.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
"$cudatrace" run -q -o "$out/uniform_fp16.jsonl" -- python3 -c '
import torch
x = torch.empty(1 << 20, device="cuda", dtype=torch.half)
x.uniform_()
torch.cuda.synchronize()'
python3 "$here/fidelity_check.py" names "$out/uniform_fp16.jsonl" \
    --expect distribution_elementwise_grid_stride_kernel | tee "$out/uniform_fp16.names.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== 2. counts"
wheel_dir=$(python3 - <<'EOF'
import glob, os, site
for base in site.getsitepackages():
    for path in glob.glob(os.path.join(base, "nvidia/cu13")):
        print(path)
        raise SystemExit
EOF
)
cupti_include=${CUDATRACE_CUPTI_INCLUDE:-$wheel_dir/include}
cupti_lib=${CUDATRACE_CUPTI_LIB:-$wheel_dir/lib}
nvcc_include=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")/../include
cuda_include=${CUDA_INCLUDE:-$nvcc_include}
counter=$out/libcupti_api_count.so
if ! gcc -shared -fPIC -O2 -Wall -I"$cupti_include" -I"$cuda_include" -I/usr/local/cuda/include \
    -o "$counter" "$here/cupti_api_count.c" -L"$cupti_lib" -l:libcupti.so.13 \
    -Wl,-rpath,"$cupti_lib"; then
    echo "FAIL  cannot build the CUPTI counter: set CUDATRACE_CUPTI_INCLUDE, CUDATRACE_CUPTI_LIB, CUDA_INCLUDE"
    exit 1
fi
rm -f "$out"/cupti_counts.*
"$cudatrace" run -q --functions all -o "$out/mlp_all.jsonl" -- \
    env CUDA_INJECTION64_PATH="$counter" CUPTI_API_COUNT_OUT="$out/cupti_counts" \
    python3 "$here/simple_inference.py" | tee "$out/mlp_all.log"
python3 "$here/fidelity_check.py" counts "$out/mlp_all.jsonl" "$out"/cupti_counts.* \
    | tee "$out/counts.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
"$cudatrace" summary "$out/mlp_all.jsonl" > "$out/mlp_all.summary.txt" 2>&1

echo "== 3. cost"
loop=(python3 "$here/launch_loop.py" --iters 30000 --repeats 3)
median() { python3 -c 'import json,sys; print(json.loads(sys.stdin.readlines()[-1])["us_per_iter_median"])'; }
{
    echo "round untraced_us run_us run_all_us (median us per launch)"
    for round in 1 2 3 4 5 6; do
        untraced=$("${loop[@]}" | median)
        traced=$("$cudatrace" run -q -o "$out/loop_catalog.jsonl" -- "${loop[@]}" | median)
        all=$("$cudatrace" run -q --functions all -o "$out/loop_all.jsonl" -- "${loop[@]}" | median)
        echo "$round $untraced $traced $all"
    done
    for functions in catalog all; do
        start=$(date +%s.%N)
        "$cudatrace" run -q --functions "$functions" -o "$out/mlp_$functions.cost.jsonl" -- \
            python3 "$here/simple_inference.py" > /dev/null
        end=$(date +%s.%N)
        calls=$(tail -1 "$out/mlp_$functions.cost.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["events"]["call"])')
        echo "mlp --functions $functions: $calls calls, $(python3 -c "print(round($end - $start, 2))") s wall"
    done
    python3 -c 'import json,sys; h=json.loads(open(sys.argv[1]).readline()); print("probes with --functions all:", len(h["probes"]), h.get("probe_mechanism"))' "$out/loop_all.jsonl"
} 2>&1 | tee "$out/cost.txt"

echo "== 4. signals"
standin=$out/standin
mkdir -p "$standin"
gcc -shared -fPIC -O2 -fno-ipa-icf -Wl,-soname,libcuda.so.1 -o "$standin/libcuda.so.1" \
    "$here/../standin/libcuda_standin.c" &&
    gcc -O2 -o "$standin/cudatrace-bench-loop" "$here/../standin/bench_loop.c" \
        -L"$standin" -l:libcuda.so.1 -Wl,-rpath,'$ORIGIN' -lpthread || exit 1
python3 - "$cudatrace" "$standin" "$out" <<'EOF' 2>&1 | tee "$out/sigint.txt"
import json, os, signal, subprocess, sys, time
cudatrace, standin, out = sys.argv[1:4]
# The machine's own LD_LIBRARY_PATH would otherwise win over the loop's RUNPATH and load
# the real libcuda, whose calls fail at once without cuInit: the stand-in must be first.
env = dict(os.environ, LD_LIBRARY_PATH=standin)
worst = 0.0
failed = []
for round in range(3):
    trace = f"{out}/sigint_{round}.jsonl"
    tracer = subprocess.Popen(
        [cudatrace, "run", "-q", "--missing-probes", "ignore", "--libcuda",
         f"{standin}/libcuda.so.1", "-o", trace, "--",
         f"{standin}/cudatrace-bench-loop", "1000000000", "0", "12"],
        stdout=subprocess.DEVNULL, env=env)
    time.sleep(2)
    sent = time.monotonic()
    tracer.send_signal(signal.SIGINT)
    code = tracer.wait()
    took = time.monotonic() - sent
    worst = max(worst, took)
    footer = json.loads(open(trace, "rb").read().rstrip().rsplit(b"\n", 1)[-1])
    pid = json.loads(open(trace).readline())["pids"][0]
    subprocess.run(["kill", "-KILL", str(pid)])
    print(f"round {round}: exit {code}, {took * 1000:.0f} ms, footer {footer['type']} "
          f"stopped_by {footer.get('stopped_by')}, calls {footer['events']['call']}, "
          f"lost {footer['lost']['total']} (not_drained {footer['lost']['not_drained']})")
    if footer.get("stopped_by") != "SIGINT" or footer["events"]["call"] < 10_000 or code != 130:
        failed.append(round)
ok = worst < 1 and not failed
print(f"{'OK' if ok else 'FAIL'}  slowest SIGINT to exit: {worst * 1000:.0f} ms; rounds not "
      f"stopped by SIGINT with a flat-out loop (>= 10,000 calls, exit 130): {failed or 'none'}")
sys.exit(0 if ok else 1)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
