#!/usr/bin/env bash
# GPU benchmarks (issues 7, 14 and 16): every figure of BENCHMARKS.md's GPU sections comes
# from one of this script's parts. Usage, as root:
#
#   workloads/bench_gpu.sh CUDATRACE OUTDIR [ROUNDS] [PARTS]
#
# ROUNDS (default 5): rounds of each part. PARTS (default `loop`), comma-separated:
#
# - loop: the launch-bound loop (launch_loop.py, 101,000 launches of `x.add_(1)` per run)
#   under each condition of $CONDITIONS, interleaved: every round runs each condition once,
#   in an order rotated from round to round, so drift hits all alike. Conditions:
#     untraced       no tracing
#     floor_entry    the kernel's bare tracefs `p:` uprobe event on cuLaunchKernel itself,
#                    in a tracefs instance of its own (no BPF program): the trap alone
#     floor_pair     tracefs `p:` + `r:` on cuLaunchKernel: the uprobe+uretprobe floor
#     cudatrace      cudatrace run
#     cudatrace_stats  cudatrace run with CUDATRACE_BPF_STATS=1: the kernel's run time and
#                    count of each of cudatrace's programs (BPF_ENABLE_STATS for the run;
#                    this costs every program run two clock reads, hence its own condition)
#     lean, lean_stats  the same with --launch-entry-only (skipped where the binary lacks it)
#     cudatrace_kernel  cudatrace run --kernel
#     bystander      the loop untraced while `cudatrace run` traces another CUDA process
#     torch_profiler the loop inside torch.profiler (CPU + CUDA); not in the default list
#                    (its post-processing takes tens of seconds per run)
#   Default: all but torch_profiler. About 6 s per run: 5 rounds of the 9 defaults take
#   about 5 minutes.
# - wall: simple_inference.py and transformer_inference.py, untraced and under cudatrace run.
# - rate: the stand-in bench loop (no GPU involved) at paced rates under cudatrace run
#   pinned to CPUs 0-1 with the loop on CPUs 2-15: set STANDIN to a folder holding the
#   stand-in libcuda.so.1 and cudatrace-bench-loop (`cargo xtask bench` builds them into
#   target/standin/; carry that folder).
#
# Raw figures stay in OUTDIR (loop.jsonl: one line per run; *.stderr: each run's stderr;
# wall.txt, rate.jsonl); the tables are printed as markdown at the end (and kept in
# OUTDIR/tables.md).
set -uo pipefail
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=$(realpath -m "${2:?output folder}")
rounds=${3:-5}
parts=${4:-loop}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
loop_cmd=(python3 "$here/launch_loop.py" --iters 20000 --repeats 5)
launches=$((1000 + 20000 * 5))

has_lean=0
"$cudatrace" run --help 2>/dev/null | grep -q -- --launch-entry-only && has_lean=1
default_conditions="untraced floor_entry floor_pair cudatrace cudatrace_stats"
[ "$has_lean" = 1 ] && default_conditions+=" lean lean_stats"
default_conditions+=" cudatrace_kernel bystander"
read -r -a conditions <<<"${CONDITIONS:-$default_conditions}"

