#!/usr/bin/env bash
# The target's speed after `cudatrace run -p PID --gpu` detached, against its speed before
# (issue 30: "after detach, the launch loop at x1.00 of its speed before attach"), on the
# GPU machine. Run as root from the repository root, the PyTorch venv's python3 first in
# PATH, a release cudatrace carried over:
#
#   workloads/attach_after.sh CUDATRACE OUTDIR [MODE] [ROUNDS]
#
# PIN=CPU (environment) runs the target on that CPU alone (`taskset`), cudatrace off it.
#
# One target (workloads/attach_target.py MODE, default launch: 200 launches an iteration)
# runs untraced throughout. ROUNDS (default 6) pairs of rounds, interleaved: an "attach"
# round (2 s before, `run -p PID --gpu --duration 2s`, 1 s after the command's end, then
# 2 s measured) and a "none" round with the same timeline and no attach (the noise of the
# machine and of the target's own drift). Per round: the median iteration of the 2 s
# before and of the 2 s after; after/before; and the second second of the window (1 to 2 s
# after the command's start: the window is open then) over before. workloads/
# attach_after_check.py prints the rounds and the medians of the ratios of each kind. Nothing here runs on the build machine.
set -u
CUDATRACE=$(realpath "$1")
OUT=$2
MODE=${3:-launch}
ROUNDS=${4:-6}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
now_ns() { python3 -c 'import time; print(time.monotonic_ns())'; }
seconds=$((ROUNDS * 2 * 9 + 20))
pin=()
if [ -n "${PIN:-}" ]; then
  pin=(taskset -c "$PIN")
  others=$(python3 -c "import os; print(','.join(str(c) for c in sorted(os.sched_getaffinity(0)) if c != int('$PIN')))")
  CUDATRACE_PIN=(taskset -c "$others")
else
  CUDATRACE_PIN=()
fi
coproc TARGET { exec "${pin[@]}" python3 "$HERE/attach_target.py" "$MODE" --seconds "$seconds" --out "$OUT/iters.jsonl"; }
read -r ready pid <&"${TARGET[0]}"
if [ "$ready" != ready ]; then echo "the target did not start" >&2; exit 1; fi
sleep 2
: > "$OUT/rounds.txt"
failed=0
for round in $(seq 1 "$ROUNDS"); do
  for kind in attach none; do
    before_end=$(now_ns)
    if [ "$kind" = attach ]; then
      "${CUDATRACE_PIN[@]}" "$CUDATRACE" run -q -p "$pid" --gpu --duration 2s -o "$OUT/r$round.jsonl" 2> "$OUT/r$round.stderr" || failed=1
    else
      sleep 2.6
    fi
    after_start=$(( $(now_ns) + 1000000000 ))
    echo "$round $kind $before_end $after_start" >> "$OUT/rounds.txt"
    sleep 3
  done
done
wait "$TARGET_PID" || failed=1
python3 "$HERE/attach_after_check.py" "$OUT/iters.jsonl" "$OUT/rounds.txt" "$MODE" || failed=1
exit $failed
