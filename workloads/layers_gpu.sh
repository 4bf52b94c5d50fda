#!/usr/bin/env bash
# GPU check of `cudatrace summary` by layer with `--gpu --stacks` (issue 23). As root, on
# the GPU machine:
#
#   workloads/layers_gpu.sh CUDATRACE OUTDIR
#
# 1. GPT-2 (transformer_inference.py, 20 tokens) under `cudatrace run --gpu --stacks`;
#    `cudatrace summary --json` by layer against torch.profiler's module hierarchy for
#    the same workload (layers_reference.py, with_stack=True, a separate run):
#    layers_check.py says whether the layers' GPU time adds up to the kernels' and whether
#    every layer has the same kernels in both (OUTDIR/gpt2.check.txt).
# 2. torch.compile(mode="reduce-overhead") (compile_graphs.py) under `run --gpu --stacks`:
#    each kernel replayed from a CUDA graph counted at the stack of the launch captured
#    into its node (OUTDIR/graphs.check.txt).
set -uo pipefail
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=$(realpath -m "${2:?output folder}")
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
status=0

echo "== 1. GPT-2: GPU time by layer, cudatrace and torch.profiler"
gpt2=("$here/transformer_inference.py" --tokens 20)
"$cudatrace" run -q --gpu --stacks -o "$out/gpt2.jsonl" -- python3 "${gpt2[@]}" \
    >"$out/gpt2.log" 2>"$out/gpt2.stderr"
echo "cudatrace run exit $?"
"$cudatrace" summary --json "$out/gpt2.jsonl" >"$out/gpt2.summary.json"
"$cudatrace" summary "$out/gpt2.jsonl" >"$out/gpt2.summary.txt"
LAYERS_REFERENCE_OUT="$out/gpt2.ref.json" LAYERS_REFERENCE_CHROME="$out/gpt2.profiler.json.gz" \
    python3 "$here/layers_reference.py" "${gpt2[@]}" >"$out/gpt2.ref.log" 2>&1
rc=$?
echo "reference exit $rc"
[ $rc = 0 ] || tail -20 "$out/gpt2.ref.log"
python3 "$here/layers_check.py" "$out/gpt2.summary.json" "$out/gpt2.ref.json" |
    tee "$out/gpt2.check.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== 2. graphs: replayed kernels at their capture site's stack"
"$cudatrace" run -q --gpu --stacks -o "$out/graphs.jsonl" -- \
    python3 "$here/compile_graphs.py" --calls 50 >"$out/graphs.log" 2>"$out/graphs.stderr"
echo "cudatrace run exit $?"
"$cudatrace" summary --json "$out/graphs.jsonl" >"$out/graphs.summary.json"
"$cudatrace" summary "$out/graphs.jsonl" >"$out/graphs.summary.txt"
python3 - "$out/graphs.jsonl" "$out/graphs.summary.json" <<'EOF' | tee "$out/graphs.check.txt"
import json, sys
calls, graph_kernels = {}, []
for line in open(sys.argv[1]):
    record = json.loads(line)
    if record.get("type") == "call":
        calls[(record["pid"], record["tid"], record["ts_ns"])] = record
    elif record.get("type") == "gpu_kernel" and record.get("graph_id"):
        graph_kernels.append(record)
site = [calls.get((k["pid"], k.get("capture_call_tid"), k.get("capture_call_ts_ns"))) for k in graph_kernels]
with_capture = [c for c in site if c is not None]
with_stack = [c for c in with_capture if c.get("stack") is not None]
graph_ns = sum(k["dur_ns"] for k, c in zip(graph_kernels, site) if c is not None and c.get("stack") is not None)
stacks = json.load(open(sys.argv[2]))["stacks"]
print(f"graph kernels {len(graph_kernels)}, with a captured call {len(with_capture)}, "
      f"whose call has a stack {len(with_stack)} ({graph_ns / 1e3:.1f} us of GPU time)")
print("layers:", [(r["name"], r["gpu_kernels"], round(r["gpu_ns"] / 1e3, 1)) for r in stacks["layers"]])
print("kernels without a call", stacks["kernels_without_call"], "| calls without a stack",
      stacks["kernels_call_without_stack"])
ok = len(graph_kernels) > 0 and len(with_stack) == len(graph_kernels)
print("OK" if ok else "DIFFERENT")
sys.exit(0 if ok else 1)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || status=1
rm -f "$out/graphs.jsonl"
exit $status
