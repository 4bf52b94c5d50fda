"""Run with the stand-in libcuda preloaded (LD_PRELOAD), so that cudatrace looks at the
interpreter before it is initialised, with no frame to check: two calls from Python, then
a pause, so that the process is still there when the first stack arrives and its layout is
checked then.

usage: stacks_preloaded.py LIBCUDA
"""

import ctypes
import sys
import time

lib = ctypes.CDLL(sys.argv[1])
lib.cuCtxSynchronize()  # line:first
lib.cuCtxSynchronize()  # line:second
time.sleep(0.5)
