"""Calls the stand-in libcuda's cuCtxSynchronize (ctypes) 600 times from the bottom of a
recursion 250 frames deep, so that a walked call's walk is long next to the call, for
`--stack-every`'s durations (tests/stacks.rs): a walked call and a skipped one of the same
function are to measure the same thing.

usage: stacks_timing.py LIBCUDA OUT.json
"""

import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
sync = lib.cuCtxSynchronize


def deep(depth):
    if depth:
        return deep(depth - 1)
    for _ in range(600):
        sync()  # line:sync


deep(250)
