#!/usr/bin/env bash
# Device run LLAMA_1GPU (one GPU): Llama-3.2-1B shape (random weights), bf16, micro-batch 4,
# seq 2048, ZeRO-0: `zerotrain train` against transformers' LlamaForCausalLM + autocast bf16
# + fused AdamW (bench/anchors/llama_anchor.py) in the same call. Prints a table; results
# in $OUT/llama/.
set -uo pipefail
source scripts/device/common.sh llama zerotrain_cli
S=${STEPS:-12}
timeout 240 $Z train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b --seq 2048 --micro-batch 4 \
  --steps $((S + 3)) --warmup 3 --device cuda --summary $R/zerotrain.json > $R/zerotrain.log 2>&1; echo "zerotrain rc=$?"
timeout 240 python3 bench/anchors/llama_anchor.py --steps $S --warmup 3 > $R/anchor.json 2> $R/anchor.log; echo "anchor rc=$?"
tail -3 $R/anchor.log
python3 - "$R" <<'PY'
import json, sys
R = sys.argv[1]
z = json.loads(open(f"{R}/zerotrain.json").read().splitlines()[-1])
a = json.loads(open(f"{R}/anchor.json").read().splitlines()[-1])
print("| Llama-3.2-1B shape, bf16, mb 4, seq 2048, 1 GPU | ms/iter | tokens/s | peak GiB |")
print("|---|---|---|---|")
print(f"| zerotrain ZeRO-0 | {z['ms_per_iter']:.1f} | {z['tokens_per_s']:.0f} | {z.get('peak_gib', float('nan')):.2f} |")
print(f"| {a['anchor']} | {a['ms_per_iter']:.1f} | {a['tokens_per_s']:.0f} | {a['peak_gib']:.2f} |")
print(f"speed-up {a['ms_per_iter'] / z['ms_per_iter']:.2f}x; zerotrain MFU {z.get('mfu', 0):.3f}")
PY
echo "total: $(( $(date +%s) - T0 )) s"
