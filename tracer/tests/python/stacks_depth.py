"""Calls the stand-in libcuda (ctypes) from stacks of exactly N - 1, N and N + 1 frames, and
records at each call the stack CPython gives for it (as stacks_target.py does), for
`--stack-depth N` at its edge (tests/stacks.rs): each depth from the module directly,
through `map` (a call from C: on 3.12+ an interpreter entry frame lies between the
recursion and the module, right after the N innermost frames at N + 1), and in a thread.

usage: stacks_depth.py LIBCUDA OUT.json N
"""

import ctypes
import json
import sys
import threading

from stack_recorder import recorded, seen

lib = ctypes.CDLL(sys.argv[1])
budget = int(sys.argv[3])


def frames_here():
    count = 0
    frame = sys._getframe(1)
    while frame is not None:
        count += 1
        frame = frame.f_back
    return count


def call_at(total):
    """Recurses until the stack is `total` frames deep, then calls from there."""
    if frames_here() < total:
        return call_at(total)
    seen(); lib.cuCtxSynchronize()  # line:call


def main():
    for total in (budget - 1, budget, budget + 1):
        call_at(total)
        list(map(call_at, [total]))
        worker = threading.Thread(target=call_at, args=(total,))
        worker.start()
        worker.join()


main()
with open(sys.argv[2], "w") as out:
    json.dump({str(tid): stacks for tid, stacks in recorded.items()}, out)
