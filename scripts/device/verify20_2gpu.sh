#!/usr/bin/env bash
# Device run VERIFY20 (2 GPUs, one call, ~8 min from cold): the head's GPU check after
# [Stale Gradients] and [Streaming Grids], and issue 17's full row. Builds zt_gpu and zerotrain
# once, then:
#   zt_gpu         at 2 ranks (NCCL; the pipeline and point-to-point tests that one rank skips)
#   llama1b_rows   scripts/device/llama1b_rows.sh on GPU 0: zerotrain twice around the compiled
#                  transformers anchor, then DeepSpeed ZeRO-1 (DS_STAGES=1); carry .whl
# DEADLINE (default 570 s) bounds the whole call. Results: $OUT/verify20/zt_gpu.txt and
# $OUT/llama1b_rows.tar.gz.
set -uo pipefail
source scripts/device/common.sh verify20 zt_gpu zerotrain_cli || exit 1
DEADLINE=${DEADLINE:-570}
timeout 170 $Z launch -n 2 -- $B/zt_gpu > $R/zt_gpu.txt 2>&1; echo "zt_gpu rc=$? ($(( $(date +%s) - T0 )) s)"
grep -E "^\[rank .\] \[  (PASSED|FAILED|SKIPPED) " $R/zt_gpu.txt | head -4; grep -E "FAILED  \]" $R/zt_gpu.txt | sort -u | head
CUDA_VISIBLE_DEVICES=0 DS_STAGES=${DS_STAGES:-1} DEADLINE=$(( DEADLINE - ($(date +%s) - T0) - 5 )) \
  bash scripts/device/llama1b_rows.sh
echo "total: $(( $(date +%s) - T0 )) s"
