"""NCCL collectives of known sizes, for checking cudatrace's NCCL probes on the GPU machine.

Run under torchrun, one process per GPU (`--nproc_per_node 2`; 1 for the single-GPU
fallback, NCCL with one rank):

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
        workloads/allreduce.py --out DIR [--iters N]

Each rank, on GPU LOCAL_RANK, makes exactly N + 1 calls of each: one untimed warm-up
(NCCL connects its peers on a communicator's first collective: about 150 ms on H200s),
then N timed calls (no barrier: no other collective of these sizes):
  all_reduce            float32, 16 Mi elements (64 MiB), sum    -> ncclAllReduce
  broadcast from rank 0 float32,  8 Mi elements (32 MiB)         -> ncclBroadcast/ncclBcast
  all_gather_into_tensor float32, 4 Mi elements (16 MiB) per rank -> ncclAllGather
and times each timed call itself with CUDA events on the current stream. It writes
DIR/rank{R}.json: pid, rank, world size, device, iters and warmup (calls of each op:
iters + warmup), the sizes, and per op the event times (ms) with nccl-tests' algorithm
and bus bandwidth from the MEDIAN event time (busbw = algbw x 2(n-1)/n for all-reduce,
(n-1)/n for all-gather with size = per-rank bytes x n, 1 for broadcast).
"""

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

SIZES = {
    # op: (elements per call as NCCL's count, bytes of one element)
    "AllReduce": (16 * 1024 * 1024, 4),
    "Broadcast": (8 * 1024 * 1024, 4),
    "AllGather": (4 * 1024 * 1024, 4),
}


# Untimed calls of each op before the timed ones (NCCL's lazy connection setup).
WARMUP = 1


def bus_rule(op, n):
    """nccl-tests: (size multiplier, bus factor)."""
    if op == "AllReduce":
        return 1, 2 * (n - 1) / n
    if op == "AllGather":
        return n, (n - 1) / n
    return 1, 1.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)

    tensors = {
        "AllReduce": torch.ones(SIZES["AllReduce"][0], dtype=torch.float32, device=device),
        "Broadcast": torch.full((SIZES["Broadcast"][0],), float(rank), device=device),
        "AllGather": torch.full((SIZES["AllGather"][0],), float(rank), device=device),
    }
    gathered = torch.empty(SIZES["AllGather"][0] * world, dtype=torch.float32, device=device)
    calls = {
        "AllReduce": lambda: dist.all_reduce(tensors["AllReduce"]),
        "Broadcast": lambda: dist.broadcast(tensors["Broadcast"], src=0),
        "AllGather": lambda: dist.all_gather_into_tensor(gathered, tensors["AllGather"]),
    }
    result = {
        "pid": os.getpid(),
        "rank": rank,
        "world": world,
        "device": local,
        "iters": args.iters,
        "warmup": WARMUP,
        "ops": {},
    }
    for op, call in calls.items():
        for _ in range(WARMUP):
            call()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        count, element = SIZES[op]
        times_ranks, factor = bus_rule(op, world)
        size = count * element * times_ranks
        mean_ms = statistics.mean(times)
        median_ms = statistics.median(times)
        algbw = size / (median_ms * 1e6)  # bytes per ns = GB/s
        result["ops"][op] = {
            "count": count,
            "bytes": count * element,
            "size_bytes": size,
            "times_ms": times,
            "mean_ms": mean_ms,
            "median_ms": median_ms,
            # From the median event time.
            "algbw_gb_s": algbw,
            "busbw_gb_s": algbw * factor,
        }
    torch.cuda.synchronize()
    # The values prove the collectives ran: sums of ones, rank 0's broadcast, every rank's.
    assert tensors["AllReduce"][0].item() == world ** (args.iters + WARMUP)
    assert tensors["Broadcast"][0].item() == 0.0
    assert [gathered[i * SIZES["AllGather"][0]].item() for i in range(world)] == [
        float(r) for r in range(world)
    ]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
