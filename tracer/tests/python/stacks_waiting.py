"""Loads the stand-in libcuda, says `ready`, waits for a line on stdin, then calls it from a
known line: the process `cudatrace run -p` attaches to (tests/stacks.rs).

usage: stacks_waiting.py LIBCUDA
"""

import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])


def called():
    lib.cuCtxSynchronize()  # line:called


print("ready", flush=True)
sys.stdin.readline()
called()  # line:module
