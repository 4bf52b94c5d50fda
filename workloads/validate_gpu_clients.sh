#!/usr/bin/env bash
# GPU validation of issue 24 (docs/validation.md, run J; BENCHMARKS.md). As root, on the
# GPU machine, from the repository root:
#
#   workloads/validate_gpu_clients.sh CUDATRACE OUTDIR [ROUNDS] [PARTS]
#
# CUDATRACE is this branch's binary (the injection library is inside it). Optional, beside
# it: cudatrace-main (main's binary: the `--gpu` before issue 24, for the cost table) and
# libcudatrace_inject.so (the library alone: CUPTI's own cost without cudatrace).
# PARTS (default all): comma-separated of
#   profiler  workloads/profiler_inside.py (100 + 200 inside torch.profiler + 300 launches)
#             untraced, then under `run --gpu`: 400 launches with GPU work, 200 in the gap,
#             torch.profiler sees its 200 both times;
#   graphs    workloads/compile_graphs.py (torch.compile reduce-overhead, 50 replays) under
#             `run --gpu`: captured launches marked, every graph kernel linked to its replay
#             and to its capture call;
#   jax       workloads/jax_step.py (a jitted step, 30 steps) under `run --gpu`: names equal
#             the launches', CUPTI's disagreements counted;
#   cost      the launch loop (launch_loop.py, 2 x 20,000 x.add_(1)) in ROUNDS (default 6)
#             interleaved rounds: untraced, `run`, `run --launch-entry-only`, `run --gpu`,
#             main's `run --gpu`, the injection library alone (CUPTI, no uprobes) and
#             torch.profiler; the median µs per launch of each run, and its ratio to the
#             round's untraced run.
# Results in OUTDIR (traces are removed after checking, but for the small ones); the
# tables are printed at the end (OUTDIR/tables.md). Exit 1 if a check failed.
set -uo pipefail
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=$(realpath -m "${2:?output folder}")
rounds=${3:-6}
parts=${4:-profiler,graphs,jax,cost}
here=$(cd "$(dirname "$0")" && pwd)
bin=$(dirname "$cudatrace")
mkdir -p "$out"
status=0
has() { [[ ",$parts," == *",$1,"* ]]; }

{
    date -u
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
    "$cudatrace" --version
} 2>&1 | tee "$out/machine.txt"

run_gpu() {
    local name=$1
    shift
    "$cudatrace" run --gpu -o "$out/$name.jsonl" -- "$@" >"$out/$name.stdout" 2>"$out/$name.log"
    echo "exit $?" >>"$out/$name.log"
}

check() {
    local name=$1
    shift
    python3 "$here/gpu_clients_check.py" "$out/$name.jsonl" "$@" >"$out/$name.check.json"
    local rc=$?
    [ "$rc" = 0 ] || status=1
    echo "== $name: check exit $rc"
    tail -n 5 "$out/$name.log"
}

if has profiler; then
    python3 "$here/profiler_inside.py" >"$out/profiler_untraced.stdout" 2>"$out/profiler_untraced.log"
    cat "$out/profiler_untraced.stdout"
    run_gpu profiler python3 "$here/profiler_inside.py"
    cat "$out/profiler.stdout"
    check profiler --part profiler --stdout "$out/profiler.stdout"
    "$cudatrace" summary "$out/profiler.jsonl" >"$out/profiler.summary.txt" 2>&1
fi
if has graphs; then
    run_gpu graphs python3 "$here/compile_graphs.py" --calls 50
    check graphs --part graphs
    "$cudatrace" summary "$out/graphs.jsonl" >"$out/graphs.summary.txt" 2>&1
fi
if has jax; then
    run_gpu jax python3 "$here/jax_step.py" --steps 30
    check jax --part jax
    "$cudatrace" summary "$out/jax.jsonl" >"$out/jax.summary.txt" 2>&1
fi

if has cost; then
    loop=(python3 "$here/launch_loop.py" --iters 20000 --repeats 2)
    # The libcupti `run --gpu` finds: PyTorch's wheel's.
    cupti=$(python3 -c 'import glob, site
found = [p for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/cu*/lib/libcupti.so*")]
print(sorted(found)[0] if found else "")' 2>/dev/null)
    modes="untraced run entry_only run_gpu profiler"
    [ -x "$bin/cudatrace-main" ] && modes+=" run_gpu_main"
    [ -f "$bin/libcudatrace_inject.so" ] && [ -n "$cupti" ] && modes+=" cupti_only"
    : >"$out/cost.jsonl"
    for round in $(seq 1 "$rounds"); do
        read -r -a order <<<"$modes"
        # Rotate the order from round to round: drift hits every mode alike.
        shift_by=$(( (round - 1) % ${#order[@]} ))
        order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
        for mode in "${order[@]}"; do
            trace="$out/cost.trace.jsonl"
            case $mode in
                untraced) "${loop[@]}" >"$out/last.stdout" 2>>"$out/cost.log" ;;
                run) "$cudatrace" run -q -o "$trace" -- "${loop[@]}" >"$out/last.stdout" 2>>"$out/cost.log" ;;
                entry_only) "$cudatrace" run -q --launch-entry-only -o "$trace" -- "${loop[@]}" >"$out/last.stdout" 2>>"$out/cost.log" ;;
                run_gpu) "$cudatrace" run -q --gpu -o "$trace" -- "${loop[@]}" >"$out/last.stdout" 2>>"$out/cost.log" ;;
                run_gpu_main) "$bin/cudatrace-main" run -q --gpu -o "$trace" -- "${loop[@]}" >"$out/last.stdout" 2>>"$out/cost.log" ;;
                cupti_only) CUDA_INJECTION64_PATH="$bin/libcudatrace_inject.so" CUDATRACE_CUPTI="$cupti" \
                    CUDATRACE_INJECT_STDERR=0 "${loop[@]}" >"$out/last.stdout" 2>>"$out/cost.log" ;;
                profiler) "${loop[@]}" --profiler >"$out/last.stdout" 2>>"$out/cost.log" ;;
            esac
            python3 - "$mode" "$round" "$out/last.stdout" "$trace" >>"$out/cost.jsonl" <<'PY'
