#!/usr/bin/env bash
# GPU check of `cudatrace run --stacks` (issue 23). Usage, as root, on the GPU machine:
#
#   workloads/stacks_gpu.sh CUDATRACE OUTDIR [ROUNDS] [PARTS]
#
# PARTS (default `exact,cost,stats`), comma-separated, of:
# 1. exact: the MLP (simple_inference.py) and GPT-2 (transformer_inference.py, 20 tokens)
#    run under `cudatrace run --stacks` inside workloads/stacks_reference.py, which records
#    CPython's own stack at every launch from a CUPTI callback on the launching thread;
#    workloads/stacks_check.py compares them launch by launch, frame for frame
#    (OUTDIR/{mlp,gpt2}.check.txt).
# 2. cost: the launch loop (launch_loop.py, 61,000 launches of `x.add_(1)`) and GPT-2
#    decoding (40 tokens) untraced, under `cudatrace run` and under `cudatrace run
#    --stacks`, ROUNDS (default 6) interleaved rounds, the order rotated each round:
#    microseconds per launch and milliseconds per token (OUTDIR/cost.txt, one line per run).
# gpt2cost (not in the default): GPT-2 decoding alone, 200 tokens a run, in ROUNDS
#    interleaved rounds, the order rotated each round, under $GPT2COST_CONDITIONS (default
#    `untraced run stacks`; also `stacks_entry`: `--stacks --launch-entry-only`, and
#    `stacks_every4`: `--stacks --stack-every 4`, a thread's stack at 1 in 4 calls); each
#    traced run's ratio to its round's untraced one (OUTDIR/gpt2cost.txt).
# loopgpu (not in the default; issue 32): the launch loop alone under $LOOPGPU_CONDITIONS
#    (default `untraced run stacks stacks_ident gpu gpu_stacks`; `stacks_ident` is --stacks
#    with each frame's identity read, CUDATRACE_STACKS_IDENT_PER_FRAME=1, as on a kernel
#    without uprobe_multi), ROUNDS interleaved rounds, the order rotated each round; each
#    traced run's ratio to its round's untraced one (OUTDIR/loopgpu.txt). Also, for
#    where `--gpu`'s cost goes: `cupti_only` (the injection library alone, no probes:
#    $INJECT_LIB, with the libcupti PyTorch's wheel has), `gpu_callbacks` (the API records
#    from CUPTI's callbacks, CUDATRACE_INJECT_CALLS=callbacks), `gpu_nocalls` (no API records:
#    CUDATRACE_INJECT_CALLS=none, GPU records unlinked), `gpu_nots` (no timestamp callback,
#    CUDATRACE_INJECT_TIMESTAMP_CALLBACK=0), `gpu_base` (`--gpu` of another build,
#    $BASE_CUDATRACE). PIN=CPU runs the loop under `taskset -c CPU`.
# 3. where the time goes: one run of each with CUDATRACE_BPF_STATS=1, with and without
#    --stacks (the call program's run time per call includes the stack programs it
#    tail-calls), and the footer's frames walked (OUTDIR/*.stats.stderr).
# The tables are printed at the end and kept in OUTDIR/tables.txt.
set -uo pipefail
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=$(realpath -m "${2:?output folder}")
rounds=${3:-6}
parts=",${4:-exact,cost,stats},"
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
status=0

{
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)'
    readlink -f "$(command -v python3)"
} 2>&1 | tee "$out/machine.txt"

echo "== 1. every launch's stack against CPython's"
[[ $parts == *,exact,* ]] && for workload in mlp gpt2; do
    case $workload in
    mlp) command=("$here/simple_inference.py") ;;
    gpt2) command=("$here/transformer_inference.py" --tokens 20) ;;
    esac
    STACKS_REFERENCE_OUT="$out/$workload.ref.json" "$cudatrace" run -q --stacks \
        -o "$out/$workload.jsonl" -- python3 "$here/stacks_reference.py" "${command[@]}" \
        >"$out/$workload.log" 2>"$out/$workload.stderr"
    python3 "$here/stacks_check.py" "$out/$workload.jsonl" "$out/$workload.ref.json" \
        | tee "$out/$workload.check.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
done

