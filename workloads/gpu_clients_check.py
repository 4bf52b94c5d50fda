"""Checks a `cudatrace run --gpu` trace of issue 24's GPU validation (run J in
docs/validation.md): every launch accounted for, beside the program's own profiler, graphs
to their capture calls, names. Prints the figures as JSON; exit status 1 if a check fails.

Usage: python3 gpu_clients_check.py TRACE --part profiler|graphs|jax [--stdout FILE]
  profiler: the x.add_ launches of workloads/profiler_inside.py (BEFORE, PROFILED, AFTER
            from its JSON line in --stdout): the PROFILED ones in a gpu_gap, without work,
            the others each linked to one kernel line; the profiler's own count.
  graphs:   workloads/compile_graphs.py: captured calls marked, every graph kernel linked to
            its replay (cuGraphLaunch) and to its capture call, whose kernel is its own.
  jax:      workloads/jax_step.py: every kernel line's name equals its launch's, CUPTI's
            differing names counted; graph kernels linked to their replay.
"""

import argparse
import collections
import json
import sys


def read(path):
    lines = []
    with open(path) as f:
        for line in f:
            lines.append(json.loads(line))
    return lines


def launch_name(call):
    return call.get("kernel_mangled") or call.get("kernel")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--part", required=True, choices=["profiler", "graphs", "jax"])
    parser.add_argument("--stdout")
    args = parser.parse_args()
    trace = read(args.trace)
    footer = trace[-1]
    calls = {(l["pid"], l["tid"], l["ts_ns"]): l for l in trace if l["type"] == "call"}
    work = [l for l in trace if l["type"] in ("gpu_kernel", "gpu_copy", "gpu_memset")]
    kernels = [l for l in work if l["type"] == "gpu_kernel"]
    gaps = [l for l in trace if l["type"] == "gpu_gap"]
    by_call = collections.defaultdict(list)
    for w in work:
        if "call_tid" in w:
            by_call[(w["pid"], w["call_tid"], w["call_ts_ns"])].append(w)
    launches = [c for c in calls.values() if c["name"].startswith("cuLaunch")]
    graph_launches = [c for c in calls.values() if c["name"].startswith("cuGraphLaunch")]
    result = {
        "footer_complete": footer.get("type") == "footer",
        "issuing": footer.get("gpu", {}).get("issuing"),
        "lost": {k: v for k, v in footer.get("lost", {}).items() if v},
        "unlinked": footer.get("gpu", {}).get("unlinked"),
        "name_mismatches": footer.get("gpu", {}).get("name_mismatches"),
        "graph_nodes": footer.get("gpu", {}).get("graph_nodes"),
        "gpu_errors": [l["message"] for l in trace if l["type"] == "gpu_error"],
        "launch_calls": len(launches),
        "launch_lines_with_cupti_result": sum(1 for c in launches if "ret" in c),
        "graph_launch_calls": len(graph_launches),
        "kernel_lines": len(kernels),
        "work_lines": len(work),
        "gaps": [{k: g.get(k) for k in ("pid", "from_ns", "to_ns", "calls", "handed_over")} for g in gaps],
        "checks": {},
    }
    checks = result["checks"]
    checks["complete"] = result["footer_complete"]
    checks["no_gpu_error"] = not result["gpu_errors"]
    issuing = result["issuing"] or {}
    checks["issuing_adds_up"] = issuing.get("calls") == sum(
        issuing.get(k, 0) for k in ("with_work", "captured", "failed", "empty", "cupti_held",
                                     "no_api_record", "not_flushed", "not_recorded", "missing"))
    if args.part == "profiler":
        program = json.loads(open(args.stdout).read().strip().splitlines()[-1])
        result["program"] = program
        adds = sorted((c for c in launches if "CUDAFunctorOnSelf_add" in (c.get("kernel") or "")),
                      key=lambda c: c["ts_ns"])
        b, p, a = program["before"], program["profiled"], program["after"]
        parts = [adds[:b], adds[b:b + p], adds[b + p:]]
        with_work = [sum(1 for c in part if by_call.get((c["pid"], c["tid"], c["ts_ns"])))
                     for part in parts]
        in_gap = [sum(1 for c in part if any(
            g["from_ns"] <= c["ts_ns"] and (g.get("to_ns") is None or c["ts_ns"] <= g["to_ns"])
            for g in gaps)) for part in parts]
        # Kernels of x.add_ written without their launch (no record of it came from CUPTI).
        result["unlinked_add_kernels"] = sum(
            1 for k in kernels if "CUDAFunctorOnSelf_add" in (k.get("kernel") or "") and k.get("unlinked"))
        result.update({"add_launches": len(adds), "with_work_by_part": with_work,
                       "in_gap_by_part": in_gap,
                       "gap_ms": [(g["to_ns"] - g["from_ns"]) / 1e6 for g in gaps if g.get("to_ns")]})
        checks["launches"] = len(adds) == b + p + a
        checks["before_and_after_have_work"] = with_work[0] == b and with_work[2] == a
        checks["profiled_in_gap_without_work"] = with_work[1] == 0 and in_gap[1] == p
        checks["one_gap"] = len(gaps) == 1
        checks["profiler_saw_its_own"] = program["profiler_kernels"] == p
        checks["profiler_durations_positive"] = program["profiler_kernel_durations_positive"]
        checks["program_ok"] = program["x_ok"]
    else:
        graph_work = [w for w in work if w.get("graph_id")]
        captured = [c for c in calls.values() if c.get("captured") is not None]
        replays = {(w["pid"], w["correlation_id"]) for w in graph_work}
        linked_replay = [w for w in graph_work if (w["pid"], w.get("call_tid"), w.get("call_ts_ns")) in calls
                         and calls[(w["pid"], w["call_tid"], w["call_ts_ns"])]["name"].startswith("cuGraphLaunch")]
        with_capture = [w for w in graph_work if "capture_call_tid" in w]
        same_name = 0
        for w in with_capture:
            call = calls.get((w["pid"], w["capture_call_tid"], w["capture_call_ts_ns"]))
            if call and call.get("captured") is not None and (
                    w["type"] != "gpu_kernel" or launch_name(call) in (w.get("kernel_mangled"), w.get("kernel"))):
                same_name += 1
        direct = [k for k in kernels if not k.get("graph_id") and "call_tid" in k]
        names_equal = sum(1 for k in direct
                          if launch_name(calls[(k["pid"], k["call_tid"], k["call_ts_ns"])])
                          in (k.get("kernel_mangled"), k.get("kernel")))
        result.update({
            "captured_calls": len(captured),
            "captured_launches": sum(1 for c in captured if c["name"].startswith("cuLaunch")),
            "graph_work_lines": len(graph_work),
            "replays": len(replays),
            "graph_work_linked_to_replay": len(linked_replay),
            "graph_work_linked_to_capture_call": len(with_capture),
            "capture_call_is_a_captured_call_of_its_kernel": same_name,
            "direct_kernels": len(direct),
            "direct_kernels_named_as_their_launch": names_equal,
            "cupti_kernel_lines": sum(1 for k in kernels if "cupti_kernel" in k),
        })
        checks["graph_work_linked_to_replay"] = len(linked_replay) == len(graph_work)
        checks["names_equal_launches"] = names_equal == len(direct)
        if args.part == "graphs":
            checks["captured_marked"] = len(captured) > 0
            checks["graph_work_linked_to_capture"] = len(with_capture) == len(graph_work) > 0
            checks["capture_call_matches"] = same_name == len(with_capture)
    result["ok"] = all(checks.values())
    print(json.dumps(result, indent=1))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
