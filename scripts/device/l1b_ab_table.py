"""The Llama-3.2-1B A/B table of a baseline tree against this one (call18_4gpu.sh, call19_4gpu.sh).

  python3 scripts/device/l1b_ab_table.py DIR

DIR holds `zerotrain train --summary` files named l1b-<tag>-<label>.json (tag: g<GPU>r<round>;
label: base or new). Prints one row per label (every run with its GPU, the median ms/iteration,
MFU, the largest peak, the median forward / backward / step phase times) and new / base.
"""
import glob
import json
import os
import statistics
import sys

R = sys.argv[1]
d = {}
for f in sorted(glob.glob(f"{R}/l1b-*.json")):
    j = json.load(open(f))
    tag, v = os.path.basename(f)[4:-5].rsplit("-", 1)
    d.setdefault(v, []).append((j["ms_per_iter"], j.get("mfu", 0), j["peak_gib"], j.get("phase_ms", {}), tag))
print("| Llama-3.2-1B, bf16, ZeRO-0, mb 4, seq 2048, 1 H100 | runs ms/iter (GPU) | median ms | MFU | peak GiB | fwd / bwd / step ms |")
print("|---|---|---|---|---|---|")
for v, name in (("base", "baseline"), ("new", "this tree")):
    if v in d:
        r = d[v]
        ph = lambda k: statistics.median(x[3].get(k, 0) for x in r)
        print(f"| {name} | {', '.join(f'{x[0]:.1f} ({x[4][1]})' for x in r)} | {statistics.median(x[0] for x in r):.1f} | "
              f"{statistics.median(x[1] for x in r) * 100:.1f}% | {max(x[2] for x in r):.2f} | "
              f"{ph('forward'):.1f} / {ph('backward'):.1f} / {ph('step'):.1f} |")
med = {v: statistics.median(x[0] for x in d[v]) for v in d}
if "new" in med and "base" in med:
    print(f"new / base: {med['new'] / med['base']:.3f}")
