#!/usr/bin/env bash
# Device run CAP_FINAL (nvidia-h200-x2): the GPU tests (zt_gpu on 2 GPUs), the disk and host
# the capacity runs have, then zerotrain's CPU-offload capacity probes on ONE GPU above 12.09B
# (scripts/device/gpu_cap.sh, pageable host memory, 1 warm-up + 1 timed step).
# Usage: LAYERS_OFF="72 76" T=200 bash scripts/device/cap_final.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; START=$(date +%s)
bash scripts/device/gpu_tests.sh
{ df -h / /tmp "$OUT" 2>&1; free -g; nproc; } | tee $OUT/gpu_tests/disk_host.txt
LAYERS_NO="" LAYERS_OFF="${LAYERS_OFF:-72 76}" T=${T:-200} STEPS=2 BUDGET=$(( 570 - $(date +%s) + START )) bash scripts/device/gpu_cap.sh
