#!/usr/bin/env bash
# Device run CALL25_4GPU (4 GPUs of one host, one call, ~7 min from cold): issue 25 with the
# "compute" partition ([Compute Partition], src/pipe/partition.h) against DeepSpeed's
# PipelineEngine at both of its balancing methods, two models side by side after one build:
#   GPUs 0-1  Llama-3.2-1B, pp 2, bf16, mb 4 x 2048, 8 micro-batches: zerotrain 1f1b, zb-h1,
#             interleaved with partition compute; DeepSpeed with parameters and uniform
#   GPUs 2-3  GPT-2 XL, pp 2, bf16, mb 4 x 1024, 8 micro-batches: zerotrain 1f1b, zb-h1 with
#             partition compute; DeepSpeed with parameters and uniform
# (scripts/device/pipe_llama_2gpu.sh twice, NAME pipe_llama / pipe_xl). DEADLINE (default 540 s
# from the start) bounds both. Carry .head and .whl. Results: $OUT/pipe_llama.tar.gz,
# $OUT/pipe_xl.tar.gz; the two tables last.
set -uo pipefail
DEADLINE=${DEADLINE:-540}
source scripts/device/common.sh call25 bench_pipe_bubble zerotrain_cli || exit 1
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
L=$(left)
( CUDA_VISIBLE_DEVICES=0,1 SITE=/tmp/site_a NAME=pipe_llama PARTITION=compute SCHEDULES="1f1b zb-h1 interleaved" \
  DS_PARTITIONS="parameters uniform" DS_RESERVE=100 DEADLINE=$(( L - 15 )) HARD_DEADLINE=$(( L - 5 )) \
  bash scripts/device/pipe_llama_2gpu.sh > $R/llama.out 2>&1 ) &
( CUDA_VISIBLE_DEVICES=2,3 SITE=/tmp/site_b NAME=pipe_xl MODEL=gpt2-xl SEQ=1024 PARTITION=compute SCHEDULES="1f1b zb-h1" \
  DS_PARTITIONS="parameters uniform" DS_RESERVE=100 DEADLINE=$(( L - 15 )) HARD_DEADLINE=$(( L - 5 )) \
  bash scripts/device/pipe_llama_2gpu.sh > $R/xl.out 2>&1 ) &
wait
echo "== Llama-3.2-1B"; tail -9 $R/llama.out
echo "== GPT-2 XL"; tail -8 $R/xl.out
echo "total: $(( $(date +%s) - T0 )) s"
