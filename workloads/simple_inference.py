"""Simple MLP inference workload for cudatrace.

Runs a small float32 MLP (1024 -> 4096 -> 4096 -> 1024 -> 10, ReLU) through the
usual phases of an inference job and prints how long each phase took, one line
per stage, in this fixed order:

    stage init: ... ms               first CUDA context creation
    stage weight_loading: ... ms     build model on CPU, move it to the device
    stage input_preparation: ... ms  CPU batch copied to the device
    stage inference: ... ms          N forward passes under inference_mode
    stage output_retrieval: ... ms   result copied back with .cpu()
    stage cleanup: ... ms            del model, torch.cuda.empty_cache()

The tracer's view of driver calls can be lined up against these phases.
Every stage synchronizes the device before its clock stops, so the times
include the GPU work the stage queued.

Usage: python3 simple_inference.py [--batches 20] [--batch-size 64] [--device cuda]
"""

import argparse
import sys
import time

import torch
from torch import nn

SEED = 1234


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def report(stage: str, start: float) -> None:
    print(f"stage {stage}: {(time.perf_counter() - start) * 1e3:.1f} ms", flush=True)


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(1024, 4096),
        nn.ReLU(),
        nn.Linear(4096, 4096),
        nn.ReLU(),
        nn.Linear(4096, 1024),
        nn.ReLU(),
        nn.Linear(1024, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20,
                        help="number of forward passes in the inference stage (default 20)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="rows in the input batch (default 64)")
    parser.add_argument("--device", default="cuda",
                        help="torch device, e.g. cuda, cuda:0 or cpu (default cuda)")
    args = parser.parse_args()
    if args.batches < 1 or args.batch_size < 1:
        parser.error("--batches and --batch-size must be >= 1")

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda requested but CUDA is not available "
              "(no GPU, driver or CUDA-enabled PyTorch build); use --device cpu",
              file=sys.stderr)
        sys.exit(2)

    torch.manual_seed(SEED)

    # init: first context creation.
    t = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.init()
        torch.zeros(1, device=device)
        sync(device)
    report("init", t)

    # weight_loading: build on CPU, then move to the device.
    t = time.perf_counter()
    model = build_model().eval()
    model = model.to(device)
    sync(device)
    report("weight_loading", t)

    # input_preparation: CPU batch (pinned when the target is CUDA) copied over.
    t = time.perf_counter()
    x_cpu = torch.randn(args.batch_size, 1024)
    if device.type == "cuda":
        x_cpu = x_cpu.pin_memory()
        x = x_cpu.to(device, non_blocking=True)
    else:
        x = x_cpu.to(device)
    sync(device)
    report("input_preparation", t)

    # inference: N forward passes.
    t = time.perf_counter()
    with torch.inference_mode():
        for _ in range(args.batches):
            y = model(x)
    sync(device)
    report("inference", t)

    # output_retrieval: copy the result back to the host.
    t = time.perf_counter()
    out = y.cpu()
    report("output_retrieval", t)

    # cleanup: drop device tensors and return cached memory to the driver.
    t = time.perf_counter()
    del model, x, y
    if device.type == "cuda":
        torch.cuda.empty_cache()
        sync(device)
    report("cleanup", t)

    print(f"output shape: {tuple(out.shape)}, checksum: {out.double().sum().item():.6f}")


if __name__ == "__main__":
    main()
