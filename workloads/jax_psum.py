"""One process driving every GPU (JAX pmap psum): XLA's NCCL makes one communicator per
GPU, all ranks of one job in one process. workloads/jobs_gpu.sh traces it with --gpu;
`cudatrace summary` then matches the collectives across the ranks within the trace.

    python3 workloads/jax_psum.py [ITERS]
"""

import sys

import jax
import jax.numpy as jnp


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    n = jax.local_device_count()
    step = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")
    x = jnp.ones((n, 1024 * 1024), dtype=jnp.float32)
    for _ in range(iters):
        x = step(x) / n
    x.block_until_ready()
    print("devices", n, "iters", iters, "value", float(x[0, 0]))


if __name__ == "__main__":
    main()
