#!/usr/bin/env bash
# Device run FINAL_AB_4GPU (4 GPUs, one call): the end-of-session checks. speed_ab_1gpu.sh (the
# baseline tree .base/base.tar.gz against this one, GPT-2 Large one GPU; knobs ONLY, ROUNDS,
# STEPS as there, zt_gpu built with it), then gpu_tests.sh (zt_gpu at 2 ranks), then
# tp_pp_ckpt_4gpu.sh. Results: $OUT/speed_ab.tar.gz, $OUT/gpu_tests.tar.gz, $OUT/tp_pp_ckpt.tar.gz.
set -uo pipefail
EXTRA_TARGETS=zt_gpu bash scripts/device/speed_ab_1gpu.sh
bash scripts/device/gpu_tests.sh; tar -czf $OUT/gpu_tests.tar.gz -C $OUT gpu_tests && rm -rf $OUT/gpu_tests
bash scripts/device/tp_pp_ckpt_4gpu.sh
