"""Calls the stand-in libcuda (ctypes) from known lines, and records at each call the stack
CPython itself gives for it, so that tests/stacks.rs can compare the stacks cudatrace read
with CPython's, frame for frame.

usage: stacks_target.py LIBCUDA OUT.json [RECURSION]

Each call is `seen(); lib.cuCtxSynchronize()` (or a launch) on one line: `seen()` records the calling
thread's frames (file, qualified name, line; innermost first) from `sys._getframe`, which
is what `traceback` reads, then the call is made from that same line. OUT.json holds, per
thread id (the kernel's), the stacks in call order. Lines the tests check by number are
marked `# line:NAME`.
"""

import asyncio
import ctypes
import json
import sys
import threading

from stack_recorder import recorded, seen

lib = ctypes.CDLL(sys.argv[1])


class Block:
    def forward(self, steps):
        for step in range(steps):
            seen(); lib.cuCtxSynchronize()  # line:block_loop
        return steps


class Net:
    def __init__(self):
        self.blocks = [Block(), Block()]

    def forward(self):
        total = 0
        for block in self.blocks:
            total += block.forward(2)  # line:net_loop
        try:
            raise ValueError("caught")
        except ValueError:
            pass
        seen(); lib.cuCtxSynchronize()  # line:after_try
        seen(); lib.cuLaunchKernel(None, 1, 1, 1, 32, 1, 1, 0, None, None, None)  # line:launch
        return total


def generated(count):
    for index in range(count):
        seen(); lib.cuCtxSynchronize()  # line:generator
        yield index


async def awaited(depth):
    if depth:
        return await awaited(depth - 1)
    seen(); lib.cuCtxSynchronize()  # line:coroutine
    await asyncio.sleep(0)


def deep(depth):
    if depth == 0:
        seen(); lib.cuCtxSynchronize()  # line:deep
        return
    deep(depth - 1)


def threaded():
    seen(); lib.cuCtxSynchronize()  # line:thread


# A function whose line table is some kilobytes (its code record over 1024 bytes).
LONG_BODY = "def long_body():\n" + "".join(
    f"    v{i} = {i} * 3 + len('{'x' * (i % 7)}')\n" for i in range(300)
) + "    seen(); lib.cuCtxSynchronize()\n"
exec(compile(LONG_BODY, "<generated long_body>", "exec"))


def main():
    Net().forward()  # line:main_net
    list(generated(2))
    asyncio.run(awaited(2))
    squares = [seen() or lib.cuCtxSynchronize() for _ in range(2)]  # line:comprehension
    workers = [threading.Thread(target=threaded, name=f"worker-{i}") for i in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    deep(int(sys.argv[3]) if len(sys.argv) > 3 else 40)
    long_body()
    return squares


main()  # line:module_main
with open(sys.argv[2], "w") as out:
    json.dump({str(tid): stacks for tid, stacks in recorded.items()}, out)
