"""Loads the stand-in libcuda, says `ready`, then calls it without pause until a line comes
on stdin: a process already busy when `cudatrace run -p` attaches (tests/stacks.rs).

usage: stacks_busy.py LIBCUDA
"""

import ctypes
import sys
import threading

lib = ctypes.CDLL(sys.argv[1])
stop = threading.Event()


def watch():
    sys.stdin.readline()
    stop.set()


threading.Thread(target=watch, daemon=True).start()
print("ready", flush=True)
while not stop.is_set():
    lib.cuCtxSynchronize()
