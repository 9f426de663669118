#!/usr/bin/env python3
"""The table of scripts/device/llama1b_rows.sh (issue 17's acceptance row): one row per run in
the folder -- zerotrain's --summary files (zt_*.json), llama_anchor.py's and
llama_dist_anchor.py's JSON lines (the other *.json) -- with ms/iter, tokens/s, MFU, peak GiB,
and zerotrain's speed-up (the anchor's ms over zerotrain's median ms) and peak ratio.

MFU is the same for every row: tokens/s x F / (989e12), F = 6(N_layers + V d) + 12 L d T, the
model FLOPs per token of zerotrain's llama_flops_per_token (N_layers: the parameters without
the embedding table; tied head; no recompute), computed here from the shape. The check line
compares F with the FLOPs per token that zerotrain's own mfu implies, and the anchors'.
Also writes table.md and table.json there. Usage: llama1b_table.py DIR [--seq 2048]."""
import json
import os
import statistics
import sys

PEAK = 989e12  # H100 SXM dense bf16, FLOP/s
# Llama-3.2-1B: layers, hidden, GQA 32/8 x head 64, FFN, vocab (tied embeddings)
L, D, Q, KV, F_FF, V = 16, 2048, 32 * 64, 8 * 64, 8192, 128256


def flops_per_token(seq):
    n_layers = L * (D * Q + 2 * D * KV + Q * D + 3 * D * F_FF + 2 * D) + D  # + the final norm
    return 6.0 * (n_layers + V * D) + 12.0 * L * Q * seq


def main():
    R = sys.argv[1]
    seq = int(sys.argv[sys.argv.index("--seq") + 1]) if "--seq" in sys.argv else 2048
    fpt = flops_per_token(seq)
    rows, checks = [], []
    for f in sorted(os.listdir(R)):
        if not f.endswith(".json") or f == "table.json":
            continue
        try:
            j = json.loads(open(os.path.join(R, f)).read().strip().splitlines()[-1])
        except (ValueError, IndexError, OSError):
            continue
        if j.get("framework") == "zerotrain":
            what = f"zerotrain ZeRO-{j.get('stage', 0)} bf16"
            if j.get("mfu") and j.get("tokens_per_s"):
                checks.append(f"{f}: {j['mfu'] * j.get('peak_tflops', 989.0) * 1e12 / j['tokens_per_s']:.4g}")
        elif "anchor" in j:
            what = j["anchor"]
            if j.get("flops_per_token"):
                checks.append(f"{f}: {j['flops_per_token']:.4g}")
        else:
            continue
        rows.append({"run": f[:-5], "what": what, "zerotrain": what.startswith("zerotrain"),
                     "ms": j["ms_per_iter"], "tps": j["tokens_per_s"], "mfu": j["tokens_per_s"] * fpt / PEAK,
                     "peak": j.get("peak_gib", float("nan")), "loss": j.get("loss_last", j.get("loss")),
                     "compile_s": j.get("compile_s"), "optimizer": (j.get("notes") or {}).get("optimizer")})
    rows.sort(key=lambda r: (not r["zerotrain"], r["what"].startswith("DeepSpeed"), r["run"]))
    zt = [r for r in rows if r["zerotrain"]]
    zt_ms = statistics.median(r["ms"] for r in zt) if zt else None
    zt_peak = max(r["peak"] for r in zt) if zt else None
    out = [f"Llama-3.2-1B shape, bf16, micro-batch 4, seq {seq}, 1 GPU; MFU = tokens/s x {fpt:.4g} FLOPs/token "
           f"(6(N_layers + V d) + 12 L d T) / 989 TFLOP/s for every row",
           "", "| run | what | ms/iter | tokens/s | MFU | peak GiB | zerotrain speed-up (its ms / zerotrain's) "
           "| peak / zerotrain's |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        what = r["what"] + (f" ({r['optimizer']})" if r["optimizer"] else "")
        ratio = f"{r['ms'] / zt_ms:.3f}x" if zt_ms and not r["zerotrain"] else "-"
        pr = f"{r['peak'] / zt_peak:.2f}" if zt_peak and not r["zerotrain"] else "-"
        out.append(f"| {r['run']} | {what} | {r['ms']:.1f} | {r['tps']:.0f} | {100 * r['mfu']:.1f}% | "
                   f"{r['peak']:.2f} | {ratio} | {pr} |")
    if zt_ms:
        out.append("")
        runs = ", ".join(f"{r['ms']:.1f}" for r in zt)
        zt_tps = statistics.median(r["tps"] for r in zt)
        out.append(f"zerotrain: median {zt_ms:.1f} ms over {len(zt)} runs ({runs}), {zt_tps:.0f} tokens/s, "
                   f"MFU {100 * zt_tps * fpt / PEAK:.1f}% (goal >= 50%)")
        comp = [r for r in rows if "torch.compile" in r["what"]]
        if comp:
            out.append(f"against the compiled transformers model: {comp[0]['ms'] / zt_ms:.3f}x (goal >= 1.25x); "
                       f"its compile (first step) {comp[0]['compile_s'] or float('nan'):.0f} s")
        ds = [r for r in rows if r["what"].startswith("DeepSpeed")]
        if ds:
            best = min(ds, key=lambda r: r["ms"])
            out.append(f"against DeepSpeed's fastest row ({best['run']}): {best['ms'] / zt_ms:.3f}x")
    out.append(f"FLOPs/token check (formula {fpt:.4g}): " + ("; ".join(checks) or "no run reported one"))
    text = "\n".join(out)
    print(text)
    open(os.path.join(R, "table.md"), "w").write(text + "\n")
    json.dump({"flops_per_token": fpt, "zerotrain_ms": zt_ms, "rows": rows}, open(os.path.join(R, "table.json"), "w"),
              indent=1)


if __name__ == "__main__":
    main()
