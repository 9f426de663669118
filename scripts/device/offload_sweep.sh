#!/usr/bin/env bash
# Device run OFFLOAD_SWEEP (2 GPUs): the GPU tests, the offload rows of the sweep with their
# PyTorch counterparts in the same call (GPT-2 Large, bf16, micro-batch 8, seq 1024:
# z2-bf16 vs FSDP2, z2-offopt / z2-offdpu / z3-offopt / z3-offall vs FSDP2 + CPUOffloadPolicy),
# then ZeRO-Infinity with optimizer AND parameters on the disk next to CPU offload
# (scripts/device/part_nvme_vs_cpu_offload.sh). Results: $OUT/offload_final.tar.gz.
set -uo pipefail
source scripts/device/common.sh offload_final zerotrain_cli zt_gpu
timeout 150 $Z launch -n 2 -- $B/zt_gpu > $R/gpu_tests.txt 2>&1; echo "zt_gpu rc=$?"
grep -E "^\[rank 0\] \[  (PASSED|FAILED) " $R/gpu_tests.txt | head -5
$Z bench --model gpt2-large --gpus 2 --steps ${STEPS:-15} --warmup 3 --with-anchors --timeout 200 \
  --only ${ONLY:-z2-bf16,z2-offopt,z2-offdpu,z3-offopt,z3-offall} --out $R/gpt2-large > $R/bench.log 2>&1
grep "^\[bench\]" $R/bench.log | cut -c1-150
source scripts/device/part_nvme_vs_cpu_offload.sh
tar -czf $OUT/offload_final.tar.gz -C $OUT offload_final
echo "total: $(( $(date +%s) - T0 )) s"
