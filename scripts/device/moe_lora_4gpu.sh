#!/usr/bin/env bash
# Device run MOE_LORA_4GPU (4 GPUs, one call): three independent re-measurements side by side
# on one 4-GPU host, to fit a session's device time: GPUs 0-1 run moe_2gpu.sh (issue 27: ep 2
# against DeepSpeed-MoE, STAGES/MODES/STEPS as that script), GPU 2 llama8b_2gpu.sh PHASE=4
# (issue 21: Llama-3-8B QLoRA on one GPU against peft + bitsandbytes), GPU 3 PHASE=5 (bf16 LoRA
# against peft). Each job has its own GPUs, its own Python site folder (SITE) and output
# folder; zerotrain is built once first. The jobs share the host (64 cores, PCIe), so their
# speed ratios are taken under the same load on both sides of each job but not alone on the
# host; peak memory per GPU is not affected. Results: $OUT/moe_2gpu_s<STAGES>.tar.gz,
# $OUT/llama8b_p4.tar.gz, $OUT/llama8b_p5.tar.gz; logs of each job in $OUT/job_*.txt.
# Knobs: STAGES (2), MODES ("dropless drop"), MOE_STEPS (6), LORA_STEPS (3), ZT_TIMEOUT and
# ANCHOR_TIMEOUT of the LoRA phases (150 s each).
set -uo pipefail
source scripts/device/common.sh moe_lora_build zerotrain_cli || exit 1
rm -rf $OUT/moe_lora_build
( CUDA_VISIBLE_DEVICES=0,1 SITE=/tmp/site_moe STEPS=${MOE_STEPS:-6} STAGES=${STAGES:-2} \
  MODES="${MODES:-dropless drop}" bash scripts/device/moe_2gpu.sh > $OUT/job_moe.txt 2>&1 ) &
for p in 4 5; do
  sleep 15
  ( export CUDA_VISIBLE_DEVICES=$(( p - 2 )) SITE=/tmp/site_p$p PHASE=$p STEPS=${LORA_STEPS:-3} \
      ZT_TIMEOUT=${ZT_TIMEOUT:-150} ANCHOR_TIMEOUT=${ANCHOR_TIMEOUT:-150}
    bash scripts/device/llama8b_2gpu.sh > $OUT/job_p$p.txt 2>&1
    tar -czf $OUT/llama8b_p$p.tar.gz -C $OUT llama8b_p$p && rm -rf $OUT/llama8b_p$p ) &
done
wait
for j in p4 p5 moe; do echo "== $j"; tail -12 $OUT/job_$j.txt; done
echo "total: $(( $(date +%s) - T0 )) s"
