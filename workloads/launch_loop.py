"""Launch-bound loop for measuring tracing overhead.

Does x = torch.zeros(1) on the device, warms up with 1000 x.add_(1), then times
--iters launches of x.add_(1) followed by one synchronize, --repeats times.
Each iteration is one tiny kernel launch, so the per-iteration time is almost
entirely CPU-side launch cost -- which is what a uprobe on cuLaunchKernel adds
to. Run it with and without the tracer attached and compare.

Prints one JSON line:
  {"us_per_iter_median": ..., "us_per_iter_all": [...], "iters": ..., "repeats": ...,
   "device": ..., "profiler": false}

With --profiler, each timed loop runs inside
torch.profiler.profile(activities=[CPU, CUDA]) for comparison with PyTorch's
own profiler. Entering the profiler and its post-processing on exit are NOT
included in us_per_iter; the time spent exiting the profiler context is
reported separately as "profiler_postprocess_s" (sum over repeats) and
"profiler_postprocess_s_all" (one value per repeat).

Usage: python3 launch_loop.py [--iters 50000] [--repeats 5] [--profiler] [--device cuda]
"""

import argparse
import json
import statistics
import sys
import time

import torch

WARMUP_ITERS = 1000


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_loop(x: torch.Tensor, iters: int, device: torch.device) -> float:
    """Seconds for `iters` x.add_(1) plus a final synchronize."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        x.add_(1)
    sync(device)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50000,
                        help="timed iterations per repeat (default 50000)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="number of timed repeats (default 5)")
    parser.add_argument("--profiler", action="store_true",
                        help="wrap each timed loop in torch.profiler.profile(CPU, CUDA)")
    parser.add_argument("--device", default="cuda",
                        help="torch device, e.g. cuda, cuda:0 or cpu (default cuda)")
    args = parser.parse_args()
    if args.iters < 1 or args.repeats < 1:
        parser.error("--iters and --repeats must be >= 1")

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda requested but CUDA is not available "
              "(no GPU, driver or CUDA-enabled PyTorch build); use --device cpu",
              file=sys.stderr)
        sys.exit(2)

    x = torch.zeros(1, device=device)
    for _ in range(WARMUP_ITERS):
        x.add_(1)
    sync(device)

    if args.profiler:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)

    per_iter_us = []
    postprocess_s = []
    for _ in range(args.repeats):
        if args.profiler:
            prof = profile(activities=activities)
            prof.__enter__()
            try:
                elapsed = timed_loop(x, args.iters, device)
            finally:
                t_exit = time.perf_counter()
                prof.__exit__(None, None, None)
                postprocess_s.append(time.perf_counter() - t_exit)
            del prof
        else:
            elapsed = timed_loop(x, args.iters, device)
        per_iter_us.append(elapsed / args.iters * 1e6)

    result = {
        "us_per_iter_median": statistics.median(per_iter_us),
        "us_per_iter_all": per_iter_us,
        "iters": args.iters,
        "repeats": args.repeats,
        "device": str(device),
        "profiler": args.profiler,
    }
    if args.profiler:
        result["profiler_postprocess_s"] = sum(postprocess_s)
        result["profiler_postprocess_s_all"] = postprocess_s
    # Sanity check that every add_ ran (float32 is exact well past these counts).
    expected = WARMUP_ITERS + args.iters * args.repeats
    if expected < 2 ** 24:
        result["check_ok"] = float(x.item()) == float(expected)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
