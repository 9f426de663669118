#!/usr/bin/env bash
# Device run TP_MOE_4GPU (4 GPUs, one call): two 2-GPU jobs side by side on one 4-GPU host.
# GPUs 0-1: tp_2gpu.sh (issue 26: tp 2 against Megatron-core, SP off and on, with the activation
# memory column); GPUs 2-3: moe_2gpu.sh (issue 27: ep 2 against DeepSpeed-MoE at STAGES).
# zerotrain is built once first; each job has its own Python site folder and torchrun port.
# The jobs share the host (CPU cores, PCIe), each ratio is taken under the same load on both
# sides; peak memory per GPU is not affected. Results: $OUT/tp_2gpu.tar.gz,
# $OUT/moe_2gpu_s<STAGES>.tar.gz; each job's printout in $OUT/job_*.txt, tails printed last.
# Knobs: STAGES ("1 3"), MODES ("drop dropless"), MOE_STEPS (6), TP_STEPS (10), SP ("0 1").
set -uo pipefail
source scripts/device/common.sh tp_moe_build zerotrain_cli || exit 1
rm -rf $OUT/tp_moe_build
( export CUDA_VISIBLE_DEVICES=0,1 SITE=/tmp/site_tp PET_MASTER_PORT=29510 STEPS=${TP_STEPS:-10} SP="${SP:-0 1}"
  bash scripts/device/tp_2gpu.sh > $OUT/job_tp.txt 2>&1 ) &
sleep 10
( export CUDA_VISIBLE_DEVICES=2,3 SITE=/tmp/site_moe PET_MASTER_PORT=29610 STEPS=${MOE_STEPS:-6} \
    STAGES="${STAGES:-1 3}" MODES="${MODES:-drop dropless}"
  bash scripts/device/moe_2gpu.sh > $OUT/job_moe.txt 2>&1 ) &
wait
for j in tp moe; do echo "== $j"; tail -14 $OUT/job_$j.txt; done
echo "total: $(( $(date +%s) - T0 )) s"
