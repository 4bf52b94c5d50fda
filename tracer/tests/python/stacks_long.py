"""Calls the stand-in libcuda (ctypes) from a generated function whose line table is over
16 KiB (as Inductor's generated `call` of about 1,000 lines has), from a line in its
middle and from its last, and records at each call the stack CPython gives for it (as
stacks_target.py does), for tests/stacks.rs. Prints the table's size on stderr. Waits a
second before it exits, so that the tracer reads the table while the process lives.

usage: stacks_long.py LIBCUDA OUT.json [wait]

wait: between the function's two runs, wait until the probe on code frees is linked and the
layout given again (a new process image, as stacks_records.py does): the function's code
object is read again under it, and its table with it. Without it the link may come between
any two calls, or after the last.
"""

import ctypes
import json
import sys
import time

from free_probe import wait_for_the_free_probe
from stack_recorder import recorded, seen

lib = ctypes.CDLL(sys.argv[1])


def generated(lines):
    body = [f"    v{i} = {i} * 3 + len('{'x' * (i % 7)}')\n" for i in range(lines)]
    call = "    seen(); lib.cuCtxSynchronize()\n"
    source = "def call(steps):\n" + "".join(body[: lines // 2]) + call
    source += "".join(body[lines // 2 :]) + call + "    return steps\n"
    namespace = {"seen": seen, "lib": lib}
    exec(compile(source, "<generated inductor call>", "exec"), namespace)
    return namespace["call"]


# Lines enough for a table over 16 KiB on every version (3.10's is about 2 bytes a line).
lines = 1000
call = generated(lines)
while len(call.__code__.co_linetable) <= 20000:
    lines *= 2
    call = generated(lines)
print(f"line table: {len(call.__code__.co_linetable)} bytes", file=sys.stderr)


def main():
    for step in range(2):
        call(step)  # line:outer
        if step == 0 and sys.argv[3:] == ["wait"]:
            wait_for_the_free_probe(settle=0.2)


main()
with open(sys.argv[2], "w") as out:
    json.dump({str(tid): stacks for tid, stacks in recorded.items()}, out)
time.sleep(1)
