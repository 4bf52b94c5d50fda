"""Which code objects a workload makes and frees as it runs (issue 32: under `--stacks` each
free is a trap into `py_code_freed`; this found that GPT-2 decoding frees none, run AR).

CPython 3.12+'s own code watchers (`PyCode_AddWatcher`, through ctypes) count every code
object created and destroyed during N steps of one of attach_target.py's modes, after its
warm-up, grouped by the code object's (file, qualified name, first line) and by the Python
frames that were running when it was made. Prints one JSON object.

With --script FILE, the watchers count over a whole run of a script instead (ARGS after
`--` are its arguments), from before its first import to its end (not the interpreter's teardown after it, which
frees most of what was made), and each event is also
put down to the line of FILE that was running (where in the script code objects come and go).

Usage: python3 code_churn.py train|gpt2|launch [--steps N] [--top K]
       python3 code_churn.py --script FILE [--top K] [-- ARGS...]
"""

import argparse
import collections
import ctypes
import json
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

CREATE, DESTROY = 0, 1


def where(code):
    return f"{code.co_filename}:{code.co_firstlineno} {code.co_qualname}"


def script_line(path):
    # The innermost frame running FILE's own code, by function and line.
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == path:
            return f"{frame.f_code.co_qualname}:{frame.f_lineno}"
        frame = frame.f_back
    return "(not under the script)"


def caller_chain(depth):
    # Frame 0 is the watcher callback; 1 is the code that was running when CPython made
    # or freed the code object (the watcher runs inside that call).
    frame = sys._getframe(2)
    chain = []
    while frame is not None and len(chain) < depth:
        code = frame.f_code
        chain.append(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_qualname}")
        frame = frame.f_back
    return " <- ".join(chain) or "(no Python frame)"


class Watch:
    """Counts code objects made and freed while `on`, through CPython's code watchers."""

    def __init__(self, top, script=None):
        self.top = top
        self.script = script
        self.on = False
        self.counts = {name: collections.Counter() for name in
                       ("made", "freed", "made_by", "freed_by", "made_at", "freed_at")}

        @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.py_object)
        def callback(event, code):
            if not self.on:
                return 0
            self.on = False  # what this callback makes is not the workload's
            try:
                kind = {CREATE: "made", DESTROY: "freed"}.get(event)
                if kind is not None:
                    self.counts[kind][where(code)] += 1
                    self.counts[kind + "_by"][caller_chain(6)] += 1
                    if self.script:
                        self.counts[kind + "_at"][script_line(self.script)] += 1
            finally:
                self.on = True
            return 0

        self.callback = callback
        add = ctypes.pythonapi.PyCode_AddWatcher
        add.restype = ctypes.c_int
        add.argtypes = [ctypes.c_void_p]
        self.id = add(ctypes.cast(callback, ctypes.c_void_p))
        if self.id < 0:
            sys.exit("code_churn: PyCode_AddWatcher failed")
        # The watcher must see a compile: a count of 0 later means none, not a deaf watcher.
        self.on = True
        exec(compile("churn_check = 1", "<code_churn check>", "exec"), {})
        self.on = False
        made = sum(self.counts["made"].values())
        freed = sum(self.counts["freed"].values())
        if made != 1 or freed != 1:
            sys.exit(f"code_churn: the watcher's own check saw {made} made, {freed} freed (1, 1)")
        for counter in self.counts.values():
            counter.clear()

    def close(self):
        self.on = False
        ctypes.pythonapi.PyCode_ClearWatcher(ctypes.c_int(self.id))

    def report(self, **head):
        made = sum(self.counts["made"].values())
        freed = sum(self.counts["freed"].values())
        body = dict(head, python=sys.version.split()[0], made=made, freed=freed)
        if "steps" in head:
            body.update(made_per_step=made / head["steps"], freed_per_step=freed / head["steps"])
        for name, counter in self.counts.items():
            if counter:
                body["top_" + name] = [[key, n] for key, n in counter.most_common(self.top)]
        return body


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", choices=["train", "gpt2", "launch"])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--script")
    argv = sys.argv[1:]
    rest = []
    if "--" in argv:
        rest = argv[argv.index("--") + 1:]
        argv = argv[: argv.index("--")]
    args = parser.parse_args(argv)
    args.args = rest
    if sys.version_info < (3, 12):
        sys.exit("code_churn: code watchers need CPython 3.12 or later")
    if (args.mode is None) == (args.script is None):
        parser.error("give a mode or --script FILE")
    if args.script:
        path = os.path.abspath(args.script)
        watch = Watch(args.top, path)
        sys.argv = [path, *args.args]
        watch.on = True
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exit:
            if exit.code not in (None, 0):
                raise
        watch.close()
        print(json.dumps(watch.report(script=args.script, args=args.args), indent=1), flush=True)
        return 0

    sys.path.insert(0, HERE)
    import attach_target
    import torch

    factories = {
        "train": attach_target.train_step_factory,
        "gpt2": attach_target.gpt2_step_factory,
        "launch": attach_target.launch_step_factory,
    }
    step = factories[args.mode]()
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    watch = Watch(args.top)
    watch.on = True
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    watch.close()
    print(json.dumps(watch.report(mode=args.mode, steps=args.steps), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
