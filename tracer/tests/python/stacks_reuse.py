"""Frees code objects and makes new ones, so that a new code object lands where a freed
one was: each step compiles a function of its own name (and line), calls the stand-in
libcuda from it, and drops it. The stacks cudatrace reads must name each step's own
function, however the addresses repeat (tests/stacks.rs compares them with CPython's).

usage: stacks_reuse.py LIBCUDA OUT.json [wait]

wait: after the first step's call, wait (up to 30 s) until a breakpoint is in code objects'
deallocator (the first bytes of `PyCode_Type.tp_dealloc` change: cudatrace links
`py_code_freed` there at the process's first stack, and a uprobe writes its breakpoint into
the process's own copy of the page), so that the frees that follow are the probe's to count.

OUT.json: per thread id, the stacks CPython gives at each call (as stacks_target.py);
OUT.json.codes: the address of each step's code object, in step order.
"""

import ctypes
import json
import sys

from free_probe import wait_for_the_free_probe
from stack_recorder import recorded, seen

lib = ctypes.CDLL(sys.argv[1])
wait = sys.argv[3:] == ["wait"]


def steps(count):
    codes = []
    for step in range(count):
        source = "\n" * (step % 3) + f"def step_{step}():\n    seen(); lib.cuCtxSynchronize()\n"
        namespace = {"seen": seen, "lib": lib}
        exec(compile(source, "<generated step>", "exec"), namespace)
        function = namespace.pop(f"step_{step}")
        codes.append(id(function.__code__))
        function()
        if step == 0 and wait:
            wait_for_the_free_probe()
        del function, namespace
    return codes


codes = steps(60)
with open(sys.argv[2], "w") as out:
    json.dump({str(tid): stacks for tid, stacks in recorded.items()}, out)
with open(sys.argv[2] + ".codes", "w") as out:
    json.dump(codes, out)
