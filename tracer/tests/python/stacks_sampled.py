"""Calls the stand-in libcuda (ctypes) from a loop whose step makes four calls from four
lines, and records at each call the stack CPython gives for it (as stacks_target.py does),
for `--stack-every` (tests/stacks.rs). The main thread runs the loop, then two threads run
it each, taking turns strictly (one step each in turn), so that a choice shared by the
threads, or tied to a thread's count of calls, would sample some lines and not others.
Calls alternate between a synchronisation and a launch.

usage: stacks_sampled.py LIBCUDA OUT.json [STEPS]
"""

import ctypes
import json
import sys
import threading

from stack_recorder import recorded, seen

lib = ctypes.CDLL(sys.argv[1])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 400


def step():
    seen(); lib.cuCtxSynchronize()  # line:a
    seen(); lib.cuLaunchKernel(None, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # line:b
    seen(); lib.cuCtxSynchronize()  # line:c
    seen(); lib.cuLaunchKernel(None, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # line:d


def worker(mine, theirs):
    for _ in range(steps):
        mine.acquire()
        step()
        theirs.release()


def main():
    for _ in range(steps):
        step()  # line:main
    first, second = threading.Semaphore(1), threading.Semaphore(0)
    workers = [
        threading.Thread(target=worker, args=(first, second)),
        threading.Thread(target=worker, args=(second, first)),
    ]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()


main()
with open(sys.argv[2], "w") as out:
    json.dump({str(tid): stacks for tid, stacks in recorded.items()}, out)
