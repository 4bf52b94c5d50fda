"""Calls the stand-in libcuda COUNT times from one line: the probes send the stack whole at
the first call and then know it (tests/stacks.rs checks the footer's `stack_records`).

usage: stacks_records.py LIBCUDA OUT.json COUNT [wait]

wait: after the first call, wait (up to 30 s) until a breakpoint is in code objects'
deallocator (cudatrace links `py_code_freed` there at the process's first stack and then
gives the probes the layout again, a new process image), and a little more, so that the
second call is the first under the new image: it is sent whole again.
"""

import ctypes
import sys

from free_probe import wait_for_the_free_probe

lib = ctypes.CDLL(sys.argv[1])
count = int(sys.argv[3])
wait = sys.argv[4:] == ["wait"]


def calls():
    for call in range(count):
        lib.cuCtxSynchronize()
        if call == 0 and wait:
            # The layout is given again just after the link.
            wait_for_the_free_probe(settle=0.2)


calls()
