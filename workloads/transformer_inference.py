"""Small GPT-2 text-generation workload for cudatrace.

Builds a GPT-2 architecture from transformers' GPT2Config (4 layers, 8 heads,
n_embd 512, vocab 50257, 256 positions) with RANDOM weights -- no
from_pretrained, no hub, no tokenizer -- feeds it a random 16-token prompt
(batch 1) and greedily generates --tokens new tokens with a manual decode loop
(model forward with use_cache=True, passing past_key_values back in). A manual
loop is used instead of model.generate() so that exactly --tokens tokens are
produced (no EOS stopping) and to stay robust across transformers versions.

Prints per-stage timings, one line each, in this order:
init, weight_loading, input_preparation, inference, output_retrieval, cleanup
(e.g. "stage init: 123.4 ms"), then the number of generated tokens and the time per
generated token ("per token: 1.234 ms", the inference stage divided by --tokens).

With --profiler the inference stage runs inside torch.profiler.profile(CPU, CUDA), for
comparing its cost; entering and leaving the profiler are not in the stage's time, and the
time spent leaving it (its post-processing) is printed as "profiler post-processing: X s".

With --dtype float16 the model runs in half precision (`.half()`), as serving stacks do;
its kernels have some of PyTorch's longest names.

Usage: python3 transformer_inference.py [--device cuda] [--tokens 20] [--profiler]
       [--dtype float16]
"""

import os

# Never touch the network / model hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

SEED = 1234
PROMPT_LEN = 16
N_POSITIONS = 256


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def report(stage: str, start: float) -> None:
    print(f"stage {stage}: {(time.perf_counter() - start) * 1e3:.1f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda",
                        help="torch device, e.g. cuda, cuda:0 or cpu (default cuda)")
    parser.add_argument("--tokens", type=int, default=20,
                        help="number of new tokens to generate (default 20)")
    parser.add_argument("--profiler", action="store_true",
                        help="run the inference stage inside torch.profiler.profile(CPU, CUDA)")
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                        help="the model's precision (default float32)")
    args = parser.parse_args()
    if args.tokens < 1:
        parser.error("--tokens must be >= 1")
    if PROMPT_LEN + args.tokens > N_POSITIONS:
        parser.error(f"prompt ({PROMPT_LEN}) + --tokens must be <= {N_POSITIONS}")

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

    # weight_loading: random-weight GPT-2 built on CPU, then moved to the device.
    t = time.perf_counter()
    config = GPT2Config(
        vocab_size=50257,
        n_positions=N_POSITIONS,
        n_embd=512,
        n_layer=4,
        n_head=8,
        use_cache=True,
    )
    model = GPT2LMHeadModel(config).eval()
    if args.dtype == "float16":
        model = model.half()
    model = model.to(device)
    sync(device)
    report("weight_loading", t)

    # input_preparation: random prompt ids on the CPU, copied to the device.
    t = time.perf_counter()
    prompt_cpu = torch.randint(0, config.vocab_size, (1, PROMPT_LEN), dtype=torch.long)
    input_ids = prompt_cpu.to(device)
    sync(device)
    report("input_preparation", t)

    # inference: greedy decode with the KV cache, exactly args.tokens tokens.
    prof = None
    if args.profiler:
        from torch.profiler import ProfilerActivity, profile
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities)
        prof.__enter__()
    t = time.perf_counter()
    generated = []
    with torch.inference_mode():
        past = None
        step_ids = input_ids
        for _ in range(args.tokens):
            out = model(input_ids=step_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            next_id = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)  # (1, 1)
            generated.append(next_id)
            step_ids = next_id
        new_tokens = torch.cat(generated, dim=1)
        sequence = torch.cat([input_ids, new_tokens], dim=1)
    sync(device)
    inference_s = time.perf_counter() - t
    report("inference", t)
    if prof is not None:
        t_exit = time.perf_counter()
        prof.__exit__(None, None, None)
        print(f"profiler post-processing: {time.perf_counter() - t_exit:.3f} s", flush=True)
        del prof

    # output_retrieval: generated ids back to the host.
    t = time.perf_counter()
    sequence_cpu = sequence.cpu()
    report("output_retrieval", t)

    # cleanup
    t = time.perf_counter()
    del model, out, past, input_ids, new_tokens, sequence, generated, step_ids, next_id
    if device.type == "cuda":
        torch.cuda.empty_cache()
        sync(device)
    report("cleanup", t)

    n_generated = sequence_cpu.shape[1] - PROMPT_LEN
    assert n_generated == args.tokens, (n_generated, args.tokens)
    print(f"generated tokens: {n_generated}")
    print(f"per token: {inference_s * 1e3 / n_generated:.3f} ms")
    print(f"generated ids: {sequence_cpu[0, PROMPT_LEN:].tolist()}")


if __name__ == "__main__":
    main()
