#!/usr/bin/env python3
"""Per-name call counts and copy/launch figures of a cudatrace JSONL trace (stdlib only).

Used to record GPU validation runs in docs/validation.md without depending on cudatrace
itself: `python3 workloads/trace_counts.py trace.jsonl`.
"""
import collections
import json
import sys


def main():
    path = sys.argv[1]
    names = collections.Counter()
    copies = collections.defaultdict(lambda: [0, 0])
    errors = collections.Counter()
    pids = set()
    header = footer = None
    other_types = collections.Counter()
    driver = collections.Counter()
    driver_pids = collections.Counter()
    rm_classes = collections.Counter()
    driver_ns = collections.Counter()
    with open(path) as trace:
        for line in trace:
            rec = json.loads(line)
            kind = rec["type"]
            if kind == "header":
                header = rec
            elif kind == "footer":
                footer = rec
            elif kind == "call":
                names[rec["name"]] += 1
                pids.add(rec["pid"])
                if rec.get("ret", 0) != 0:  # no ret: a launch under --launch-entry-only
                    errors[(rec["name"], rec.get("ret_name", rec["ret"]))] += 1
                if "kind" in rec:
                    copies[rec["kind"]][0] += 1
                    copies[rec["kind"]][1] += rec.get("bytes", 0)
            elif kind == "driver":
                key = (rec["hook"], rec.get("device"), rec.get("escape_name")
                       or (f"escape {rec['escape']:#x}" if "escape" in rec else None)
                       or rec.get("uvm_name") or rec.get("cmd"))
                driver[key] += 1
                driver_ns[key] += rec["dur_ns"]
                driver_pids[rec["pid"]] += 1
                if "rm_class" in rec:
                    rm_classes[rec["rm_class"]] += 1
            else:
                other_types[kind] += 1
    print(f"libcuda: {header['libcuda']}")
    print(f"probes attached: {len(header['probes'])}, missing functions: {header['missing_functions']}")
    print(f"pids with calls: {sorted(pids)}; other line types: {dict(other_types)}")
    print(f"calls: {sum(names.values())}")
    for name, count in sorted(names.items()):
        print(f"  {name:40} {count}")
    for kind, (count, nbytes) in sorted(copies.items()):
        print(f"copies {kind}: {count} calls, {nbytes} bytes")
    for (name, err), count in sorted(errors.items()):
        print(f"errors {name} {err}: {count}")
    if driver:
        print(f"driver events: {sum(driver.values())}, by pid: {dict(driver_pids)}")
        for key, count in sorted(driver.items(), key=lambda kv: -kv[1]):
            print(f"  driver {key}: {count} ({driver_ns[key] / 1e3:.0f} us)")
        print(f"  RM_ALLOC classes: {dict(rm_classes.most_common())}")
    if footer is None:
        print("NO FOOTER")
    else:
        print(f"footer: lost {footer['lost']}, entries_seen {footer['entries_seen']}, "
              f"unmatched_returns {footer['unmatched_returns']}, exit_code {footer.get('exit_code')}")


if __name__ == "__main__":
    main()
