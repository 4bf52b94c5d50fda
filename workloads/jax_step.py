"""A jitted JAX training step of a small MLP (issue 24): XLA's command buffers run parts
of it as CUDA graphs, and its autotuning loads and unloads modules that reuse handles.

Prints one JSON line with the steps and the final loss.

Usage: python3 jax_step.py [--steps 30]
"""

import argparse
import json

import jax
import jax.numpy as jnp


def init(key, sizes):
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (fan_in, fan_out)) * 0.05, jnp.zeros(fan_out)))
    return params


def loss(params, x, y):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return jnp.mean((x @ w + b - y) ** 2)


@jax.jit
def step(params, x, y):
    value, grads = jax.value_and_grad(loss)(params, x, y)
    return [(w - 0.01 * gw, b - 0.01 * gb) for (w, b), (gw, gb) in zip(params, grads)], value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    key = jax.random.PRNGKey(0)
    params = init(key, [256, 512, 512, 10])
    x = jax.random.normal(key, (128, 256))
    y = jnp.zeros((128, 10))
    value = None
    for _ in range(args.steps):
        params, value = step(params, x, y)
    value.block_until_ready()
    print(json.dumps({"steps": args.steps, "loss": float(value)}), flush=True)


if __name__ == "__main__":
    main()
