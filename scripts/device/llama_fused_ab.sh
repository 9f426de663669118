#!/usr/bin/env bash
# Device run LLAMA_FUSED_AB (one GPU): [Llama Fused Ops] (models/llama_fused.h) checked and
# timed. First `zt_gpu --gtest_filter='LlamaKernels*'` (fused vs ATen on CUDA), then, ROUNDS
# times (default 1), alternately with ZT_LLAMA_FUSED=0 (ATen) and =1 (fused), fresh processes:
#   1b     Llama-3.2-1B shape, full training, bf16, ZeRO-0, mb 4, seq 2048
#   lora8b Llama-3-8B shape, bf16 LoRA r 16 on the seven projections, mb 1, seq 2048, checkpointing
# (issues 17 and 21). Prints a table of ms/iter (median of the rounds) and the speed-up.
# STEPS timed steps per run (default 6, after 3 warm-up). About 4-5 minutes after a cold
# build of zerotrain_cli + zt_gpu (3-4 minutes); ROUNDS=2 on a warm machine (build kept).
# Results: $OUT/llama_fused_ab/.
set -uo pipefail
source scripts/device/common.sh llama_fused_ab zerotrain_cli zt_gpu
timeout 150 $B/zt_gpu --gtest_filter='LlamaKernels*' > $R/zt_gpu.log 2>&1; echo "zt_gpu rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|off; first|Which is" $R/zt_gpu.log | head -20
LORA="r=16,alpha=32,targets=q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj"
S=${STEPS:-6}
for r in $(seq 1 ${ROUNDS:-1}); do
  for v in 0 1; do
    ZT_LLAMA_FUSED=$v timeout 150 $Z train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b --seq 2048 \
      --micro-batch 4 --steps $((S + 3)) --warmup 3 --device cuda --summary $R/1b-f$v-r$r.json > $R/1b-f$v-r$r.log 2>&1
    echo "1b fused=$v r$r rc=$?"; grep -aiE "error|what\(\)|out of memory" $R/1b-f$v-r$r.log | head -2
    ZT_LLAMA_FUSED=$v timeout 200 $Z train --config bench/configs/llama_bf16_z0.json --model llama3-8b --seq 2048 \
      --micro-batch 1 --checkpoint-activations --steps $((S + 3)) --warmup 3 --device cuda --lora $LORA \
      --summary $R/lora8b-f$v-r$r.json > $R/lora8b-f$v-r$r.log 2>&1
    echo "lora8b fused=$v r$r rc=$?"; grep -aiE "error|what\(\)|out of memory" $R/lora8b-f$v-r$r.log | head -2
  done
done
python3 - "$R" <<'PY'
import glob, json, statistics, sys
R = sys.argv[1]
def runs(name, v):
    out = []
    for f in sorted(glob.glob(f"{R}/{name}-f{v}-r*.json")):
        try:
            out.append(json.loads(open(f).read().splitlines()[-1]))
        except Exception:
            pass
    return out
print("| row | ATen ms/iter | fused ms/iter | speed-up | ATen loss | fused loss | peak GiB ATen / fused |")
print("|---|---|---|---|---|---|---|")
for name in ("1b", "lora8b"):
    a, f = runs(name, 0), runs(name, 1)
    if not a or not f:
        print(f"| {name} | missing ({len(a)} ATen, {len(f)} fused runs) |"); continue
    ma = statistics.median(x["ms_per_iter"] for x in a); mf = statistics.median(x["ms_per_iter"] for x in f)
    la, lf = a[-1].get("loss_last", "?"), f[-1].get("loss_last", "?")
    pa, pf = a[-1].get("peak_gib", float("nan")), f[-1].get("peak_gib", float("nan"))
    print(f"| {name} | {ma:.1f} | {mf:.1f} | {ma / mf:.3f}x | {la} | {lf} | {pa:.2f} / {pf:.2f} |")
PY
echo "total: $(( $(date +%s) - T0 )) s"
