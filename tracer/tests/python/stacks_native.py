"""A call from a thread Python did not start: pthread_create runs the stand-in's
cuCtxSynchronize as the thread's start routine, so the thread has no Python thread state.
Then one call from Python, which has its stack.

With THREADS, that many such threads, one after the other, before the Python call.

usage: stacks_native.py LIBCUDA [THREADS]
"""

import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
libc = ctypes.CDLL(None)
start = ctypes.cast(lib.cuCtxSynchronize, ctypes.c_void_p)
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
    thread = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(thread), None, start, None) == 0
    assert libc.pthread_join(thread, None) == 0
lib.cuCtxSynchronize()  # line:python
