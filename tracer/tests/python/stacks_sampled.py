"""Calls the stand-in libcuda (ctypes) from three threads, and records at each call the stack
CPython gives for it (as stacks_target.py does), for `--stack-every` (tests/stacks.rs): the
main thread makes 4 calls, then two threads make 7 and 5 calls taking turns strictly (one
call each in turn), so that a count shared by the threads would sample other calls than a
count per thread. Calls alternate between a synchronisation and a launch.

usage: stacks_sampled.py LIBCUDA OUT.json
"""

import ctypes
import json
import sys
import threading

lib = ctypes.CDLL(sys.argv[1])
recorded = {}
lock = threading.Lock()


def seen():
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        name = getattr(code, "co_qualname", code.co_name)
        frames.append([code.co_filename, name, frame.f_lineno])
        frame = frame.f_back
    with lock:
        recorded.setdefault(threading.get_native_id(), []).append(frames)


def call(index):
    if index % 2 == 0:
        seen(); lib.cuCtxSynchronize()  # line:sync
    else:
        seen(); lib.cuLaunchKernel(None, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # line:launch


def worker(calls, mine, theirs):
    for index in range(calls):
        mine.acquire()
        call(index)
        theirs.release()


def main():
    for index in range(4):
        call(index)  # line:main
    first, second = threading.Semaphore(1), threading.Semaphore(0)
    # The first thread's calls beyond the second's go on alone (the second releases its
    # turn for good when done).
    workers = [
        threading.Thread(target=worker, args=(7, first, second)),
        threading.Thread(target=worker, args=(5, second, first)),
    ]
    for thread in workers:
        thread.start()
    workers[1].join()
    for _ in range(2):
        first.release()
    workers[0].join()


main()
with open(sys.argv[2], "w") as out:
    json.dump({str(tid): stacks for tid, stacks in recorded.items()}, out)
