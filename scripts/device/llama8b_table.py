#!/usr/bin/env python3
"""The table of scripts/device/llama8b_2gpu.sh: one row per run in the folder (zerotrain's
--summary files and llama_dist_anchor.py's JSON lines): ms/iter, tokens/s, MFU, per-phase ms
and peak GiB, and each anchor's time over zerotrain's. Also writes table.json there."""
import json
import os
import sys

R = sys.argv[1]
rows = []
for f in sorted(os.listdir(R)):
    if not f.endswith(".json") or f == "table.json":
        continue
    try:
        j = json.loads(open(os.path.join(R, f)).read().strip().splitlines()[-1])
    except (ValueError, IndexError):
        continue
    if j.get("framework") == "zerotrain":
        pm, pk = j["last_step"]["phase_ms"], j["phase_mem_gib"]
        rows.append({"run": f[:-5], "what": f"zerotrain ZeRO-{j.get('stage', 3)} ({j.get('world', 2)} GPU)", "ms": j["ms_per_iter"], "tps": j["tokens_per_s"],
                     "mfu": j.get("mfu", 0.0), "phase_ms": [pm["forward"], pm["backward"], pm["step"]],
                     "phase_peak": [pk[k]["peak"] for k in ("forward", "backward", "step")], "peak": j["peak_gib"],
                     "loss": j.get("loss_last")})
    elif "anchor" in j:
        pm, pk = j["phase_ms"], j["phase_peak_gib"]
        rows.append({"run": f[:-5], "what": j["anchor"], "ms": j["ms_per_iter"], "tps": j["tokens_per_s"],
                     "mfu": j["mfu"], "phase_ms": [pm["forward"], pm["backward"], pm["step"]],
                     "phase_peak": [pk["forward"], pk["backward"], pk["step"]], "peak": j["peak_gib"],
                     "loss": j.get("loss")})
zt = [r for r in rows if r["what"].startswith("zerotrain")]
print("| run | what | ms/iter | tokens/s | MFU | fwd / bwd / step ms | peak GiB fwd / bwd / step | time / zerotrain's |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    ratio = f"{r['ms'] / zt[0]['ms']:.2f}" if zt else "-"
    print(f"| {r['run']} | {r['what']} | {r['ms']:.0f} | {r['tps']:.0f} | {r['mfu']:.3f} | "
          f"{' / '.join(f'{x:.0f}' for x in r['phase_ms'])} | {' / '.join(f'{x:.1f}' for x in r['phase_peak'])} | "
          f"{ratio} |")
json.dump(rows, open(os.path.join(R, "table.json"), "w"), indent=1)
