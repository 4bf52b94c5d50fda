"""Runs WORKLOAD (runpy, as `python3 WORKLOAD ARGS` would) from the bottom of a recursion
DEPTH frames deep, so that its stacks are deeper than a chunk of CPython's data stack
(16 KiB of frames: a deeper stack continues in another chunk, anywhere in memory). For
checking `--stacks` on such stacks (docs/validation.md, issue 32): under
workloads/stacks_reference.py, with `--stack-depth 256`.

usage: python3 deep_call.py DEPTH WORKLOAD [ARGS...]
"""

import runpy
import sys


def deeper(depth):
    if depth:
        return deeper(depth - 1)
    runpy.run_path(workload, run_name="__main__")


depth = int(sys.argv[1])
workload = sys.argv[2]
sys.argv = sys.argv[2:]
deeper(depth)
