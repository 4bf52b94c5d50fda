"""A program that profiles a part of itself with torch.profiler (issue 24).

Launches x.add_(1) in three parts: BEFORE launches, PROFILED launches inside
torch.profiler.profile(activities=[CPU, CUDA]), then AFTER launches; each part ends with a
synchronize. Prints one JSON line: the counts, and what the profiler saw (its CUDA kernel
events of x.add_, their summed GPU time, whether each lasted more than 0 and how far apart
they lie against the profiled part's wall time: the profiler's own records and clock must
be as without cudatrace).

Usage: python3 profiler_inside.py [--before 100] [--profiled 200] [--after 300]
"""

import argparse
import json
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=int, default=100)
    parser.add_argument("--profiled", type=int, default=200)
    parser.add_argument("--after", type=int, default=300)
    args = parser.parse_args()

    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    for _ in range(args.before):
        x.add_(1)
    torch.cuda.synchronize()
    wall_start = time.time_ns()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.profiled):
            x.add_(1)
        torch.cuda.synchronize()
    wall_end = time.time_ns()
    for _ in range(args.after):
        x.add_(1)
    torch.cuda.synchronize()

    kernels = [
        e for e in prof.events()
        if e.device_type == DeviceType.CUDA and "CUDAFunctorOnSelf_add" in e.name
    ]
    gpu_us = sum(e.time_range.elapsed_us() for e in kernels)
    starts = [e.time_range.start for e in kernels]
    result = {
        "before": args.before,
        "profiled": args.profiled,
        "after": args.after,
        "profiler_kernels": len(kernels),
        "profiler_gpu_us": gpu_us,
        "profiler_kernel_durations_positive": all(e.time_range.elapsed_us() > 0 for e in kernels),
        "profiler_kernel_span_us": (max(starts) - min(starts)) if starts else None,
        "profiled_wall_us": (wall_end - wall_start) / 1000,
        "x": float(x.item()),
        "x_ok": float(x.item()) == float(args.before + args.profiled + args.after),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
