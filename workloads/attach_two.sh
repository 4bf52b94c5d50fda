#!/usr/bin/env bash
# Two processes on two GPUs attached at once (issue 30: `run -p A -p B --gpu`), on a
# two-GPU machine. Run as root from the repository root, the PyTorch venv's python3 first
# in PATH, a release cudatrace carried over:
#
#   workloads/attach_two.sh CUDATRACE OUTDIR
#
# A: the training loop on device 0; B: GPT-2 decode on device 1 (workloads/attach_target.py),
# both started untraced; after 4 s, `run -p A -p B --gpu --stacks --duration 4s`. Checks per
# process: every kernel linked to its launch, kernels on that process's own device only,
# the footer's accounting; both targets end by themselves with exit 0.
set -u
CUDATRACE=$(realpath "$1")
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
python3 "$HERE/attach_target.py" train --device 0 --seconds 16 --out "$OUT/a.iters.jsonl" > "$OUT/a.out" 2>&1 &
pid_a=$!
python3 "$HERE/attach_target.py" gpt2 --device 1 --seconds 14 --out "$OUT/b.iters.jsonl" > "$OUT/b.out" 2>&1 &
pid_b=$!
for _ in $(seq 1 240); do
  grep -q '^ready' "$OUT/a.out" 2>/dev/null && grep -q '^ready' "$OUT/b.out" 2>/dev/null && break
  sleep 0.5
done
if ! grep -q '^ready' "$OUT/a.out" || ! grep -q '^ready' "$OUT/b.out"; then
  echo "a target did not start" >&2; kill "$pid_a" "$pid_b" 2>/dev/null; exit 1
fi
sleep 4
"$CUDATRACE" run -p "$pid_a" -p "$pid_b" --gpu --stacks --duration 4s -o "$OUT/two.jsonl" 2> "$OUT/two.stderr"
code=$?
wait "$pid_a"; code_a=$?
wait "$pid_b"; code_b=$?
echo "cudatrace exit $code, A exit $code_a, B exit $code_b"
grep -v "^cudatrace-phase" "$OUT/two.stderr" | head -20
python3 - "$OUT/two.jsonl" "$pid_a" "$pid_b" <<'PY'
import collections, json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
footer = lines[-1]
failed = []
for name, pid, device in (("A", int(sys.argv[2]), 0), ("B", int(sys.argv[3]), 1)):
    launches = [l for l in lines if l.get("type") == "call" and l.get("pid") == pid
                and str(l.get("name", "")).startswith("cuLaunch")]
    kernels = [l for l in lines if l.get("type") == "gpu_kernel" and l.get("pid") == pid]
    linked = sum(1 for k in kernels if "call_ts_ns" in k)
    devices = collections.Counter(k.get("device") for k in kernels)
    stacked = sum(1 for l in launches if "stack" in l)
    print(f"{name} pid {pid}: {len(launches)} launches ({stacked} with a stack), "
          f"{len(kernels)} kernels, {linked} linked, devices {dict(devices)}")
    if not kernels or linked != len(kernels) or set(devices) != {device}:
        failed.append(name)
issuing = footer.get("gpu", {}).get("issuing", {})
print("footer gpu.issuing", issuing, "lost", footer.get("lost"))
if issuing.get("with_work", 0) + issuing.get("not_recorded", 0) != issuing.get("calls", -1):
    failed.append("accounting")
print("FAIL " + ", ".join(failed) if failed else "ok")
sys.exit(1 if failed else 0)
PY
check=$?
[ "$code" = 0 ] && [ "$code_a" = 0 ] && [ "$code_b" = 0 ] && [ "$check" = 0 ]