# --- the bare tracefs floor on cuLaunchKernel -------------------------------------------
tracefs=/sys/kernel/tracing
[ -e "$tracefs/uprobe_events" ] || mount -t tracefs nodev "$tracefs" 2>/dev/null
[ -e "$tracefs/uprobe_events" ] || tracefs=/sys/kernel/debug/tracing
group=cudatrace_gpu_bench
instance="$tracefs/instances/$group"
floor_off() {
    # (Braces: the redirection's own error, with no instance, goes to /dev/null too.)
    { echo 0 >"$instance/events/$group/enable"; } 2>/dev/null
    rmdir "$instance" 2>/dev/null
    for event in launch_entry launch_return; do
        grep -q "$group/$event " "$tracefs/uprobe_events" 2>/dev/null &&
            echo "-:$group/$event" >>"$tracefs/uprobe_events"
    done
    return 0
}
cleanup() {
    floor_off
    [ -n "${bystander_pid:-}" ] && kill -TERM "$bystander_pid" 2>/dev/null && wait "$bystander_pid"
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM
floor_off # leftovers of an interrupted run

libcuda=$(realpath "$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')")
# The file offset of cuLaunchKernel: its address less its LOAD segment's address plus the
# segment's file offset (tracefs takes file offsets).
launch_offset=$(python3 "$here/file_offset.py" "$libcuda" cuLaunchKernel)
echo "libcuda $libcuda, cuLaunchKernel at file offset $launch_offset" | tee "$out/setup.txt"

floor_on() { # $1: entry | pair
    echo "p:$group/launch_entry $libcuda:$launch_offset" >>"$tracefs/uprobe_events" || return 1
    [ "$1" = pair ] && { echo "r:$group/launch_return $libcuda:$launch_offset" >>"$tracefs/uprobe_events" || return 1; }
    mkdir "$instance" && echo 8192 >"$instance/buffer_size_kb" &&
        echo 1 >"$instance/events/$group/enable"
}
floor_records() { # entries + overruns over every CPU's buffer
    cat "$instance"/per_cpu/cpu*/stats | awk '/^(entries|overrun):/{n += $2} END {print n + 0}'
}

# --- one run of the loop under one condition: a JSON line into loop.jsonl ---------------
run_condition() { # $1: condition, $2: round
    local name=$1 round=$2 err="$out/$1-$2.stderr" result extra='{}'
    case $name in
    untraced) result=$("${loop_cmd[@]}" 2>"$err") ;;
    floor_entry | floor_pair)
        floor_on "${name#floor_}" || { echo "cannot set up $name" >&2; floor_off; return 1; }
        result=$("${loop_cmd[@]}" 2>"$err")
        extra="{\"records\": $(floor_records)}"
        floor_off ;;
    cudatrace) result=$("$cudatrace" run -q -o "$out/trace.jsonl" -- "${loop_cmd[@]}" 2>"$err") ;;
    cudatrace_stats)
        result=$(CUDATRACE_BPF_STATS=1 "$cudatrace" run -q -o "$out/trace.jsonl" -- "${loop_cmd[@]}" 2>"$err") ;;
    lean) result=$("$cudatrace" run -q --launch-entry-only -o "$out/trace.jsonl" -- "${loop_cmd[@]}" 2>"$err") ;;
    lean_stats)
        result=$(CUDATRACE_BPF_STATS=1 "$cudatrace" run -q --launch-entry-only -o "$out/trace.jsonl" -- "${loop_cmd[@]}" 2>"$err") ;;
    cudatrace_kernel) result=$("$cudatrace" run -q --kernel -o "$out/trace.jsonl" -- "${loop_cmd[@]}" 2>"$err") ;;
    torch_profiler) result=$("${loop_cmd[@]}" --profiler 2>"$err") ;;
    bystander)
        rm -f "$out/bystander.jsonl"
        "$cudatrace" run -q -o "$out/bystander.jsonl" -- python3 -c \
            'import time, torch; torch.zeros(1, device="cuda"); torch.cuda.synchronize(); time.sleep(3600)' \
            2>"$out/bystander-tracer-$round.stderr" &
        bystander_pid=$!
        local waited=0
        until grep -q '"type":"call"' "$out/bystander.jsonl" 2>/dev/null; do
            sleep 0.2
            waited=$((waited + 1))
            if [ "$waited" -ge 300 ] || ! kill -0 "$bystander_pid" 2>/dev/null; then
                echo "bystander round $round: the traced process made no call in 60 s (see $out/bystander-tracer-$round.stderr)" >&2
                kill -TERM "$bystander_pid" 2>/dev/null; wait "$bystander_pid"; bystander_pid=
                return 1
            fi
        done
        sleep 2
        result=$("${loop_cmd[@]}" 2>"$err")
        kill -TERM "$bystander_pid"; wait "$bystander_pid"; bystander_pid=
        cp "$out/bystander.jsonl" "$out/bystander-$round.jsonl" ;;
    *) echo "unknown condition $name" >&2; return 1 ;;
    esac
    case $name in cudatrace*|lean*) tail -1 "$out/trace.jsonl" >"$out/$name-$round.footer.json" ;; esac
    [ -n "$result" ] || { echo "$name round $round: no result (see $err)" >&2; return 1; }
    python3 -c 'import json, sys
r = json.loads(sys.argv[1]); r.update(json.loads(sys.argv[4]))
r["condition"], r["round"] = sys.argv[2], int(sys.argv[3])
print(json.dumps(r))' "$result" "$name" "$round" "$extra" >>"$out/loop.jsonl"
    printf '%-18s round %s: %6.2f us/launch\n' "$name" "$round" \
        "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["us_per_iter_median"])' "$result")"
}