loop=(python3 "$here/launch_loop.py" --iters 20000 --repeats 3)
gpt2=(python3 "$here/transformer_inference.py" --tokens 40)
conditions=(untraced run stacks)
[[ $parts == *,cost,* ]] && echo "== 2. cost ($rounds rounds)" && : >"$out/cost.txt" &&
for round in $(seq 1 "$rounds"); do
    for index in 0 1 2; do
        condition=${conditions[$(((index + round) % 3))]}
        case $condition in
        untraced) prefix=() ;;
        run) prefix=("$cudatrace" run -q -o /dev/null --) ;;
        stacks) prefix=("$cudatrace" run -q --stacks -o /dev/null --) ;;
        esac
        us=$("${prefix[@]}" "${loop[@]}" 2>>"$out/cost.stderr" | tail -1 |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["us_per_iter_median"])')
        ms=$("${prefix[@]}" "${gpt2[@]}" 2>>"$out/cost.stderr" | awk '/^per token:/ {print $3}')
        echo "$round $condition loop_us=$us gpt2_ms_per_token=$ms" | tee -a "$out/cost.txt"
    done
done

gpt2_long=(python3 "$here/transformer_inference.py" --tokens 200)
read -r -a long_conditions <<<"${GPT2COST_CONDITIONS:-untraced run stacks}"
count=${#long_conditions[@]}
[[ $parts == *,gpt2cost,* ]] && echo "== GPT-2 cost, 200 tokens ($rounds rounds)" &&
: >"$out/gpt2cost.txt" && for round in $(seq 1 "$rounds"); do
    line="$round"
    for index in $(seq 0 $((count - 1))); do
        condition=${long_conditions[$(((index + round) % count))]}
        case $condition in
        untraced) prefix=() ;;
        run) prefix=("$cudatrace" run -q -o /dev/null --) ;;
        stacks) prefix=("$cudatrace" run -q --stacks -o /dev/null --) ;;
        stacks_entry) prefix=("$cudatrace" run -q --stacks --launch-entry-only -o /dev/null --) ;;
        stacks_every4) prefix=("$cudatrace" run -q --stacks --stack-every 4 -o /dev/null --) ;;
        stacks_ident) prefix=(env CUDATRACE_STACKS_IDENT_PER_FRAME=1 "$cudatrace" run -q --stacks -o /dev/null --) ;;
        esac
        ms=$("${prefix[@]}" "${gpt2_long[@]}" 2>>"$out/gpt2cost.stderr" | awk '/^per token:/ {print $3}')
        line="$line $condition=$ms"
    done
    echo "$line" | tee -a "$out/gpt2cost.txt"
done
[ -s "$out/gpt2cost.txt" ] && python3 - "$out/gpt2cost.txt" <<'EOF' | tee -a "$out/tables.txt"
import statistics, sys
rounds = [dict(f.split("=") for f in line.split()[1:]) for line in open(sys.argv[1])]
for condition in rounds[0]:
    ms = [float(r[condition]) for r in rounds]
    print(f"GPT-2 200 tokens {condition:12} median {statistics.median(ms):.3f} ms/token {[round(x, 3) for x in ms]}")
for condition in rounds[0]:
    if condition != "untraced":
        ratios = [float(r[condition]) / float(r["untraced"]) for r in rounds]
        print(f"GPT-2 200 tokens {condition:12} x{statistics.median(ratios):.3f} of untraced (median of per-round ratios) {[round(x, 3) for x in ratios]}")
EOF

read -r -a loop_conditions <<<"${LOOPGPU_CONDITIONS:-untraced run stacks stacks_ident gpu gpu_stacks}"
pinned_loop=("${loop[@]}")
[ -n "${PIN:-}" ] && pinned_loop=(taskset -c "$PIN" "${loop[@]}")
cupti=$(python3 -c 'import glob, site
found = [p for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/cu*/lib/libcupti.so*")]
print(sorted(found)[0] if found else "")' 2>/dev/null)
count=${#loop_conditions[@]}
[[ $parts == *,loopgpu,* ]] && echo "== launch loop ($rounds rounds)" &&
: >"$out/loopgpu.txt" && for round in $(seq 1 "$rounds"); do
    line="$round"
    for index in $(seq 0 $((count - 1))); do
        condition=${loop_conditions[$(((index + round) % count))]}
        case $condition in
        untraced) prefix=() ;;
        run) prefix=("$cudatrace" run -q -o /dev/null --) ;;
        stacks) prefix=("$cudatrace" run -q --stacks -o /dev/null --) ;;
        stacks_ident) prefix=(env CUDATRACE_STACKS_IDENT_PER_FRAME=1 "$cudatrace" run -q --stacks -o /dev/null --) ;;
        gpu) prefix=("$cudatrace" run -q --gpu -o /dev/null --) ;;
        gpu_stacks) prefix=("$cudatrace" run -q --gpu --stacks -o /dev/null --) ;;
        gpu_callbacks) prefix=(env CUDATRACE_INJECT_CALLS=callbacks "$cudatrace" run -q --gpu -o /dev/null --) ;;
        gpu_nocalls) prefix=(env CUDATRACE_INJECT_CALLS=none "$cudatrace" run -q --gpu -o /dev/null --) ;;
        gpu_base) prefix=("${BASE_CUDATRACE:?BASE_CUDATRACE for gpu_base}" run -q --gpu -o /dev/null --) ;;
        gpu_nots) prefix=(env CUDATRACE_INJECT_TIMESTAMP_CALLBACK=0 "$cudatrace" run -q --gpu -o /dev/null --) ;;
        cupti_only) prefix=(env CUDA_INJECTION64_PATH="${INJECT_LIB:?INJECT_LIB for cupti_only}"
            CUDATRACE_CUPTI="$cupti" CUDATRACE_INJECT_STDERR=0) ;;
        esac
        us=$("${prefix[@]}" "${pinned_loop[@]}" 2>>"$out/loopgpu.stderr" | tail -1 |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["us_per_iter_median"])')
        line="$line $condition=$us"
    done
    echo "$line" | tee -a "$out/loopgpu.txt"
