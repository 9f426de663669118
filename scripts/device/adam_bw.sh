#!/usr/bin/env bash
# Device run ADAM_BW (one GPU, ~1 min from cold, no zerotrain build): compiles
# scripts/device/adam_bw.cu (standalone, nvcc sm_90, no repo headers) and prints how fast
# zerotrain's fused AdamW kernel (a verbatim copy of src/kernels/fused_adam.cu's, variant A)
# moves its 28 B/element at the Llama-3.2-1B shape (1.236e9 elements, 25 launches per step,
# bf16 grad and param_out, fp32 master/m/v) next to variants (cache hints, groups per trip,
# grid, kVec 8, launch bounds, prefetch), each checked bitwise against A, and a streaming
# roofline of the same bytes (G: kernel, G2: cudaMemcpy). Knobs: ADAM_BW_ARGS (extra flags:
# --n N --segments S --reps R --warmup W --rounds K --scale X --no-check); DEADLINE (s) is
# accepted and unused (the run takes well under a minute). Output: $OUT/adam_bw.txt (table),
# $OUT/adam_bw.json, $OUT/adam_bw_ptxas.txt (registers and spills per kernel).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; export OUT
nvidia-smi --query-gpu=name,clocks.max.memory,memory.total --format=csv,noheader | head -1 | tee "$OUT/adam_bw.txt"
nvcc -O3 -std=c++17 -arch=sm_90 -diag-suppress 177 -Xptxas -v -o "$OUT/adam_bw" scripts/device/adam_bw.cu \
  >"$OUT/adam_bw_ptxas.txt" 2>&1 || { tail -20 "$OUT/adam_bw_ptxas.txt"; exit 1; }
# shellcheck disable=SC2086
timeout 300 "$OUT/adam_bw" --json "$OUT/adam_bw.json" ${ADAM_BW_ARGS:-} 2>&1 | tee -a "$OUT/adam_bw.txt"
rc=${PIPESTATUS[0]}
rm -f "$OUT/adam_bw"  # the binary need not come back
exit "$rc"
