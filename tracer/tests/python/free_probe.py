"""For the stacks test scripts: waits until cudatrace's probe on code objects' deallocator
is linked in this process (`PyCode_Type.tp_dealloc`'s first bytes change: cudatrace links
`py_code_freed` there at the process's first stack, and a uprobe writes its breakpoint into
the process's own copy of the page). Copied beside each script (tests/stacks.rs).
"""

import ctypes
import time

# PyTypeObject: ob_refcnt, ob_type, ob_size, tp_name, tp_basicsize, tp_itemsize, tp_dealloc.
_code_type = type((lambda: 0).__code__)
_dealloc = ctypes.c_void_p.from_address(id(_code_type) + 48).value
_unlinked = ctypes.string_at(_dealloc, 4)


def wait_for_the_free_probe(settle=0.0):
    """Waits up to 30 s for the probe's breakpoint, then `settle` seconds more."""
    deadline = time.monotonic() + 30
    while ctypes.string_at(_dealloc, 4) == _unlinked and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(settle)
