"""For the stacks test scripts: what CPython says a thread's stack is at a call. `seen()`
records its caller's stack (each frame's file, qualified name and line, innermost first)
in `recorded`, under the thread's native id; a script writes `recorded` out at its end.
Copied beside each script, as free_probe.py is (tests/stacks.rs).
"""

import sys
import threading

recorded = {}
_lock = threading.Lock()


def seen():
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        name = getattr(code, "co_qualname", code.co_name)
        frames.append([code.co_filename, name, frame.f_lineno])
        frame = frame.f_back
    with _lock:
        recorded.setdefault(threading.get_native_id(), []).append(frames)
