"""Calls the stand-in libcuda (ctypes) from stacks deeper than a chunk of CPython's data
stack (16 KiB, where 3.11+ keeps its frames: a deeper stack continues in a new chunk,
anywhere in memory), and records at each call the stack CPython gives for it (as
stacks_target.py does), for the walk's reads (tests/stacks.rs): COUNT calls from a
recursion 240 frames deep, then COUNT from one 120 levels deep through `map` (a call from
C each level: on 3.12+ an interpreter entry frame on the C stack between every two frames).

usage: stacks_chunks.py LIBCUDA OUT.json COUNT [wait]

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
wait = sys.argv[4:] == ["wait"]


def recursion(depth):
    if depth:
        return recursion(depth - 1)
    for _ in range(count):
        seen(); lib.cuCtxSynchronize()  # line:recursion
        if wait and not recorded.get("waited"):
            recorded["waited"] = True
            wait_for_the_free_probe(settle=0.2)


def through_c(depth):
    if depth:
        return list(map(through_c, [depth - 1]))
    for _ in range(count):
        seen(); lib.cuCtxSynchronize()  # line:through_c


recursion(236)
through_c(120)
recorded.pop("waited", None)
with open(sys.argv[2], "w") as out:
    json.dump({str(tid): stacks for tid, stacks in recorded.items()}, out)
