#!/usr/bin/env bash
# Device run FP16_ZERO012 (2 GPUs): fp16 with dynamic loss scaling for ZeRO 0/1/2 on GPT-2 Large, and
# bf16 ZeRO-2 with per-step metrics (overlap counters). Everything bundled in $OUT/fp16_zero012.tar.
set -uo pipefail
source scripts/device/common.sh fp16_zero012 zerotrain_cli
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps 10 --warmup 3 --print-every 1"
for s in 0 1 2; do
  timeout 150 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_fp16_z$s.json $A --metrics $R/metrics_fp16_z$s.jsonl --summary $R/zt_fp16.jsonl > $R/log_fp16_z$s.txt 2>&1
  grep -E "Step|ms/iteration|rror" $R/log_fp16_z$s.txt | tail -4
done
timeout 150 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z2.json $A --metrics $R/metrics_bf16_z2.jsonl --summary $R/zt_bf16.jsonl > $R/log_bf16_z2.txt 2>&1
tail -2 $R/metrics_bf16_z2.jsonl | cut -c1-600
tar -cf $OUT/fp16_zero012.tar -C $R .
