#!/usr/bin/env bash
# Device run OFFLOAD_ROWS (2 GPUs): all GPU tests (zt_gpu, engine async included), then the
# offload rows of GPT-2 Large (bf16, micro-batch 8, seq 1024): z3-offall (optimizer and
# parameters on the CPU), z2 offload, z2 offload + delayed update, and z2 without offload
# for the ratio. Results: $OUT/verify.tar.gz.
set -uo pipefail
source scripts/device/common.sh verify zerotrain_cli zt_gpu
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps ${STEPS:-12} --warmup 3"
timeout 150 $Z launch -n 2 -- $B/zt_gpu > $R/gpu_tests.txt 2>&1; echo "zt_gpu rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) " $R/gpu_tests.txt | sort | uniq -c | head; grep -E "^\[  FAILED  \]" $R/gpu_tests.txt | sort -u | head
for c in ${CONFIGS:-z3_offload_param z2_offload z2_offload_dpu z2}; do
  timeout 150 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_$c.json $A --summary $R/$c.jsonl > $R/log_$c.txt 2>&1
  echo "$c rc=$?"; grep -m3 -i "error\|illegal" $R/log_$c.txt
done
tar -czf $OUT/verify.tar.gz -C $OUT verify
python3 scripts/device/summarize.py $R
echo "total: $(( $(date +%s) - T0 )) s"
