"""Matmuls timed with CUDA events, to check `cudatrace run --gpu`'s GPU durations.

Picks a float32 square matmul size that takes about --target-ms on this GPU (TF32 off,
calibrated from a 4096 x 4096 one), warms up, queues a few more so the stream is busy, then runs --iters matmuls, each between two
torch.cuda.Event(enable_timing=True) records on the current stream. CUDA events do not use
CUPTI: they are the driver's own timestamps, written into the stream around the work.

Prints one JSON line:
  {"size": N, "dtype": "float32", "iters": R, "event_ms": [...], "device": "..."}

workloads/gpu_activity_check.py --events FILE TRACE matches the i-th pair of cuEventRecord
calls of the trace with the i-th event_ms, and compares it with the GPU time of the
kernels launched between them.

Usage: python3 matmul_events.py [--iters 50] [--target-ms 1.0] [--size N]
"""

import argparse
import json
import sys
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50, help="timed matmuls (default 50)")
    parser.add_argument("--target-ms", type=float, default=1.0,
                        help="aim for matmuls of about this long (default 1.0)")
    parser.add_argument("--size", type=int, default=0,
                        help="use this size instead of calibrating")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    torch.manual_seed(1234)

    size = args.size
    if size == 0:
        probe = 4096
        a = torch.randn(probe, probe, device=device)
        b = torch.randn(probe, probe, device=device)
        for _ in range(3):
            torch.mm(a, b)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(5):
            torch.mm(a, b)
        torch.cuda.synchronize()
        per_ms = (time.perf_counter() - t) * 1e3 / 5
        # Time grows with the cube of the size.
        size = int(probe * (args.target_ms / per_ms) ** (1 / 3)) // 256 * 256
        size = max(256, size)
        del a, b
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    for _ in range(5):
        torch.mm(a, b)
    torch.cuda.synchronize()
    # A head start, not waited for: the stream is busy when the first start event is
    # recorded, so no pair brackets the GPU idling while the CPU launches (the first pair
    # of an idle stream measured 43 us more than its kernel on an H100).
    for _ in range(3):
        torch.mm(a, b)

    pairs = []
    for _ in range(args.iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b)
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    print(json.dumps({
        "size": size,
        "dtype": "float32",
        "iters": args.iters,
        "event_ms": [start.elapsed_time(end) for start, end in pairs],
        "device": torch.cuda.get_device_name(),
    }), flush=True)


if __name__ == "__main__":
    main()
