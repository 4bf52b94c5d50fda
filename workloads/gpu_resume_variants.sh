#!/usr/bin/env bash
# Diagnostic (issue 24, docs/gpu.md "Beside another CUPTI client"): how the injection
# library takes CUPTI back after torch.profiler. As root, on the GPU machine:
#
#   workloads/gpu_resume_variants.sh CUDATRACE OUTDIR WAY...
#
# For each WAY (a CUDATRACE_INJECT_RESUME value: kind, functions, all, reset, with
# ,flush or ,heal), runs workloads/profiler_inside.py (100 + 200 inside torch.profiler +
# 300 launches) under `run --gpu` with CUDATRACE_INJECT_VERBOSE=1 and prints one line:
# launches with work by part (the goal: [100, 0, 300]), in the gap, the footer's issuing
# and api_records, then the library's account of taking CUPTI back. OUTDIR keeps each
# run's stdout, stderr (the library's buffer lines), check and footer; traces are removed.
set -uo pipefail
cudatrace=$(realpath "${1:?path to the cudatrace binary}")
out=$(realpath -m "${2:?output folder}")
shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for way in "$@"; do
    name=${way//,/+}
    CUDATRACE_INJECT_VERBOSE=1 CUDATRACE_INJECT_RESUME=$way timeout 120 \
        "$cudatrace" run --gpu -q -o "$out/trace.jsonl" -- python3 "$here/profiler_inside.py" \
        >"$out/$name.stdout" 2>"$out/$name.log"
    echo "exit $?" >>"$out/$name.log"
    python3 "$here/gpu_clients_check.py" "$out/trace.jsonl" --part profiler \
        --stdout "$out/$name.stdout" >"$out/$name.check.json" 2>&1
    tail -n 1 "$out/trace.jsonl" >"$out/$name.footer.json"
    rm -f "$out/trace.jsonl"
    python3 - "$out/$name.check.json" "$out/$name.footer.json" "$way" <<'PY'
import json, sys
check, footer = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(sys.argv[3], "| with work", check.get("with_work_by_part"), "| in gap", check.get("in_gap_by_part"),
      "| issuing", check.get("issuing"), "| api_records", footer.get("gpu", {}).get("api_records"))
PY
    grep -c "foreign buffer" "$out/$name.log" | sed 's/^/  foreign buffers: /'
    grep "resume\|heal" "$out/$name.log" | head -12 | sed 's/^/  /'
done
