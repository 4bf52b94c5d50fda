"""Compares the Python stack `cudatrace run --stacks` recorded for every launch with the
one CPython gave in-process at that launch (workloads/stacks_reference.py), frame for
frame: file, qualified name, line. Launches are paired per thread, in order.

usage: stacks_check.py [--window] TRACE.jsonl REFERENCE.json

--window: the trace covers a window of the run (`run -p PID --stacks --duration`): each
traced thread's launches are a run of consecutive launches of CPython's list, placed where
their first 64 stacks equal CPython's and, of those places (a loop repeats its stacks),
where most of 400 launches spread over the run equal CPython's; then compared as above;
threads without a traced launch are left out.

Prints the counts and the first differences; exits 1 unless every launch's stack is equal
(the innermost `depth` frames, and marked cut, where the reference is deeper than the
frame budget).
"""

import json
import sys

LAUNCH_PREFIXES = ("cuLaunchKernel", "cuLaunchCooperativeKernel", "cuGraphLaunch")


def main():
    args = sys.argv[1:]
    window = args[:1] == ["--window"]
    trace_path, reference_path = args[-2], args[-1]
    stacks, launches, depth, footer = {}, {}, None, {}
    with open(trace_path) as trace:
        for text in trace:
            line = json.loads(text)
            kind = line["type"]
            if kind == "header":
                depth = line["stacks"]["depth"]
            elif kind == "stack":
                frames = [[f["file"], f["qualname"], f.get("line")] for f in line["frames"]]
                stacks[line["id"]] = (frames, line.get("cut", False))
            elif kind == "call" and line["name"].startswith(LAUNCH_PREFIXES):
                launches.setdefault(line["tid"], []).append((line["ts_ns"], line.get("stack")))
            elif kind == "footer":
                footer = line
    with open(reference_path) as reference:
        expected = {}
        for tid, _cbid, frames in json.load(reference):
            expected.setdefault(tid, []).append(frames)

    compared = equal = cut = 0
    differences = []
    def same(stack, frames):
        if stack is None:
            return False
        recorded, was_cut = stacks[stack]
        return recorded == frames[:depth] and was_cut == (len(frames) > depth)

    tids = set(launches) if window else set(expected) | set(launches)
    for tid in sorted(tids):
        got = [stack for _, stack in sorted(launches.get(tid, []))]
        want = expected.get(tid, [])
        if window:
            head = min(len(got), 64)
            places = [
                o for o in range(len(want) - len(got) + 1)
                if all(same(got[i], want[o + i]) for i in range(head))
            ]
            sample = range(0, len(got), max(1, len(got) // 400))
            at = max(
                places,
                key=lambda o: sum(same(got[i], want[o + i]) for i in sample),
                default=None,
            )
            if at is None:
                differences.append(f"thread {tid}: its {len(got)} traced launches are nowhere in CPython's {len(want)}")
                continue
            print(f"thread {tid}: {len(got)} traced launches are CPython's {at} to {at + len(got) - 1} of {len(want)}")
            want = want[at:at + len(got)]
        if len(got) != len(want):
            differences.append(f"thread {tid}: {len(got)} launches traced, {len(want)} in CPython's")
        for index, (stack, frames) in enumerate(zip(got, want)):
            compared += 1
            kept = frames[:depth]
            if stack is None:
                differences.append(f"thread {tid} launch {index}: no stack; CPython's {frames[:3]}...")
                continue
            recorded, was_cut = stacks[stack]
            if recorded == kept and was_cut == (len(frames) > depth):
                equal += 1
                cut += int(was_cut)
            else:
                differences.append(
                    f"thread {tid} launch {index}:\n  traced  {recorded} cut={was_cut}\n"
                    f"  CPython {kept}"
                )
    depths = [len(frames) for frames in sum(expected.values(), [])]
    print(f"launches: {sum(len(v) for v in launches.values())} traced, "
          f"{sum(len(v) for v in expected.values())} in CPython's callback")
    print(f"compared: {compared}, equal frame for frame: {equal}, cut at {depth}: {cut}")
    if depths:
        print(f"CPython's stack depth at launches: min {min(depths)}, max {max(depths)}, "
              f"distinct stacks traced: {len(stacks)}")
    print(f"footer stacks: {json.dumps(footer.get('stacks'))}")
    for difference in differences[:5]:
        print("DIFFERENCE", difference)
    ok = not differences and compared > 0 and equal == compared
    print("OK" if ok else f"FAILED: {len(differences)} differences")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
