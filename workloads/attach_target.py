"""A long-running PyTorch process for `cudatrace run -p PID --gpu` on the GPU machine: started
untraced, it runs iterations for --seconds and writes one JSON line per iteration to --out:
{"t_ns": CLOCK_MONOTONIC at its end, "dt_ns": its duration} (the trace's clock, so the
iterations before, during and after cudatrace's window can be told apart), and what the
iteration's thread used (`getrusage(RUSAGE_THREAD)`): "cpu_ns" (user and system time, the
probes' programs and traps included), "minflt" (minor page faults), "nvcsw" and "nivcsw"
(voluntary and involuntary context switches). Prints "ready
PID" once warmed up (on stdout, flushed), and "done N" at the end; exits 0.

Modes:
  train   a small MLP training loop (Linear-ReLU-Linear, AdamW, batch 256), one step per
          iteration, synchronised at its end;
  gpt2    GPT-2 decode (4 layers, random weights, no hub), one token per iteration with the
          KV cache, synchronised at its end; cuDNN's SDPA off (FACTS: it rebuilds a plan per
          KV length), the context reset every 200 tokens;
  launch  the launch loop: 200 `x.add_(1)` on a small tensor per iteration, synchronised at
          its end (launch-bound: an iteration's time is 200 launches).

Usage: python3 attach_target.py train|gpt2|launch --seconds 30 --out FILE [--device N]

--device N: the CUDA device to run on (default 0).
"""

import argparse
import json
import os
import resource
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402


def train_step_factory():
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 1024, device="cuda")
    y = torch.randn(256, 1024, device="cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()

    return step


def gpt2_step_factory():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.backends.cuda.enable_cudnn_sdp(False)
    config = GPT2Config(n_layer=4, n_head=8, n_embd=512, n_positions=256)
    model = GPT2LMHeadModel(config).cuda().eval()
    state = {"past": None, "token": None, "length": 0}

    def reset():
        prompt = torch.randint(0, config.vocab_size, (1, 16), device="cuda")
        with torch.no_grad():
            out = model(prompt, use_cache=True)
        state["past"] = out.past_key_values
        state["token"] = out.logits[:, -1:].argmax(-1)
        state["length"] = 16

    reset()

    def step():
        if state["length"] >= 216:
            reset()
        with torch.no_grad():
            out = model(state["token"], past_key_values=state["past"], use_cache=True)
        state["past"] = out.past_key_values
        state["token"] = out.logits[:, -1:].argmax(-1)
        state["length"] += 1

    return step


def launch_step_factory():
    x = torch.zeros(16, device="cuda")

    def step():
        for _ in range(200):
            x.add_(1)

    return step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "gpt2", "launch"])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    torch.cuda.set_device(args.device)
    factories = {"train": train_step_factory, "gpt2": gpt2_step_factory, "launch": launch_step_factory}
    step = factories[args.mode]()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    print(f"ready {os.getpid()}", flush=True)
    end = time.monotonic() + args.seconds
    count = 0
    with open(args.out, "w") as out:
        while time.monotonic() < end:
            before = resource.getrusage(resource.RUSAGE_THREAD)
            start = time.monotonic_ns()
            step()
            torch.cuda.synchronize()
            now = time.monotonic_ns()
            after = resource.getrusage(resource.RUSAGE_THREAD)
            cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
            out.write(json.dumps({
                "t_ns": now,
                "dt_ns": now - start,
                "cpu_ns": round(cpu * 1e9),
                "minflt": after.ru_minflt - before.ru_minflt,
                "nvcsw": after.ru_nvcsw - before.ru_nvcsw,
                "nivcsw": after.ru_nivcsw - before.ru_nivcsw,
            }) + "\n")
            count += 1
    print(f"done {count}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
