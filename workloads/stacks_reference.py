"""CPython's own stack at every kernel launch, recorded in-process: the reference the GPU
check of `cudatrace run --stacks` compares with (workloads/stacks_gpu.sh, issue 23).

Subscribes a CUPTI driver-API callback (ctypes, CUPTI's callback API) to the launch
functions; at each launch's entry, on the launching thread, it walks the Python frames
under the callback (`sys._getframe`, as `traceback` does: file, qualified name, line),
then runs WORKLOAD in this process (runpy) with ARGS. At exit the launches are written to
$STACKS_REFERENCE_OUT as JSON: [[tid, cbid, [[file, qualname, line], ...innermost first]],
...] in callback order.

usage: STACKS_REFERENCE_OUT=ref.json python3 stacks_reference.py WORKLOAD [ARGS...]
"""

import atexit
import ctypes
import glob
import json
import os
import runpy
import site
import sys
import threading

# CUPTI_CB_DOMAIN_DRIVER_API and the launch functions' callback ids (cupti_driver_cbid.h,
# as tracer-common/src/cbids.rs lists them).
DRIVER_API = 1
LAUNCHES = {
    307: "cuLaunchKernel",
    442: "cuLaunchKernel_ptsz",
    477: "cuLaunchCooperativeKernel",
    478: "cuLaunchCooperativeKernel_ptsz",
    514: "cuGraphLaunch",
    515: "cuGraphLaunch_ptsz",
    652: "cuLaunchKernelEx",
    653: "cuLaunchKernelEx_ptsz",
}
API_ENTER = 0


def find_cupti():
    for base in site.getsitepackages():
        for pattern in ("nvidia/cu13/lib/libcupti.so*", "nvidia/cuda_cupti/lib/libcupti.so*"):
            found = sorted(glob.glob(os.path.join(base, pattern)))
            if found:
                return found[0]
    raise SystemExit("stacks_reference: no libcupti in the NVIDIA wheels")


launches = []
lock = threading.Lock()

CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p)


def on_launch(userdata, domain, cbid, cbdata):
    # CUpti_CallbackData opens with its callbackSite.
    if ctypes.cast(cbdata, ctypes.POINTER(ctypes.c_int))[0] != API_ENTER:
        return
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        frames.append([code.co_filename, getattr(code, "co_qualname", code.co_name), frame.f_lineno])
        frame = frame.f_back
    with lock:
        launches.append([threading.get_native_id(), cbid, frames])


callback = CALLBACK(on_launch)
cupti = ctypes.CDLL(find_cupti())
subscriber = ctypes.c_void_p()
status = cupti.cuptiSubscribe(ctypes.byref(subscriber), callback, None)
if status != 0:
    raise SystemExit(f"stacks_reference: cuptiSubscribe failed ({status})")
for cbid in LAUNCHES:
    cupti.cuptiEnableCallback(1, subscriber, DRIVER_API, cbid)


@atexit.register
def write():
    with open(os.environ["STACKS_REFERENCE_OUT"], "w") as out:
        json.dump(launches, out)


workload = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(workload, run_name="__main__")
