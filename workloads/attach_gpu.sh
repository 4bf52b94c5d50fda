#!/usr/bin/env bash
# `cudatrace run -p PID --gpu` on the GPU machine (issue 30). Run as root from the repository
# root, with the PyTorch venv's python3 first in PATH and a release cudatrace built on the
# build machine and carried over (the injection library is inside it):
#
#   workloads/attach_gpu.sh target/release/cudatrace OUTDIR
#
# 1. A PyTorch training loop and a GPT-2 decode loop (workloads/attach_target.py), each
#    started untraced; after 5 s, `cudatrace run -p PID --gpu --stacks --duration 5s`; the
#    target runs on 10 s after. workloads/attach_check.py checks each trace: kernels equal
#    launches in the window (each linked, every other launch counted), stacks on the
#    launches, iteration time before / during / after, attach and detach latency, the
#    target's longest pause. Rows in OUTDIR/tables.md.
# 2. Attach/detach latency: one training process, attached 5 times for 2 s each (the second
#    and later reuse the library already loaded); per round the thread's stop, attach
#    (command start to the first GPU record), detach (window end to the command's end).
# Exits 1 if a check failed. Nothing here is run on the build machine.
set -u
CUDATRACE=$(realpath "$1")
OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
failed=0
now_ns() { python3 -c 'import time; print(time.monotonic_ns())'; }

{
  echo "| workload | launches | kernels | not recorded | launches with a stack | before ms | during ms | after ms | after/before | attach ms | detach ms | thread stopped µs | longest pause ms | check |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} > "$OUT/tables.md"

for mode in train gpt2; do
  coproc TARGET { exec python3 "$HERE/attach_target.py" "$mode" --seconds 25 --out "$OUT/$mode.iters.jsonl"; }
  read -r ready pid <&"${TARGET[0]}"
  if [ "$ready" != ready ]; then echo "$mode: the target did not start" >&2; failed=1; continue; fi
  sleep 5
  start=$(now_ns)
  "$CUDATRACE" run -p "$pid" --gpu --stacks --duration 5s -o "$OUT/$mode.jsonl" 2> "$OUT/$mode.stderr"
  code=$?
  end=$(now_ns)
  cat "${TARGET[0]}" > "$OUT/$mode.target.out"
  wait "$TARGET_PID"; target_code=$?
  echo "$mode: cudatrace exit $code, target exit $target_code ($(cat "$OUT/$mode.target.out"))"
  if [ "$code" != 0 ] || [ "$target_code" != 0 ]; then failed=1; fi
  python3 "$HERE/attach_check.py" "$mode" "$OUT/$mode.jsonl" "$OUT/$mode.iters.jsonl" \
    "$OUT/$mode.stderr" "$start $end" | tee -a "$OUT/tables.md" || failed=1
  "$CUDATRACE" summary "$OUT/$mode.jsonl" > "$OUT/$mode.summary.txt" 2>&1
done

{
  echo
  echo "| round | thread stopped µs | attach µs (ptrace, all) | first GPU record after the command's start, ms | window end to the command's end, ms | library reused |"
  echo "|---|---|---|---|---|---|"
} >> "$OUT/tables.md"
coproc TARGET { exec python3 "$HERE/attach_target.py" train --seconds 60 --out "$OUT/bench.iters.jsonl"; }
read -r ready pid <&"${TARGET[0]}"
for round in 1 2 3 4 5; do
  start=$(now_ns)
  "$CUDATRACE" run -p "$pid" --gpu --duration 2s -o "$OUT/bench$round.jsonl" 2> "$OUT/bench$round.stderr" || failed=1
  end=$(now_ns)
  python3 - "$OUT/bench$round.jsonl" "$OUT/bench$round.stderr" "$start" "$end" "$round" >> "$OUT/tables.md" <<'PY' || failed=1
import json, re, sys
trace, said, start, end, round_ = sys.argv[1], open(sys.argv[2]).read(), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
lines = [json.loads(l) for l in open(trace)]
info = [l for l in lines if l.get("type") == "gpu_info"]
window_end = lines[0]["window"]["end_monotonic_ns"]
m = re.search(r"stopped (\d+) µs .*?, (\d+) µs in all", said)
reused = "yes" if "from an earlier attach" in said else "no"
first = (info[0]["ts_ns"] - start) / 1e6 if info else float("inf")
print(f"| {round_} | {m.group(1) if m else '?'} | {m.group(2) if m else '?'} | {first:.0f} | {(end - window_end) / 1e6:.0f} | {reused} |")
sys.exit(0 if info and m else 1)
PY
  sleep 2
done
wait "$TARGET_PID" || failed=1

cat "$OUT/tables.md"
exit $failed
