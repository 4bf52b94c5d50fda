#!/usr/bin/env bash
# GPU validation of `cudatrace run --gpu` (issue 11), for docs/validation.md and
# BENCHMARKS.md. As root, on the GPU machine, from the repository root:
#
#   workloads/validate_gpu_activity.sh path/to/cudatrace OUTDIR [ROUNDS]
#
# (build here with `cargo xtask build-ebpf && cargo build --release` and carry
# target/release/cudatrace over: the injection library is inside it.)
#
# 1. Kernels against launches: the MLP, GPT-2 and the launch loop under `run --gpu`;
#    workloads/gpu_activity_check.py checks that kernel lines == successful launch calls and
#    every kernel, copy and memset line is linked to one call of its kind, nothing lost.
# 2. Durations against CUDA events: workloads/matmul_events.py times ~1 ms matmuls with
#    torch.cuda.Event; each must agree with the GPU time cudatrace recorded within 2% or
#    5 us, whichever is larger.
# 3. Overhead: the launch loop (us per launch) and GPT-2 (ms per generated token, 100
#    tokens) untraced, under `run`, `run --gpu` and torch.profiler, ROUNDS (default 6)
#    rounds interleaved; the trace sizes of `run` and `run --gpu`.
#
# Prints markdown tables at the end (also in OUTDIR/tables.md); every trace, log and
# check is in OUTDIR. Exit code 1 if a check failed.
set -uo pipefail
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=${2:?output folder}
rounds=${3:-6}
here=$(dirname "$0")
mkdir -p "$out"
status=0

{
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    "$cudatrace" --version
} 2>&1 | tee "$out/machine.txt"

# ---- 1 and 2: correctness ----
check() {
    local name=$1
    shift
    echo "== $name: cudatrace run --gpu -- $*"
    "$cudatrace" run --gpu -o "$out/$name.gpu.jsonl" -- "$@" >"$out/$name.stdout" 2>"$out/$name.log"
    echo "exit code $?" | tee -a "$out/$name.log"
    tail -n 12 "$out/$name.log"
}
check mlp python3 "$here/simple_inference.py"
check transformer python3 "$here/transformer_inference.py"
check launch_loop python3 "$here/launch_loop.py" --iters 30000 --repeats 3
check matmul python3 "$here/matmul_events.py" --iters 50 --target-ms 1.0
for name in mlp transformer launch_loop; do
    python3 "$here/gpu_activity_check.py" "$out/$name.gpu.jsonl" --name "$name" \
        --json "$out/$name.check.json" | tee "$out/$name.check.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
python3 "$here/gpu_activity_check.py" "$out/matmul.gpu.jsonl" --name matmul \
    --events "$out/matmul.stdout" --json "$out/matmul.check.json" | tee "$out/matmul.check.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
"$cudatrace" summary "$out/transformer.gpu.jsonl" >"$out/transformer.summary.txt"
"$cudatrace" export "$out/transformer.gpu.jsonl" --format perfetto 2>>"$out/transformer.log"
"$cudatrace" plot "$out/transformer.gpu.jsonl" -o "$out/transformer.gpu.svg" 2>>"$out/transformer.log"

# ---- 3: overhead, interleaved rounds ----
loop=(python3 "$here/launch_loop.py" --iters 30000 --repeats 3)
gpt2=(python3 "$here/transformer_inference.py" --tokens 100)
: >"$out/overhead.txt"
for round in $(seq "$rounds"); do
    echo "== overhead round $round of $rounds"
    for workload in loop gpt2; do
        if [ "$workload" = loop ]; then cmd=("${loop[@]}"); else cmd=("${gpt2[@]}"); fi
        for mode in untraced run run_gpu profiler; do
            trace="$out/overhead.$workload.$mode.jsonl"
            case $mode in
                untraced) "${cmd[@]}" >"$out/last.stdout" 2>>"$out/overhead.log" ;;
                run) "$cudatrace" run -q -o "$trace" -- "${cmd[@]}" >"$out/last.stdout" 2>>"$out/overhead.log" ;;
                run_gpu) "$cudatrace" run -q --gpu -o "$trace" -- "${cmd[@]}" >"$out/last.stdout" 2>>"$out/overhead.log" ;;
                profiler) "${cmd[@]}" --profiler >"$out/last.stdout" 2>>"$out/overhead.log" ;;
            esac
            size=0
            lines=0
            if [ -f "$trace" ]; then
                size=$(stat -c %s "$trace")
                lines=$(wc -l <"$trace")
            fi
            python3 - "$workload" "$mode" "$round" "$size" "$lines" "$out/last.stdout" \
                >>"$out/overhead.txt" <<'PY'
