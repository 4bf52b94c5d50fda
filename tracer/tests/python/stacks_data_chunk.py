"""Calls the stand-in libcuda (ctypes) COUNT times from a recursion DEPTH frames deep of a
function with 16 locals (about 250 bytes of CPython's data stack a frame: 16 frames take
about 4 KiB of the first chunk, across a page), and records at each call the stack
CPython gives for it (as stacks_target.py does), for the walk's data-stack windows
(tests/stacks.rs).

usage: stacks_data_chunk.py LIBCUDA OUT.json COUNT DEPTH [wait]

wait: after the first call, wait until the probe on code objects' deallocator is linked
(free_probe.py), so that the later calls are walked as they are from then on.
"""

import ctypes
import json
import sys

from free_probe import wait_for_the_free_probe
from stack_recorder import recorded, seen

lib = ctypes.CDLL(sys.argv[1])
count = int(sys.argv[3])
depth = int(sys.argv[4])
wait = sys.argv[5:] == ["wait"]


def down(n):
    a, b, c, d, e, f, g, h = n, n, n, n, n, n, n, n
    i, j, k, l, m, o, p, q = n, n, n, n, n, n, n, n
    if n:
        return down(n - 1) + a + b + c + d + e + f + g + h + i + j + k + l + m + o + p + q
    for _ in range(count):
        seen(); lib.cuCtxSynchronize()  # line:down
        if wait and not recorded.get("waited"):
            recorded["waited"] = True
            wait_for_the_free_probe(settle=0.2)
    return 0


down(depth - 2)
recorded.pop("waited", None)
with open(sys.argv[2], "w") as out:
    json.dump({str(tid): stacks for tid, stacks in recorded.items()}, out)
