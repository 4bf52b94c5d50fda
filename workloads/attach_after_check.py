"""Reads workloads/attach_after.sh's rounds: per round the median iteration of the 2 s
before the attach (or the same moment of a round without one) and of the 2 s after, and
after/before; then each kind's median ratio and their quotient (attach over none: x1.00 is
no cost left after detach).

    python3 attach_after_check.py ITERS ROUNDS MODE
"""

import json
import statistics
import sys

WINDOW_NS = 2_000_000_000


def main():
    iters_path, rounds_path, mode = sys.argv[1:4]
    iters = [json.loads(line) for line in open(iters_path)]
    ratios = {"attach": [], "none": []}
    print(f"| round | kind | before ms | after ms | after/before |  ({mode})")
    print("|---|---|---:|---:|---:|")
    for line in open(rounds_path):
        round_, kind, before_end, after_start = line.split()
        before_end, after_start = int(before_end), int(after_start)
        before = [i["dt_ns"] for i in iters if before_end - WINDOW_NS <= i["t_ns"] < before_end]
        after = [i["dt_ns"] for i in iters if after_start <= i["t_ns"] < after_start + WINDOW_NS]
        if not before or not after:
            print(f"| {round_} | {kind} | no iterations |")
            return 1
        b, a = statistics.median(before) / 1e6, statistics.median(after) / 1e6
        ratios[kind].append(a / b)
        print(f"| {round_} | {kind} | {b:.4f} | {a:.4f} | x{a / b:.3f} |")
    attach, none = statistics.median(ratios["attach"]), statistics.median(ratios["none"])
    print(
        f"after/before, median of {len(ratios['attach'])} rounds: attach x{attach:.3f}, "
        f"none x{none:.3f}; attach/none x{attach / none:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