done
[ -s "$out/loopgpu.txt" ] && python3 - "$out/loopgpu.txt" <<'EOF' | tee -a "$out/tables.txt"
import statistics, sys
rounds = [dict(f.split("=") for f in line.split()[1:]) for line in open(sys.argv[1])]
for condition in rounds[0]:
    us = [float(r[condition]) for r in rounds]
    print(f"launch loop {condition:12} median {statistics.median(us):.2f} us/launch {[round(x, 2) for x in us]}")
for condition in rounds[0]:
    if condition != "untraced":
        ratios = [float(r[condition]) / float(r["untraced"]) for r in rounds]
        print(f"launch loop {condition:12} x{statistics.median(ratios):.3f} of untraced (median of per-round ratios) {[round(x, 3) for x in ratios]}")
    if condition not in ("untraced", "run") and "run" in rounds[0]:
        extra = [float(r[condition]) - float(r["run"]) for r in rounds]
        print(f"launch loop {condition:12} {statistics.median(extra):+.2f} us/launch over run (median of per-round differences)")
EOF

echo "== 3. BPF statistics"
[[ $parts == *,stats,* ]] && for workload in loop gpt2; do
    for mode in run stacks; do
        flag=()
        [ "$mode" = stacks ] && flag=(--stacks)
        if [ "$workload" = loop ]; then command=("${loop[@]}"); else command=("${gpt2[@]}"); fi
        CUDATRACE_BPF_STATS=1 "$cudatrace" run -q "${flag[@]}" -o "$out/$workload.$mode.stats.jsonl" \
            -- "${command[@]}" >/dev/null 2>"$out/$workload.$mode.stats.stderr"
        grep 'bpf-stats call_enter' "$out/$workload.$mode.stats.stderr" | sed "s/^/$workload $mode: /"
        tail -1 "$out/$workload.$mode.stats.jsonl" | python3 -c '
import json, sys
stacks = json.loads(sys.stdin.read()).get("stacks")
if stacks:
    print("  stacks:", json.dumps(stacks))'
    done
done | tee "$out/stats.txt"

[ -s "$out/cost.txt" ] && python3 - "$out" <<'EOF' | tee "$out/tables.txt"
import re, statistics, sys
out = sys.argv[1]
rows = {}
for line in open(f"{out}/cost.txt"):
    round_, condition, loop, gpt2 = line.split()
    rows.setdefault(condition, []).append((float(loop.split("=")[1]), float(gpt2.split("=")[1])))
print("condition  loop us/launch (median of rounds, each)       GPT-2 ms/token (median, each)")
for condition in ("untraced", "run", "stacks"):
    loop = [r[0] for r in rows.get(condition, [])]
    gpt2 = [r[1] for r in rows.get(condition, [])]
    print(f"{condition:9}  {statistics.median(loop):6.2f} {[round(x, 2) for x in loop]}"
          f"  {statistics.median(gpt2):6.3f} {[round(x, 3) for x in gpt2]}")
med = {c: (statistics.median([r[0] for r in v]), statistics.median([r[1] for r in v])) for c, v in rows.items()}
print(f"launch loop: --stacks {med['stacks'][0] - med['run'][0]:+.2f} us/launch over run, "
      f"x{med['stacks'][0] / med['untraced'][0]:.3f} of untraced (run x{med['run'][0] / med['untraced'][0]:.3f})")
print(f"GPT-2 decode: --stacks x{med['stacks'][1] / med['untraced'][1]:.3f} of untraced "
      f"(run x{med['run'][1] / med['untraced'][1]:.3f})")
EOF
exit $status
