#!/usr/bin/env bash
# Device run FINAL_AB_4GPU (4 GPUs, one call): the end-of-session checks. speed_ab_1gpu.sh (the
# baseline tree .base/base.tar.gz against this one, GPT-2 Large one GPU; knobs ONLY, ROUNDS,
# STEPS as there, zt_gpu built with it), then gpu_tests.sh (zt_gpu at 2 ranks), then
# (MOE1=1) moe_2gpu.sh with GPUS=1 (issue 20's one-GPU MoE row against DeepSpeed-MoE), then
# tp_pp_ckpt_4gpu.sh (SKIP_CKPT=1: not), then (QLORA_CPU_CKPT=1) the Llama-3-8B QLoRA one-GPU row with
# activation_checkpointing.cpu_checkpointing, zerotrain alone (its anchor's peak is stable: 9.31 GiB
# in three calls). Results: $OUT/speed_ab.tar.gz, $OUT/gpu_tests.tar.gz, $OUT/tp_pp_ckpt.tar.gz.
set -uo pipefail
EXTRA_TARGETS=zt_gpu bash scripts/device/speed_ab_1gpu.sh
bash scripts/device/gpu_tests.sh; tar -czf $OUT/gpu_tests.tar.gz -C $OUT gpu_tests && rm -rf $OUT/gpu_tests
if [ -n "${MOE1:-}" ]; then  # issue 20's one-GPU row: ep 1, zerotrain both modes, DeepSpeed-MoE at DS_MODES
  CUDA_VISIBLE_DEVICES=0 GPUS=1 STAGES=2 MODES="drop dropless" DS_MODES="${DS_MODES:-drop}" STEPS=${MOE_STEPS:-5} \
       ZT_TIMEOUT=100 DS_TIMEOUT=${DS_TIMEOUT:-150} bash scripts/device/moe_2gpu.sh
fi
[ -n "${SKIP_CKPT:-}" ] || bash scripts/device/tp_pp_ckpt_4gpu.sh
if [ -n "${QLORA_CPU_CKPT:-}" ]; then
  PHASE=4 SKIP_ANCHORS=1 STEPS=3 ZT_TIMEOUT=${QLORA_TIMEOUT:-90} ZT_TAG=_cpu_ckpt \
    ZT_EXTRA="--set activation_checkpointing.cpu_checkpointing=true" bash scripts/device/llama8b_2gpu.sh
  tar -czf $OUT/llama8b_p4_cpu_ckpt.tar.gz -C $OUT llama8b_p4
fi