import json, os, sys
mode, round_, path, trace = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    result = json.loads(open(path).read().strip().splitlines()[-1])
except Exception as e:
    result = {"error": str(e)}
row = {"mode": mode, "round": round_, "us": result.get("us_per_iter_median"),
       "all": result.get("us_per_iter_all"), "check_ok": result.get("check_ok"),
       "postprocess_s": result.get("profiler_postprocess_s")}
if os.path.exists(trace):
    row["trace_bytes"] = os.path.getsize(trace)
    with open(trace, "rb") as f:
        f.seek(max(0, row["trace_bytes"] - 65536))
        last = f.read().splitlines()[-1]
    try:
        footer = json.loads(last)
        row["lost"] = footer.get("lost", {}).get("total")
        row["issuing"] = footer.get("gpu", {}).get("issuing")
        row["calls"] = footer.get("events", {}).get("call")
        row["gpu_kernel"] = footer.get("events", {}).get("gpu_kernel")
    except Exception as e:
        row["footer_error"] = str(e)
    os.remove(trace)
print(json.dumps(row))
PY
        done
    done
fi

python3 - "$out" "$rounds" <<'PY' | tee "$out/tables.md"
import json, os, statistics, sys
out = sys.argv[1]
def load(name):
    path = os.path.join(out, name + ".check.json")
    return json.load(open(path)) if os.path.exists(path) else None
p = load("profiler")
if p:
    prog = p.get("program", {})
    untraced = json.loads(open(os.path.join(out, "profiler_untraced.stdout")).read().strip().splitlines()[-1])
    print("| profiler-inside | value |\n|---|---|")
    print(f"| x.add_ launches (before, profiled, after) | {p['add_launches']} ({prog.get('before')}, {prog.get('profiled')}, {prog.get('after')}) |")
    print(f"| with GPU work, by part | {p['with_work_by_part']} |")
    print(f"| in the gap, by part | {p['in_gap_by_part']} |")
    print(f"| gaps | {p['gaps']} ({p['gap_ms']} ms) |")
    print(f"| torch.profiler's kernels: untraced, under --gpu | {untraced['profiler_kernels']}, {prog.get('profiler_kernels')} |")
    print(f"| torch.profiler's GPU µs: untraced, under --gpu | {untraced['profiler_gpu_us']:.1f}, {prog.get('profiler_gpu_us', 0):.1f} |")
    print(f"| footer issuing | {p['issuing']} |")
    print(f"| lost | {p['lost']} |")
    print(f"| checks | {p['checks']} |\n")
for name in ("graphs", "jax"):
    g = load(name)
    if not g:
        continue
    print(f"| {name} | value |\n|---|---|")
    for key in ("launch_calls", "launch_lines_with_cupti_result", "graph_launch_calls", "kernel_lines",
                "captured_calls", "captured_launches", "graph_work_lines", "replays",
                "graph_work_linked_to_replay", "graph_work_linked_to_capture_call",
                "capture_call_is_a_captured_call_of_its_kernel", "direct_kernels",
                "direct_kernels_named_as_their_launch", "cupti_kernel_lines", "name_mismatches",
                "graph_nodes", "issuing", "unlinked", "lost", "checks"):
        print(f"| {key} | {g.get(key)} |")
    print()
path = os.path.join(out, "cost.jsonl")
if os.path.exists(path):
    rows = [json.loads(l) for l in open(path)]
    by_round = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["mode"]] = r
    modes = [m for m in ("untraced", "run", "entry_only", "run_gpu", "run_gpu_main", "cupti_only", "profiler")
             if any(m in rr for rr in by_round.values())]
    print("| mode | median µs/launch | × untraced (median of rounds) | rounds (×) | trace MB |")
    print("|---|---|---|---|---|")
    for m in modes:
        us = [rr[m]["us"] for rr in by_round.values() if m in rr and rr[m]["us"]]
        ratios = [rr[m]["us"] / rr["untraced"]["us"] for rr in by_round.values()
                  if m in rr and "untraced" in rr and rr[m]["us"] and rr["untraced"]["us"]]
        sizes = [rr[m].get("trace_bytes", 0) / 1e6 for rr in by_round.values() if m in rr and rr[m].get("trace_bytes")]
        size = f"{statistics.median(sizes):.1f}" if sizes else "-"
        print(f"| {m} | {statistics.median(us):.2f} | ×{statistics.median(ratios):.2f} | "
              f"{', '.join(f'{r:.2f}' for r in ratios)} | {size} |" if us else f"| {m} | - | - | - | - |")
    post = [rr["profiler"]["postprocess_s"] for rr in by_round.values() if "profiler" in rr and rr["profiler"].get("postprocess_s")]
    if post:
        print(f"\ntorch.profiler post-processing: median {statistics.median(post):.1f} s per run")
PY
exit $status
