"""A Python program for `cudatrace run -p PID --gpu` tests: it loops on the STAND-IN libcuda
(never NVIDIA's driver) through ctypes, started untraced.

    python3 attach_loop.py LIBCUDA ITERATIONS

cuInit, the primary context, cuModuleLoadData, cuModuleGetFunction("_Z9attach_pyv"); prints
"ready"; then ITERATIONS times cuLaunchKernel(f, i % 5 + 1, 1, 1, 32, 1, 1, 0, NULL, NULL,
NULL) and time.sleep(0.001); prints "done N launches, F failed" and exits 5.
"""

import ctypes
import sys
import time


def main():
    cuda = ctypes.CDLL(sys.argv[1])
    iterations = int(sys.argv[2])
    cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    ctx = ctypes.c_void_p()
    module = ctypes.c_void_p()
    function = ctypes.c_void_p()
    image = (ctypes.c_ubyte * 64)(0x7F, ord("E"), ord("L"), ord("F"), 2, 1, 1, 0x33)
    if (
        cuda.cuInit(0)
        or cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
        or cuda.cuCtxSetCurrent(ctx)
        or cuda.cuModuleLoadData(ctypes.byref(module), image)
        or cuda.cuModuleGetFunction(ctypes.byref(function), module, b"_Z9attach_pyv")
    ):
        print("attach_loop.py: set-up failed", file=sys.stderr)
        return 3
    print("ready", flush=True)
    failed = 0
    for i in range(iterations):
        if cuda.cuLaunchKernel(function, i % 5 + 1, 1, 1, 32, 1, 1, 0, None, None, None):
            failed += 1
        time.sleep(0.001)
    print(f"done {iterations} launches, {failed} failed", flush=True)
    return 5


if __name__ == "__main__":
    sys.exit(main())
