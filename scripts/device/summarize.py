#!/usr/bin/env python3
"""One line per `zerotrain train --summary` file (DIR/*.jsonl): ms/iteration, phase times,
peak GPU memory, MFU and the first and last loss. Used by the device scripts."""
import glob
import json
import os
import sys

print(f"{'run':24} {'ms/iter':>8} {'fwd':>6} {'bwd':>6} {'step':>6} {'peak GiB':>8} {'MFU':>6} {'loss':>14}")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl"))):
    for line in open(f):
        j = json.loads(line)
        if "phase_ms" not in j:
            continue
        p = j["phase_ms"]
        print(f"{os.path.basename(f)[:-6]:24} {j['ms_per_iter']:8.1f} {p['forward']:6.1f} {p['backward']:6.1f} "
              f"{p['step']:6.1f} {j['peak_gib']:8.2f} {100 * j.get('mfu', 0):5.1f}% "
              f"{j['loss_first']:6.3f}->{j['loss_last']:6.3f}")
