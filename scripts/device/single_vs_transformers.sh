#!/usr/bin/env bash
# Device run SINGLE_VS_TRANSFORMERS (1 GPU): zerotrain train vs transformers GPT2LMHeadModel (autocast bf16,
# fused AdamW) in the same call. GPT-2 Large, bf16, micro-batch 8, seq 1024.
set -uo pipefail
source scripts/device/common.sh single zerotrain_cli
export CUDA_VISIBLE_DEVICES=0
timeout 120 $Z train --config bench/configs/gpt2_bf16_z0.json --model gpt2-large --seq 1024 --micro-batch 8 --steps 22 --warmup 2 \
  --summary $R/zerotrain.jsonl > $R/log_zerotrain.txt 2>&1; grep -E "ms/iteration|MFU" $R/log_zerotrain.txt | tail -2
timeout 150 python3 bench/anchors/train_anchor.py --mode hf --model gpt2-large --micro-batch 8 --seq 1024 --steps 20 --warmup 2 --dtype bf16 \
  --json $R/hf.jsonl > $R/log_hf.txt 2>&1; tail -1 $R/hf.jsonl | cut -c1-400
tar -czf $OUT/single.tar.gz -C $OUT single
echo "total: $(( $(date +%s) - T0 )) s"
