"""torch.profiler's answer to "GPU time per layer": the reference `cudatrace summary` by layer
is compared with (workloads/layers_gpu.sh, issue 23).

Runs WORKLOAD in this process (runpy) with ARGS inside
`torch.profiler.profile(activities=[CPU, CUDA])`, with a `record_function` range named
`nn.Module: CLASS` around every module's forward (global forward pre- and post-hooks: the
module hierarchy torch.profiler's `with_stack=True` would record, without its Python
tracer, whose post-processing of GPT-2's millions of Python calls outran 150 s on the H100).
Each kernel is given the module the profiler says it came from: the kernel's correlation
id names the runtime or driver call that launched it, and the innermost module range
around that call on its thread is its layer (none: "(no layer)"). Writes JSON to $LAYERS_REFERENCE_OUT: {"layers": {CLASS: [kernels,
gpu_ns]}, "kernels": N, "gpu_ns": T, "kernels_without_launch": N}.

usage: LAYERS_REFERENCE_OUT=ref.json python3 layers_reference.py WORKLOAD [ARGS...]
"""

import bisect
import gzip
import json
import os
import re
import runpy
import sys
import tempfile
import threading

import torch
from torch.profiler import ProfilerActivity, profile

MODULE = re.compile(r"^nn\.Module: (.*?)(_\d+)?$")


def layers_of(trace):
    events = trace["traceEvents"]
    launches = {}
    modules = {}
    kernels = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, args = e.get("cat", ""), e.get("args", {})
        if cat == "kernel":
            kernels.append(e)
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[args["correlation"]] = (e["pid"], e["tid"], e["ts"])
        elif cat in ("user_annotation", "python_function"):
            match = MODULE.match(e["name"])
            if match:
                modules.setdefault((e["pid"], e["tid"]), []).append(
                    (e["ts"], e["ts"] + e["dur"], match.group(1)))
    # Kineto puts Python events on the thread's own tid; where a runtime call's thread has
    # none, the process's are used (the workloads run their model on one Python thread).
    for (pid, _), spans in list(modules.items()):
        modules.setdefault((pid, None), []).extend(spans)
    for spans in modules.values():
        spans.sort()
    starts = {key: [s[0] for s in spans] for key, spans in modules.items()}
    layers, without_launch = {}, 0
    total_ns = 0
    for kernel in kernels:
        launch = launches.get(kernel["args"].get("correlation"))
        dur_ns = round(kernel["dur"] * 1000)
        total_ns += dur_ns
        if launch is None:
            without_launch += 1
            name = "(no launch)"
        else:
            pid, tid, ts = launch
            if (pid, tid) not in modules:
                tid = None
            spans = modules.get((pid, tid), [])
            # The innermost module around the launch: the latest start that still holds it.
            name = "(no layer)"
            for i in range(bisect.bisect_right(starts.get((pid, tid), []), ts) - 1, -1, -1):
                start, end, cls = spans[i]
                if start <= ts <= end:
                    name = cls
                    break
        row = layers.setdefault(name, [0, 0])
        row[0] += 1
        row[1] += dur_ns
    return {"layers": layers, "kernels": len(kernels), "gpu_ns": total_ns,
            "kernels_without_launch": without_launch}


ranges = threading.local()


def enter_module(module, _inputs):
    scope = torch.autograd.profiler.record_function(f"nn.Module: {type(module).__name__}")
    scope.__enter__()
    ranges.__dict__.setdefault("open", []).append(scope)


def leave_module(_module, _inputs, _output):
    ranges.open.pop().__exit__(None, None, None)


def main():
    workload, args = sys.argv[1], sys.argv[2:]
    out = os.environ["LAYERS_REFERENCE_OUT"]
    sys.argv = [workload] + args
    torch.nn.modules.module.register_module_forward_pre_hook(enter_module)
    torch.nn.modules.module.register_module_forward_hook(leave_module)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        try:
            runpy.run_path(workload, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
        torch.cuda.synchronize()
    # $LAYERS_REFERENCE_CHROME: where to keep the profiler's own trace (gzip), to look at.
    keep = os.environ.get("LAYERS_REFERENCE_CHROME")
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name, "rb") as chrome:
            raw = chrome.read()
    if keep:
        with gzip.open(keep, "wb") as f:
            f.write(raw)
    trace = json.loads(raw)
    with open(out, "w") as f:
        json.dump(layers_of(trace), f, indent=1)


if __name__ == "__main__":
    main()
