#!/usr/bin/env bash
# Device run CAPACITY_CPU_OFFLOAD (nvidia-h200-x2): the GPU tests (zt_gpu on 2 GPUs), the disk and host
# the capacity runs have, then zerotrain's CPU-offload capacity probes on ONE GPU above 12.09B
# (scripts/device/capacity_1gpu.sh, pageable host memory, 1 warm-up + 1 timed step).
# Usage: LAYERS_OFF="72 76" T=200 bash scripts/device/capacity_cpu_offload.sh
set -uo pipefail
source scripts/device/common.sh cap_final --no-build
START=$T0
bash scripts/device/gpu_tests.sh
{ df -h / /tmp "$OUT" 2>&1; free -g; nproc; } | tee $OUT/gpu_tests/disk_host.txt
LAYERS_NO="" LAYERS_OFF="${LAYERS_OFF:-72 76}" T=${T:-200} STEPS=2 BUDGET=$(( 570 - $(date +%s) + START )) bash scripts/device/capacity_1gpu.sh
