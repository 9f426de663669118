#!/usr/bin/env bash
# Device run PROFILE: one step of GPT-2 Large (bf16, micro-batch 8, seq 1024) under the
# Kineto profiler: 1 GPU (ZeRO-0) and 2 GPUs (ZeRO-3). Writes the kernel summaries and
# Chrome traces to $OUT/profile_results.tar.gz; prints the summaries.
set -uo pipefail
source scripts/device/common.sh profile zerotrain_cli
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps 6 --warmup 3 --profile 4"
timeout 200 $Z launch -n 1 -- $Z train --config bench/configs/gpt2_bf16_z0.json $A --profile-out $R/z0_1gpu > $R/log_z0_1gpu.txt 2>&1
grep -A45 "^\[rank 0\] \[profile\]" $R/log_z0_1gpu.txt | cut -c1-190
timeout 200 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z3.json $A --profile-out $R/z3_2gpu > $R/log_z3_2gpu.txt 2>&1
grep -A20 "^\[rank 0\] \[profile\]" $R/log_z3_2gpu.txt | cut -c1-190
gzip -f $R/*.json 2>/dev/null
tar -czf $OUT/profile_results.tar.gz -C $OUT profile
echo "total: $(( $(date +%s) - T0 )) s"
