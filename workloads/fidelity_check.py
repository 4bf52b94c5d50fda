#!/usr/bin/env python3
"""Checks a cudatrace trace against what it must hold (stdlib only).

  fidelity_check.py names TRACE.jsonl [--expect SUBSTRING]...
      Every launch names its kernel: no `unknown@`, no name cut (`kernel_name_truncated`,
      `string_truncated`); mangled names are demangled. Lists the longest names. Each
      --expect SUBSTRING must be in some launch's demangled `kernel`, with its mangled
      name whole. Exit 1 when a check fails.

  fidelity_check.py counts TRACE.jsonl COUNTS_FILE...
      Per function, the calls in the trace (`--functions all`) against CUPTI's own count
      (workloads/cupti_api_count.c's files, "cbid name count", one per process). CUPTI
      starts inside the first cuInit, so the trace's calls are counted twice: all of them,
      and those that started after that cuInit returned (what CUPTI can see). Lists every
      function; exit 1 when any differs after cuInit, or the trace lost events.
"""
import collections
import json
import os
import sys


def read(path):
    with open(path) as trace:
        for line in trace:
            yield json.loads(line)


def names(path, expected):
    launches = 0
    failures = []
    longest = {}
    seen_expected = collections.Counter()
    for line in read(path):
        if line["type"] != "call" or "grid" not in line:
            continue
        launches += 1
        kernel = line.get("kernel")
        warnings = line.get("warnings", [])
        if kernel is None or kernel.startswith("unknown@"):
            failures.append(f"{line['name']} at {line['ts_ns']}: kernel {kernel!r}")
            continue
        if "kernel_name_truncated" in warnings:
            failures.append(f"cut name: {kernel[:80]}... ({len(kernel)} bytes)")
        if kernel.startswith("_Z"):
            failures.append(f"not demangled: {kernel[:80]}...")
        mangled = line.get("kernel_mangled", kernel)
        longest[mangled] = kernel
        for substring in expected:
            if substring in kernel:
                seen_expected[substring] += 1
    print(f"launches: {launches}, distinct kernels: {len(longest)}")
    print("longest names (mangled bytes, demangled bytes, start of the demangled name):")
    for mangled, kernel in sorted(longest.items(), key=lambda kv: -len(kv[0]))[:10]:
        print(f"  {len(mangled):5} {len(kernel):5}  {kernel[:110]}")
    for substring in expected:
        print(f"launches of a kernel with {substring!r}: {seen_expected[substring]}")
        if seen_expected[substring] == 0:
            failures.append(f"no launch of a kernel with {substring!r}")
    for failure in failures[:20]:
        print(f"FAIL  {failure}")
    print("names: OK" if not failures else f"names: {len(failures)} failures")
    return 0 if not failures else 1


def counts(path, count_files):
    cupti = collections.Counter()
    cupti_pids = set()
    for count_file in count_files:
        cupti_pids.add(int(os.path.splitext(count_file)[1][1:] or 0))
        with open(count_file) as lines:
            for line in lines:
                _cbid, name, count = line.split()
                cupti[name] += int(count)
    all_calls = collections.Counter()
    after_init = collections.Counter()
    init_end = {}
    lost = None
    for line in read(path):
        if line["type"] == "footer":
            lost = line["lost"]["total"]
        if line["type"] != "call":
            continue
        pid = line["pid"]
        if cupti_pids and pid not in cupti_pids:
            continue
        all_calls[line["name"]] += 1
        if pid in init_end and line["ts_ns"] >= init_end[pid]:
            after_init[line["name"]] += 1
        if line["name"] == "cuInit" and pid not in init_end:
            init_end[pid] = line["ts_ns"] + line["dur_ns"]
    functions = sorted(set(all_calls) | set(cupti), key=lambda n: (-cupti[n], n))
    print(f"trace: {sum(all_calls.values())} calls of {len(all_calls)} functions "
          f"({sum(after_init.values())} after cuInit); CUPTI: {sum(cupti.values())} calls of "
          f"{len(cupti)} functions; lost in the trace: {lost}")
    print(f"{'function':44} {'trace':>9} {'after cuInit':>13} {'CUPTI':>9}")
    differ = []
    for name in functions:
        same = after_init[name] == cupti[name]
        mark = "" if same else "  <- differs"
        print(f"{name:44} {all_calls[name]:9} {after_init[name]:13} {cupti[name]:9}{mark}")
        if not same:
            differ.append(name)
    print(f"functions: {len(functions)}, equal after cuInit: {len(functions) - len(differ)}, "
          f"differing: {len(differ)} {differ}")
    return 0 if not differ and lost == 0 else 1


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "names":
        rest = sys.argv[3:]
        expected = [rest[i + 1] for i in range(0, len(rest) - 1, 2) if rest[i] == "--expect"]
        return names(sys.argv[2], expected)
    if len(sys.argv) >= 4 and sys.argv[1] == "counts":
        return counts(sys.argv[2], sys.argv[3:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
