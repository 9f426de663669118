#!/usr/bin/env bash
# Device run GPU_TESTS (2 GPUs): build and run zt_gpu (NCCL collectives, zerotrain's CUDA
# kernels against ATen/fp64 references, the asynchronous engine step and the delayed update
# on the device). Results: $OUT/gpu_tests/gpu_tests.txt.
set -uo pipefail
source scripts/device/common.sh gpu_tests zt_gpu zerotrain_cli
timeout 150 $Z launch -n 2 -- $B/zt_gpu > $R/gpu_tests.txt 2>&1; echo "zt_gpu rc=$?"
grep -E "^\[rank .\] \[  (PASSED|FAILED|SKIPPED) " $R/gpu_tests.txt | head; grep -E "FAILED  \]" $R/gpu_tests.txt | sort -u | head
echo "total: $(( $(date +%s) - T0 )) s"
