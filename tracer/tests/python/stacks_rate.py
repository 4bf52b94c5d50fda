"""Calls the stand-in libcuda's cuCtxSynchronize (ctypes) in bursts of 1,000, for
`--stack-rate` (tests/stacks.rs): a burst in the main thread; then one in each of two
threads at once; then, after 0.55 s, another in the main thread.

usage: stacks_rate.py LIBCUDA OUT.json
"""

import ctypes
import sys
import threading
import time

lib = ctypes.CDLL(sys.argv[1])
sync = lib.cuCtxSynchronize


def burst():
    for _ in range(1000):
        sync()


def after(barrier):
    barrier.wait()
    burst()


burst()
barrier = threading.Barrier(2)
workers = [threading.Thread(target=after, args=(barrier,)) for _ in range(2)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
time.sleep(0.55)
burst()
