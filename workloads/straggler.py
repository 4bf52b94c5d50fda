"""A known straggler, for checking cudatrace's cross-rank analysis on the GPU machine.

Run one process per node under torchrun (`--nnodes 2 --nproc_per_node 1`, one node agent
per GPU on one host: workloads/jobs_gpu.sh):

    python3 -m torch.distributed.run --nnodes 2 --nproc_per_node 1 --node_rank N \
        --master_addr 127.0.0.1 --master_port P workloads/straggler.py --out DIR

Each rank makes one untimed all-reduce (NCCL connects its peers on first use), then
ITERS all-reduces of 4 MiB (1 Mi float32, sum; or as many as SECONDS allow), waiting for
each (torch.cuda.synchronize).
The last rank sleeps SLEEP ms before every third timed all-reduce (numbers 3, 6, 9, ...).
It writes DIR/rank{R}.json: rank, world size, pid, host, iters, the numbers of the late
all-reduces and the sleep.
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--sleep-ms", type=float, default=50.0)
    parser.add_argument("--warmup", type=int, default=1)
    # Run timed all-reduces for this long instead of ITERS (the window check).
    parser.add_argument("--seconds", type=float, default=0.0)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    x = torch.ones(1024 * 1024, device="cuda")
    for _ in range(args.warmup):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    late = []
    start = time.monotonic()
    n = 0
    while (n < args.iters) if args.seconds <= 0 else (time.monotonic() - start < args.seconds):
        n += 1
        if rank == world - 1 and n % 3 == 0:
            late.append(n)
            time.sleep(args.sleep_ms / 1000)
        dist.all_reduce(x)
        torch.cuda.synchronize()
    dist.destroy_process_group()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "rank": rank,
                "world": world,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "iters": n,
                "warmup": args.warmup,
                "late": late,
                "sleep_ms": args.sleep_ms,
                "bytes": x.numel() * x.element_size(),
            },
            f,
        )


if __name__ == "__main__":
    main()
