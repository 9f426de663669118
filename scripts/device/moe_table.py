#!/usr/bin/env python3
"""The table of scripts/device/moe_2gpu.sh: one row per run in the folder (zerotrain's --summary
files zt_z<S>_<mode>.json and ds_moe_anchor.py's ds_z<S>_<mode>.json): ms/iter, tokens/s, peak GiB,
all-to-all ms per step, dropped fraction, aux loss, last loss, and zerotrain's tokens/s over
DeepSpeed's at the same stage and mode. Also writes table.json there."""
import json
import os
import re
import sys

R = sys.argv[1]


def load(path):
    try:
        return json.loads(open(path).read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


rows = {}
for f in sorted(os.listdir(R)):
    m = re.fullmatch(r"(zt|ds)_z(\d)_(drop|dropless)\.json", f)
    if not m:
        continue
    who, stage, mode = m.groups()
    j = load(os.path.join(R, f))
    if j is None or j.get("status", "ok") != "ok":
        rows[(stage, mode, who)] = {"run": f[:-5], "failed": (j or {}).get("error", "no JSON")}
        continue
    if who == "zt":
        rows[(stage, mode, who)] = {
            "run": f[:-5], "what": f"zerotrain ZeRO-{stage}", "ms": j["ms_per_iter"], "tps": j["tokens_per_s"],
            "peak": j["peak_gib"], "a2a": j.get("moe_all_to_all_ms"), "dropped": j.get("moe_dropped_fraction"),
            "aux": j.get("moe_aux_loss"), "loss": j.get("loss_last"), "tokens_per_expert": j.get("moe_tokens_per_expert")}
    else:
        rows[(stage, mode, who)] = {
            "run": f[:-5], "what": f"DeepSpeed-MoE {j.get('deepspeed', '')} ZeRO-{stage}", "ms": j["ms_per_iter"],
            "tps": j["tokens_per_s"], "peak": j["peak_gib"], "a2a": j.get("all_to_all_ms"),
            "dropped": j.get("dropped_fraction"), "aux": j.get("aux_loss"), "loss": j.get("loss_last"),
            "tokens_per_expert": j.get("tokens_per_expert")}


def num(x, fmt):
    return "-" if x is None else format(x, fmt)


dev = os.path.join(R, "device.txt")
if os.path.exists(dev):
    print(open(dev).read().strip())
print("| run | what | mode | ms/iter | tokens/s | peak GiB | all-to-all ms | dropped | aux | loss | zerotrain / DeepSpeed (tokens/s) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
out = []
for (stage, mode, who) in sorted(rows, key=lambda k: (-int(k[0]), k[1], k[2] != "zt")):
    r = rows[(stage, mode, who)]
    if "failed" in r:
        print(f"| {r['run']} | failed: {r['failed'][:80]} | {mode} | | | | | | | | |")
        out.append(r)
        continue
    z, d = rows.get((stage, mode, "zt")), rows.get((stage, mode, "ds"))
    ratio = "-"
    if z and d and "failed" not in z and "failed" not in d and d["tps"]:
        ratio = f"{z['tps'] / d['tps']:.2f}x" if who == "zt" else "1.00x"
    r["mode"], r["ratio"] = mode, ratio
    print(f"| {r['run']} | {r['what']} | {mode} | {r['ms']:.1f} | {r['tps']:.0f} | {r['peak']:.1f} | "
          f"{num(r['a2a'], '.1f')} | {num(r['dropped'], '.3f')} | {num(r['aux'], '.3f')} | {num(r['loss'], '.3f')} | "
          f"{ratio} |")
    out.append(r)
json.dump(out, open(os.path.join(R, "table.json"), "w"), indent=1)