if [[ ,$parts, == *,loop,* ]]; then
    rm -f "$out/loop.jsonl"
    for round in $(seq "$rounds"); do
        n=${#conditions[@]}
        for i in $(seq 0 $((n - 1))); do
            run_condition "${conditions[$(((i + round - 1) % n))]}" "$round"
        done
    done
fi

if [[ ,$parts, == *,wall,* ]]; then
    rm -f "$out/wall.txt"
    for workload in simple_inference transformer_inference; do
        for round in $(seq "$rounds"); do
            start=$EPOCHREALTIME
            python3 "$here/$workload.py" >/dev/null
            mid=$EPOCHREALTIME
            "$cudatrace" run -q -o "$out/wall.jsonl" -- python3 "$here/$workload.py" >/dev/null
            end=$EPOCHREALTIME
            echo "$workload $start $mid $end" >>"$out/wall.txt"
        done
    done
fi

if [[ ,$parts, == *,rate,* ]]; then
    standin=$(realpath "${STANDIN:?set STANDIN to the folder with the stand-in libcuda.so.1 and cudatrace-bench-loop}")
    rm -f "$out/rate.jsonl"
    # The machine's own LD_LIBRARY_PATH would load the real libcuda: the stand-in's first.
    export LD_LIBRARY_PATH="$standin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    for round in $(seq "$rounds"); do
        for spec in "8 500000" "8 1000000" "8 0" "12 0"; do
            read -r threads rate <<<"$spec"
            result=$(taskset -c 0,1 "$cudatrace" run -q --libcuda "$standin/libcuda.so.1" \
                -o "$out/rate.trace.jsonl" -- taskset -c 2-15 \
                "$standin/cudatrace-bench-loop" 1000000 "$rate" "$threads" 2>"$out/rate.stderr")
            footer=$(tail -1 "$out/rate.trace.jsonl")
            python3 -c 'import json, sys
r = json.loads(sys.argv[1]); f = json.loads(sys.argv[2])
r.update(round=int(sys.argv[3]), traced=f["events"]["call"], lost=f["lost"]["calls"])
print(json.dumps(r))' "$result" "$footer" "$round" >>"$out/rate.jsonl"
        done
    done
fi

python3 - "$out" "$launches" <<'PY' | tee "$out/tables.md"
import collections, glob, json, os, re, statistics, sys
out, launches = sys.argv[1], int(sys.argv[2])
med = statistics.median

if os.path.exists(f"{out}/loop.jsonl"):
    runs = [json.loads(l) for l in open(f"{out}/loop.jsonl")]
    by = collections.defaultdict(dict)  # condition -> round -> us
    for r in runs:
        by[r["condition"]][r["round"]] = r["us_per_iter_median"]
    base = by.get("untraced", {})
    rounds = sorted(base)
    def per_round(name, f):
        return [f(by[name][k], k) for k in rounds if k in by[name]]
    def fmt(values):
        return ", ".join(f"{v:.2f}" for v in values)
    labels = {
        "untraced": "untraced", "floor_entry": "tracefs `p:` on cuLaunchKernel (entry floor)",
        "floor_pair": "tracefs `p:`+`r:` on cuLaunchKernel (pair floor)",
        "cudatrace": "`cudatrace run`", "cudatrace_stats": "`cudatrace run`, BPF stats on",
        "lean": "`cudatrace run --launch-entry-only`",
        "lean_stats": "`cudatrace run --launch-entry-only`, BPF stats on",
        "cudatrace_kernel": "`cudatrace run --kernel`",
        "bystander": "untraced, beside `cudatrace run` of another process",
        "torch_profiler": "torch.profiler (CPU + CUDA)",
    }
    print(f"Launch loop: µs per `x.add_(1)` (each run: median of 5 timed loops of 20,000), "
          f"{len(rounds)} interleaved rounds; ratio = per-round ratio to untraced, median")
    print()
    print("| condition | median µs | ×untraced | added µs | rounds (µs) |")
    print("|---|---:|---:|---:|---|")
    for name in labels:
        if name not in by:
            continue
        values = [by[name][k] for k in sorted(by[name])]
        ratios = per_round(name, lambda v, k: v / base[k])
        added = per_round(name, lambda v, k: v - base[k])
        print(f"| {labels[name]} | {med(values):.2f} | {med(ratios):.3f} | {med(added):.2f} | {fmt(values)} |")
    print()

    def stats_of(name):
        """Per round: (calls of each program, ns per run) from the cudatrace stderr lines."""
        result = {}
        for k in rounds:
            path = f"{out}/{name}-{k}.stderr"
            if not os.path.exists(path):
                continue
            programs = {}
            for m in re.finditer(r"bpf-stats (\S+) id=\d+ run_cnt=(\d+) run_time_ns=(\d+)", open(path).read()):
                cnt, ns = int(m[2]), int(m[3])
                prev = programs.get(m[1], (0, 0))
                programs[m[1]] = (prev[0] + cnt, prev[1] + ns)
            result[k] = programs
        return result

    def breakdown(run, stats_run, floor, title):
        if run not in by or floor not in by or stats_run not in by:
            return
        stats = stats_of(stats_run)
        rows = []
        for k in rounds:
            if k not in by[run] or k not in by[floor] or k not in stats:
                continue
            prog = stats[k]
            enter = prog.get("call_enter", (0, 0))
            ret = prog.get("call_return", (0, 0))
            ns_enter = enter[1] / enter[0] if enter[0] else 0.0
            ns_ret = ret[1] / ret[0] if ret[0] else 0.0
            # Program time per probed call: with --launch-entry-only call_return runs for
            # the few calls that are not launches, not once per launch.
            ns_programs = (enter[1] + ret[1]) / enter[0] if enter[0] else 0.0
            added = (by[run][k] - base[k]) * 1000
            floor_added = (by[floor][k] - base[k]) * 1000
            rows.append((k, added, floor_added, added / floor_added, ns_enter, ns_ret,
                         enter[0], ret[0], ns_programs))
        if not rows:
            return
        print(f"{title}: ns per launch, per round")
        print()
        print("| round | added by cudatrace | added by the floor | ratio | call_enter ns/run | call_return ns/run | programs per call | traps and the rest | call_enter runs | call_return runs |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k, added, floor_added, ratio, ne, nr, ce, cr, np in rows:
            print(f"| {k} | {added:.0f} | {floor_added:.0f} | {ratio:.3f} | {ne:.0f} | {nr:.0f} | {np:.0f} | {added - np:.0f} | {ce} | {cr} |")
        cols = list(zip(*rows))
        print(f"| median | {med(cols[1]):.0f} | {med(cols[2]):.0f} | {med(cols[3]):.3f} | {med(cols[4]):.0f} | {med(cols[5]):.0f} | {med(cols[8]):.0f} | {med([a - p for a, p in zip(cols[1], cols[8])]):.0f} | | |")
        print()
        print(f"Runs counted: {launches} launches per loop run plus the process's other driver "
              "calls (start-up); ns/run is over all of them.")
        print()

    breakdown("cudatrace", "cudatrace_stats", "floor_pair",
              "cudatrace run against the uprobe+uretprobe floor (target: ratio at most 1.15)")
    breakdown("lean", "lean_stats", "floor_entry",
              "--launch-entry-only against the uprobe floor (target: at most 1.10 x untraced)")
    floor_runs = [r for r in runs if "records" in r]
    if floor_runs:
        print("tracefs floor records per run (entry+return events; at least "
              f"{launches} or {2 * launches}): "
              + ", ".join(f"{r['condition']} {r['records']}" for r in floor_runs))
        print()
    strays, scope = 0, None
    for path in glob.glob(f"{out}/bystander-*.jsonl"):
        lines = [json.loads(l) for l in open(path)]
        command = lines[0]["pids"][0]
        strays += sum(1 for l in lines if l["type"] == "call" and l["pid"] != command)
        scope = lines[0].get("attach", {}).get("scope")
    if scope is not None:
        print(f"bystander traces: attach scope {scope}, calls of other pids: {strays} (must be 0)")
        print()

if os.path.exists(f"{out}/wall.txt"):
    walls = collections.defaultdict(lambda: ([], []))
    for line in open(f"{out}/wall.txt"):
        w, start, mid, end = line.split()
        walls[w][0].append(float(mid) - float(start)); walls[w][1].append(float(end) - float(mid))
    print("| workload | untraced s | `cudatrace run` s | × | rounds untraced / traced |")
    print("|---|---:|---:|---:|---|")
    for w, (b, t) in walls.items():
        print(f"| {w} | {med(b):.2f} | {med(t):.2f} | {med(t) / med(b):.2f} | "
              f"{', '.join(f'{x:.2f}' for x in b)} / {', '.join(f'{x:.2f}' for x in t)} |")
    print()

if os.path.exists(f"{out}/rate.jsonl"):
    print("Stand-in loop under `taskset -c 0,1 cudatrace run`, loop on CPUs 2-15 (median of rounds)")
    print()
    print("| loop threads | target calls/s | achieved calls/s | calls traced | lost | rounds (achieved) |")
    print("|---:|---:|---:|---:|---:|---|")
    groups = collections.defaultdict(list)
    for line in open(f"{out}/rate.jsonl"):
        r = json.loads(line)
        groups[(r["threads"], r["target_calls_per_s"])].append(r)
    for (threads, target), rs in groups.items():
        achieved = [r["calls_per_s"] for r in rs]
        print(f"| {threads} | {target or 'flat out'} | {med(achieved):,.0f} | {med([r['traced'] for r in rs]):,.0f} | "
              f"{max(r['lost'] for r in rs)} | {', '.join(f'{a:,.0f}' for a in achieved)} |")
PY
