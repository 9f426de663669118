#!/usr/bin/env bash
# Device run ROPE_PROBE (one GPU, ~1 min from cold, no zerotrain build): compiles
# scripts/device/rope_probe.cu with nvcc (sm_90; it includes src/kernels/llama_ops.cu, so the
# kernel timed is the one the build has) and prints the time and bandwidth of
# zerotrain's RoPE kernel at Llama-3.2-1B's q shape in variants (as is; grid uncapped; 32-bit
# index math; without the cos/sin loads) next to a plain copy of the same bytes (issue 17:
# the kernel measured ~0.6 TB/s inside the 1B step). Output: $OUT/rope_probe.txt.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee $OUT/rope_probe.txt
nvcc -O3 -std=c++17 -arch=sm_90 -I src -o /tmp/rope_probe scripts/device/rope_probe.cu 2>&1 | tail -5 || exit 1
timeout 60 /tmp/rope_probe | tee -a $OUT/rope_probe.txt
