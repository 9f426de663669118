#!/usr/bin/env bash
# Device run LMHEAD_SWEEP: the padded LM head. GPT2 unit tests on the device, one profiled step of
# GPT-2 Large on 1 GPU, then the stage 0-3 sweep with the PyTorch anchors in the same call.
set -uo pipefail
source scripts/device/common.sh mfu zerotrain_cli zt_unit
$B/zt_unit --gtest_filter='GPT2*' > $R/unit_gpt2.txt 2>&1; tail -3 $R/unit_gpt2.txt
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps 6 --warmup 3 --profile 4"
timeout 200 $Z launch -n 1 -- $Z train --config bench/configs/gpt2_bf16_z0.json $A --profile-out $R/z0_1gpu > $R/log_z0_1gpu.txt 2>&1
grep -A16 "^\[rank 0\] \[profile\]" $R/log_z0_1gpu.txt | cut -c1-160
$Z bench --model gpt2-large --gpus 2 --steps 20 --warmup 2 --with-anchors --python python3 --timeout 150 \
  --commit ${COMMIT:-unknown} --only ${ONLY:-z0-bf16,z1-bf16,z2-bf16,z3-bf16} --out $R/sweep > $R/bench.log 2>&1
gzip -f $R/*.json 2>/dev/null
tar -czf $OUT/mfu_results.tar.gz -C $OUT mfu
grep "^\[bench\]" $R/bench.log | cut -c1-150
echo "total: $(( $(date +%s) - T0 )) s"
