#!/usr/bin/env bash
# Device run STAGES_QUICK: the GPU tests (zt_gpu: NCCL collectives, the fused Adam kernel) and
# GPT-2 Large (bf16, micro-batch 8, seq 1024) with zerotrain only: 1 GPU ZeRO-0, then
# 2 GPUs ZeRO-0/1/2 (and 3 with ZT_Z3=1). For A/B checks between full sweeps; the
# PyTorch anchors are in the last sweep. Results: $OUT/quick.tar.gz.
set -uo pipefail
source scripts/device/common.sh quick zerotrain_cli zt_gpu
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps ${STEPS:-22} --warmup 2"
timeout 120 $Z launch -n 2 -- $B/zt_gpu > $R/gpu_tests.txt 2>&1; echo "zt_gpu rc=$?"; grep -E "PASSED|FAILED|SKIPPED" $R/gpu_tests.txt | sort | uniq -c | head
CUDA_VISIBLE_DEVICES=0 timeout 120 $Z train --config bench/configs/gpt2_bf16_z0.json $A --summary $R/z0_1gpu.jsonl > $R/log_z0_1gpu.txt 2>&1
for st in 0 1 2 ${ZT_Z3:+3}; do
  timeout 150 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z$st.json $A --summary $R/z${st}_2gpu.jsonl > $R/log_z${st}_2gpu.txt 2>&1
done
tar -czf $OUT/quick.tar.gz -C $OUT quick
python3 scripts/device/summarize.py $R
echo "total: $(( $(date +%s) - T0 )) s"
