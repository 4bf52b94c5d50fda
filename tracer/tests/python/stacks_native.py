"""A call from a thread Python did not start: pthread_create runs the stand-in's
cuCtxSynchronize as the thread's start routine, so the thread has no Python thread state.
Then one call from Python, which has its stack.

usage: stacks_native.py LIBCUDA
"""

import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
libc = ctypes.CDLL(None)
thread = ctypes.c_ulong()
start = ctypes.cast(lib.cuCtxSynchronize, ctypes.c_void_p)
assert libc.pthread_create(ctypes.byref(thread), None, start, None) == 0
assert libc.pthread_join(thread, None) == 0
lib.cuCtxSynchronize()  # line:python
