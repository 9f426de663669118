#!/usr/bin/env bash
# Device run TP_LLAMA_PA (4 GPUs, one call): issue 26's Llama-3.2-3B rows and partition_activations.
# GPUs 0-1: tp_2gpu.sh with MODELS=llama (zerotrain `train --tp 2` against megatron-core on the
# Llama-3.2-3B shape, seq 2048, micro-batch 2, bf16, without and with sequence parallelism).
# GPUs 2-3, at the same time: zerotrain alone, the same shape at tp 2 with activation
# checkpointing, `activation_checkpointing.partition_activations` false then true (no SP):
# activation memory per GPU = memory after forward minus memory after the step (the summary's
# phase_mem_gib; gradient accumulation 1, so that is what forward left for backward), and the
# time it costs. The two jobs share the host, each job's two sides run under the same load.
# Results: $OUT/tp_2gpu.tar.gz, $OUT/tp_pa.tar.gz; tables printed last.
# Knobs: STEPS (8), WARMUP (3), LLAMA_MB (2).
set -uo pipefail
source scripts/device/common.sh tp_pa zerotrain_cli || exit 1
STEPS=${STEPS:-8}; WARMUP=${WARMUP:-3}; MB=${LLAMA_MB:-2}
( CUDA_VISIBLE_DEVICES=0,1 MODELS=llama SP="0 1" STEPS=$STEPS WARMUP=$WARMUP LLAMA_MB=$MB ZT_TIMEOUT=200 MG_TIMEOUT=200 \
  bash scripts/device/tp_2gpu.sh > $OUT/job_tp.txt 2>&1 ) &  # tp_2gpu.sh packs $OUT/tp_2gpu.tar.gz itself
for pa in false true; do
  CUDA_VISIBLE_DEVICES=2,3 timeout 200 $Z launch -n 2 -- $Z train --config bench/configs/llama_bf16_z0.json --device cuda \
    --tp 2 --model bench/configs/models/llama3.2-3b.json --seq 2048 --set train_micro_batch_size_per_gpu=$MB \
    --checkpoint-activations --set activation_checkpointing.partition_activations=$pa \
    --steps $STEPS --warmup $WARMUP --print-every 5 --data random --summary $R/pa_$pa.json > $R/pa_$pa.log 2>&1
  echo "partition_activations=$pa rc=$?"; grep -iE "error|what\(\)|partition" $R/pa_$pa.log | head -3
done
python3 - $R <<'PY' | tee $R/table.md
import json, sys
R = sys.argv[1]
print("| partition_activations | ms/iter | activation GiB per GPU (after fwd - after step) | peak GiB | loss last |")
print("|---|---|---|---|---|")
rows = {}
for pa in ("false", "true"):
    try:
        z = json.loads(open(f"{R}/pa_{pa}.json").read().strip().splitlines()[-1])
    except Exception as e:
        print(f"| {pa} | failed ({e}) | | | |"); continue
    m = z["phase_mem_gib"]; act = m["forward"]["after"] - m["step"]["after"]; rows[pa] = (z["ms_per_iter"], act)
    print(f"| {pa} | {z['ms_per_iter']:.1f} | {act:.3f} | {z['peak_gib']:.2f} | {z['loss_last']:.4f} |")
if len(rows) == 2:
    print(f"ratio on/off: activation {rows['true'][1] / rows['false'][1]:.3f}, time {rows['true'][0] / rows['false'][0]:.3f}")
PY
tar -czf $OUT/tp_pa.tar.gz -C $OUT tp_pa
wait
tail -12 $OUT/job_tp.txt
echo "total: $(( $(date +%s) - T0 )) s"
