"""torch.compile(mode="reduce-overhead") of a small MLP, replayed (issue 24): the compiled
model captures its kernels into a CUDA graph and replays it on each call.

Prints one JSON line with the number of calls and the output's checksum.

Usage: python3 compile_graphs.py [--calls 50]
"""

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    ).cuda().eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(64, 256, device="cuda")
    with torch.no_grad():
        # Warm-up and capture (cudagraph trees record on the second and third call).
        for _ in range(3):
            out = compiled(x)
        torch.cuda.synchronize()
        for _ in range(args.calls):
            out = compiled(x)
        torch.cuda.synchronize()
    print(json.dumps({"calls": args.calls, "warmup_calls": 3,
                      "checksum": float(out.float().sum().item())}), flush=True)


if __name__ == "__main__":
    main()
