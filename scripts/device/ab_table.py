"""The A/B table of a baseline tree against this one (speed_ab_1gpu.sh, sweep_ab_2gpu.sh).

  python3 scripts/device/ab_table.py DIR

DIR holds one folder per bench run, named <base|new>-r<round>-<config>, each with the bench's
results.json. Prints one row per configuration (median ms/iteration of each side with every
run, the ratio change / baseline, the first run's peak GiB of each side) and writes
DIR/speed_ab.json.
"""
import glob
import json
import os
import statistics
import sys

R = sys.argv[1]
res = {}
for f in glob.glob(f"{R}/*-r*-*/results.json"):
    v, r, c = os.path.basename(os.path.dirname(f)).split("-", 2)
    for row in json.load(open(f))["rows"]:
        if row.get("status") == "ok":
            res.setdefault(c, {}).setdefault(v, []).append((row["ms_per_iter"], row.get("peak_gib")))
print("| config | baseline ms/iter (runs) | change ms/iter (runs) | change / baseline | peak GiB base / change |")
print("|---|---|---|---|---|")
out = {}
for c in sorted(res):
    b, n = res[c].get("base", []), res[c].get("new", [])
    if b and n:
        mb, mn = statistics.median(x for x, _ in b), statistics.median(x for x, _ in n)
        out[c] = {"base": [x for x, _ in b], "new": [x for x, _ in n], "ratio": mn / mb,
                  "peak_gib": {"base": b[0][1], "new": n[0][1]}}
        runs = lambda s: ", ".join(f"{x:.1f}" for x, _ in s)
        peak = lambda p: f"{p:.2f}" if isinstance(p, (int, float)) else "-"
        print(f"| {c} | {mb:.1f} ({runs(b)}) | {mn:.1f} ({runs(n)}) | {mn / mb:.3f} | {peak(b[0][1])} / {peak(n[0][1])} |")
json.dump(out, open(f"{R}/speed_ab.json", "w"), indent=1)
