"""Recomputes the energy step from a `--power` trace's power lines, and checks what
`cudatrace summary --json` says of it: `power.step_ns` (the median time between changes
of the readings the energy comes from, the coarsest GPU's) and each stage's
`within_one_step` (its duration shorter than that step). Exit 1 on a mismatch.

Usage: power_step_check.py TRACE.jsonl SUMMARY.json"""
import json, sys, statistics
trace, summary = sys.argv[1], json.load(open(sys.argv[2]))
header, series = None, {}
for line in open(trace):
    rec = json.loads(line)
    if rec["type"] == "header":
        header = rec
    elif rec["type"] == "power":
        series.setdefault(rec["device"], []).append(rec)
counter = {d["index"]: d.get("energy_counter") for d in header["power"]["devices"]}
medians = {}
for dev, lines in series.items():
    key = "energy_mj" if counter.get(dev) else None
    values = [(l["ts_ns"], l[key] if key else l.get("power_instant_mw", l.get("power_mw"))) for l in lines]
    changes, last = [], values[0][1]
    for ts, v in values[1:]:
        if v != last:
            changes.append(ts)
            last = v
    steps = [b - a for a, b in zip(changes, changes[1:])][:4096]
    steps.sort()
    medians[dev] = steps[(len(steps) - 1) // 2] if steps else None
    print(f"device {dev}: {len(lines)} samples, {len(changes)} changes, median step {medians[dev]} ns ({'counter' if key else 'power'})")
power = summary["power"]
expected = max(m for m in medians.values() if m is not None)
print(f"summary step_ns {power.get('step_ns')} expected {expected}: {'OK' if power.get('step_ns') == expected else 'MISMATCH'}")
bad = 0
for proc in power["stages"]:
    for st in proc["stages"]:
        want = st["duration_ns"] < expected
        if st["within_one_step"] != want:
            bad += 1
        print(f"  pid {proc['pid']} {st['name']:<18} {st['duration_ns']:>12} ns  {st['energy_j']:.3f} J  marked {st['within_one_step']}  expected {want}")
print("stages OK" if bad == 0 else f"stages MISMATCH {bad}")
sys.exit(0 if bad == 0 and power.get("step_ns") == expected else 1)
