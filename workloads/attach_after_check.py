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
    during_ratios = {"attach": [], "none": []}
    print(f"| round | kind | before ms | window ms | after ms | window/before | after/before |  ({mode})")
    print("|---|---|---:|---:|---:|---:|---:|")
    for line in open(rounds_path):
        round_, kind, before_end, after_start = line.split()
        before_end, after_start = int(before_end), int(after_start)
        before = [i["dt_ns"] for i in iters if before_end - WINDOW_NS <= i["t_ns"] < before_end]
        after = [i["dt_ns"] for i in iters if after_start <= i["t_ns"] < after_start + WINDOW_NS]
        if not before or not after:
            print(f"| {round_} | {kind} | no iterations |")
            return 1
        # The window's second second (it opens within about 0.3 s of the command).
        during = [
            i["dt_ns"] for i in iters
            if before_end + WINDOW_NS // 2 <= i["t_ns"] < before_end + WINDOW_NS
        ]
        b, a = statistics.median(before) / 1e6, statistics.median(after) / 1e6
        d = statistics.median(during) / 1e6 if during else float("nan")
        ratios[kind].append(a / b)
        during_ratios[kind].append(d / b)
        print(f"| {round_} | {kind} | {b:.4f} | {d:.4f} | {a:.4f} | x{d / b:.3f} | x{a / b:.3f} |")
    attach, none = statistics.median(ratios["attach"]), statistics.median(ratios["none"])
    print(
        f"after/before, median of {len(ratios['attach'])} rounds: attach x{attach:.3f}, "
        f"none x{none:.3f}; attach/none x{attach / none:.3f}"
    )
    d_attach = statistics.median(during_ratios["attach"])
    d_none = statistics.median(during_ratios["none"])
    print(
        f"window/before, median: attach x{d_attach:.3f}, none x{d_none:.3f}; "
        f"attach/none x{d_attach / d_none:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
