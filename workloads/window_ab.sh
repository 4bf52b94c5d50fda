#!/usr/bin/env bash
# Tracing's cost measured inside one process (issue 32): a long-running target
# (workloads/attach_target.py, started untraced) is traced in windows by `cudatrace run -p
# PID`, one window per condition and round, each between untraced stretches of the same
# length, the order of the conditions rotated from round to round. Each traced window's
# iterations are compared with the untraced stretches just before and after it, so the
# machine's drift (its speed moved ×1.8 between runs on the H100s) hits both sides alike,
# and no run pays its own start.
#
#   workloads/window_ab.sh CUDATRACE OUTDIR MODE ROUNDS [CONDITIONS]
#
# MODE: attach_target.py's mode (gpt2: one token an iteration; launch: 200 launches of
# `x.add_(1)`). CONDITIONS (default "run stacks"): run (`run -p PID`), stacks (`--stacks`,
# every call stacked), stacks_ident (`--stacks` with each frame's code identity read,
# CUDATRACE_STACKS_IDENT_PER_FRAME=1: no probe on code objects' deallocator), stacks_alt
# (`--stacks` with the settings of $STACKS_ALT_ENV, default 1 KiB C-stack and data-stack
# windows: the walk reads more often and copies less; run AS), stacks_every (`--stacks
# --stack-every $STACK_EVERY`, default 4: whether the cost goes with the walks), run_eo
# and stacks_eo (run and stacks with `--launch-entry-only`: no return probe on launches),
# floor_entry (no cudatrace: the kernel's bare tracefs `p:` uprobe event on the target's
# cuLaunchKernel for the window, the trap's own cost; its window's bounds are written as two
# call lines of r*-floor_entry.jsonl, which window_ab.py reads as it reads a trace), and
# run_base and stacks_base: run and stacks with the binary $BASE_CUDATRACE (another build,
# A/B in one process); run_v_NAME and stacks_v_NAME: the same with the binary
# $VARIANTS/cudatrace.NAME (several other builds in one run, as the measuring builds that
# cut the walk short, BENCHMARKS.md). SECONDS (environment,
# default 3): each window's and stretch's length.
# TARGET (environment): the target's command instead of attach_target.py (it takes MODE,
# --seconds S and --out FILE, prints "ready PID", and writes one {"t_ns", "dt_ns"} line per
# iteration to FILE, CLOCK_MONOTONIC; attach_target.py adds "cpu_ns", "minflt", "nvcsw" and
# "nivcsw"). The table (workloads/window_ab.py) is printed and
# kept in OUTDIR/window_ab.txt. Run as root.
set -u
CUDATRACE=$(realpath "$1")
OUT=$(realpath -m "$2")
MODE=$3
ROUNDS=$4
read -r -a CONDITIONS <<<"${5:-run stacks}"
SECONDS_EACH=${SECONDS:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
for condition in "${CONDITIONS[@]}"; do
  if [[ $condition == *_base ]] && [ ! -x "${BASE_CUDATRACE:-}" ]; then
    echo "window_ab: $condition needs BASE_CUDATRACE, the other build's binary" >&2
    exit 2
  fi
  if [[ $condition == *_v_* ]] && [ ! -x "${VARIANTS:-}/cudatrace.${condition#*_v_}" ]; then
    echo "window_ab: $condition needs \$VARIANTS/cudatrace.${condition#*_v_}" >&2
    exit 2
  fi
done
mkdir -p "$OUT"
tracefs=/sys/kernel/tracing
[ -e "$tracefs/uprobe_events" ] || mount -t tracefs nodev "$tracefs" 2>/dev/null
group=cudatrace_window_ab
floor_off() {
  { echo 0 >"$tracefs/events/$group/enable"; } 2>/dev/null
  grep -q "^p:$group/launch " "$tracefs/uprobe_events" 2>/dev/null && echo "-:$group/launch" >>"$tracefs/uprobe_events"
  return 0
}
trap floor_off EXIT
floor_off # leftovers of an interrupted run
now_ns() { python3 -c 'import time; print(time.monotonic_ns())'; }
count=${#CONDITIONS[@]}
# Windows and stretches, plus the attaches' own time and a stretch at each end.
total=$(python3 -c "print($ROUNDS * $count * ($SECONDS_EACH * 2 + 2) + 3 * $SECONDS_EACH + 10)")
read -r -a target <<<"${TARGET:-python3 $HERE/attach_target.py}"
coproc TARGET_PROC { exec "${target[@]}" "$MODE" --seconds "$total" --out "$OUT/iters.jsonl"; }
read -r ready pid <&"${TARGET_PROC[0]}"
if [ "$ready" != ready ]; then
  echo "window_ab: the target did not start" >&2
  exit 1
fi
: >"$OUT/windows.txt"
failed=0
sleep "$SECONDS_EACH"
for round in $(seq 1 "$ROUNDS"); do
  for index in $(seq 0 $((count - 1))); do
    condition=${CONDITIONS[$(((index + round) % count))]}
    binary=$CUDATRACE
    case $condition in
    run) flags=() ;;
    stacks) flags=(--stacks) ;;
    run_eo) flags=(--launch-entry-only) ;;
    stacks_eo) flags=(--stacks --launch-entry-only) ;;
    run_base) flags=(); binary=$(realpath "$BASE_CUDATRACE") ;;
    stacks_base) flags=(--stacks); binary=$(realpath "$BASE_CUDATRACE") ;;
    run_v_*) flags=(); binary=$(realpath "$VARIANTS/cudatrace.${condition#run_v_}") ;;
    stacks_v_*) flags=(--stacks); binary=$(realpath "$VARIANTS/cudatrace.${condition#stacks_v_}") ;;
    stacks_ident) flags=(--stacks) ;;
    stacks_alt) flags=(--stacks) ;;
    stacks_every) flags=(--stacks --stack-every "${STACK_EVERY:-4}") ;;
    floor_entry) ;;
    *) echo "window_ab: unknown condition $condition" >&2; exit 2 ;;
    esac
    sleep "$SECONDS_EACH"
    start=$(now_ns)
    trace="$OUT/r$round-$condition.jsonl"
    if [ "$condition" = floor_entry ]; then
      # The target's libcuda and cuLaunchKernel's file offset in it (tracefs takes those).
      lib=$(awk '$6 ~ /libcuda\.so/ {print $6; exit}' "/proc/$pid/maps")
      offset=$(python3 "$HERE/file_offset.py" "$lib" cuLaunchKernel)
      if [ -z "$lib" ] || [ -z "$offset" ] || ! echo "p:$group/launch $lib:$offset" >>"$tracefs/uprobe_events" ||
        ! echo 1 >"$tracefs/events/$group/enable"; then
        echo "window_ab: cannot set up floor_entry (libcuda '$lib', offset '$offset')" >&2
        floor_off
        exit 1
      fi
      on=$(now_ns)
      sleep "$SECONDS_EACH"
      off=$(now_ns)
      floor_off
      printf '{"type":"call","ts_ns":%s}\n{"type":"call","ts_ns":%s}\n' "$on" "$off" >"$trace"
      echo "$round $condition $start $(now_ns) $trace" >>"$OUT/windows.txt"
      continue
    fi
    settings=()
    [ "$condition" = stacks_ident ] && settings=(CUDATRACE_STACKS_IDENT_PER_FRAME=1)
    [ "$condition" = stacks_alt ] &&
      read -r -a settings <<<"${STACKS_ALT_ENV:-CUDATRACE_STACKS_UP_WINDOW=1024 CUDATRACE_STACKS_DATA_WINDOW=1024}"
    # The tracer's own time, real, user and system seconds, to r*.time (window_ab.py).
    TIMEFORMAT='%R %U %S'
    { time env "${settings[@]}" "$binary" run -q -p "$pid" "${flags[@]}" --duration "${SECONDS_EACH}s" -o "$trace" \
      2>"$OUT/r$round-$condition.stderr" || failed=1; } 2>"$OUT/r$round-$condition.time"
    end=$(now_ns)
    echo "$round $condition $start $end $trace" >>"$OUT/windows.txt"
  done
done
sleep "$SECONDS_EACH"
kill -TERM "$pid" 2>/dev/null
wait "$TARGET_PROC_PID" 2>/dev/null
python3 "$HERE/window_ab.py" "$OUT/windows.txt" "$OUT/iters.jsonl" "$MODE" | tee "$OUT/window_ab.txt"
[ "${PIPESTATUS[0]}" = 0 ] || failed=1
exit $failed