import json, re, sys
workload, mode, round_, size, lines, stdout = sys.argv[1:]
text = open(stdout).read()
row = {"workload": workload, "mode": mode, "round": int(round_),
       "trace_bytes": int(size), "trace_lines": int(lines)}
if workload == "loop":
    result = json.loads(text.strip().splitlines()[-1])
    row["value"] = result["us_per_iter_median"]
    row["postprocess_s"] = result.get("profiler_postprocess_s")
else:
    row["value"] = float(re.search(r"per token: ([0-9.]+) ms", text).group(1))
    post = re.search(r"profiler post-processing: ([0-9.]+) s", text)
    row["postprocess_s"] = float(post.group(1)) if post else None
print(json.dumps(row))
PY
        done
    done
done

python3 - "$out" <<'PY' | tee "$out/tables.md"
import collections, json, statistics, sys
out = sys.argv[1]
print("## Kernels against launches (`cudatrace run --gpu`)\n")
print("| workload | successful launches | kernel lines | kernels linked to one launch | copies | memsets | unlinked | ok |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for name in ("mlp", "transformer", "launch_loop", "matmul"):
    try:
        c = json.load(open(f"{out}/{name}.check.json"))
    except FileNotFoundError:
        print(f"| {name} | (no check) | | | | | | FAIL |")
        continue
    unlinked = c["gpu_kernel_unlinked"] + c["gpu_copy_unlinked"] + c["gpu_memset_unlinked"]
    print(f"| {name} | {c['launches']:,} | {c['gpu_kernel']:,} | "
          f"{c['gpu_kernel'] - c['gpu_kernel_unlinked']:,} | {c['gpu_copy']:,} | "
          f"{c['gpu_memset']:,} | {unlinked} | {'ok' if c['ok'] else 'FAIL'} |")
try:
    m = json.load(open(f"{out}/matmul.check.json"))
    print("\n## GPU durations against CUDA events (float32 matmul, TF32 off)\n")
    print("| size | matmuls | within 2% or 5 µs | event median | cudatrace − event, median | max abs difference |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {m['matmul_size']} | {m['matmuls']} | {m['matmuls_within']} | "
          f"{m['event_median_us']:.1f} µs | {m['diff_median_us']:+.2f} µs | {m['diff_max_abs_us']:.2f} µs |")
except (FileNotFoundError, KeyError):
    print("\n(no matmul figures: see matmul.check.txt)")

rows = [json.loads(line) for line in open(f"{out}/overhead.txt")]
by = collections.defaultdict(list)
for r in rows:
    by[(r["workload"], r["mode"])].append(r)
modes = ("untraced", "run", "run_gpu", "profiler")
labels = {"loop": "launch loop, µs per launch", "gpt2": "GPT-2, ms per token (100 tokens)"}
n = max((r["round"] for r in rows), default=0)
print(f"\n## Overhead: median of {n} interleaved rounds\n")
print("| workload | untraced | `run` | `run --gpu` | torch.profiler | profiler post-processing |")
print("|---|---:|---:|---:|---:|---:|")
for workload in ("loop", "gpt2"):
    base = statistics.median(r["value"] for r in by[(workload, "untraced")])
    cells = []
    for mode in modes:
        med = statistics.median(r["value"] for r in by[(workload, mode)])
        cells.append(f"{med:.2f} (×{med / base:.2f})")
    post = [r["postprocess_s"] for r in by[(workload, "profiler")] if r["postprocess_s"] is not None]
    cells.append(f"{statistics.median(post):.2f} s" if post else "")
    print(f"| {labels[workload]} | " + " | ".join(cells) + " |")
print("\nPer round (value per mode, in round order):\n")
for workload in ("loop", "gpt2"):
    for mode in modes:
        values = ", ".join(f"{r['value']:.2f}" for r in sorted(by[(workload, mode)], key=lambda r: r["round"]))
        print(f"- {labels[workload]}, {mode}: {values}")
print("\n## Trace size (last round)\n")
print("| workload | `run` | `run --gpu` | lines (`run` / `run --gpu`) |")
print("|---|---:|---:|---:|")
for workload in ("loop", "gpt2"):
    last = {m: max(by[(workload, m)], key=lambda r: r["round"]) for m in ("run", "run_gpu")}
    print(f"| {labels[workload]} | {last['run']['trace_bytes'] / 2**20:.1f} MiB | "
          f"{last['run_gpu']['trace_bytes'] / 2**20:.1f} MiB | "
          f"{last['run']['trace_lines']:,} / {last['run_gpu']['trace_lines']:,} |")
PY
echo "status $status (0: every check passed)"
exit $status
