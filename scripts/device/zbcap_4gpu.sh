#!/usr/bin/env bash
# Device run ZBCAP_4GPU (4 GPUs of one host, one call, ~7-8 min from cold): issue 25's last goal,
# "ZB-H1's bubble at most half of 1F1B's at no more peak memory", on the Llama-3.2-1B shape (pp 2,
# bf16, mb 4 x 2048, 8 micro-batches), after one build, two partitions side by side:
#   GPUs 0-1  partition parameters   GPUs 2-3  partition compute
# each: 1f1b, zb-h1 (the paper's) and zb-h1 with pipeline.zb_max_pending_w 0 ([ZB-H1 Pending
# Cap]), with B's graph released ([B Graph Release], the default); then zb-h1 and zb-h1 k 0 again
# with ZT_PIPE_ZB_RELEASE_GRAPH=0 (the graph retained, as before) for the A/B. Every row's peak
# GiB per stage includes zb-h1's input-gradient pass ([Input Backward Peak]; the engine phases
# alone in parentheses, what earlier calls reported) and its bubble next to the simulator on each
# stage's measured times (scripts/device/pipe_llama_2gpu.sh, no DeepSpeed). DEADLINE (default
# 570 s from the start) bounds everything. Results: $OUT/zb_{parameters,compute}{,_retained}.tar.gz;
# the four tables last.
#   bash scripts/device/zbcap_4gpu.sh      (no carry needed)
set -uo pipefail
DEADLINE=${DEADLINE:-570}
source scripts/device/common.sh zbcap bench_pipe_bubble zerotrain_cli || exit 1
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
side() {  # $1 = GPUs, $2 = partition
  local L=$(left)
  CUDA_VISIBLE_DEVICES=$1 SKIP_DS=1 NAME=zb_$2 PARTITION=$2 SCHEDULES="1f1b zb-h1" ZB_MAX_PENDING=0 \
    DEADLINE=$(( L - 100 )) HARD_DEADLINE=$(( L - 90 )) bash scripts/device/pipe_llama_2gpu.sh
  L=$(left)
  CUDA_VISIBLE_DEVICES=$1 SKIP_DS=1 NAME=zb_${2}_retained PARTITION=$2 SCHEDULES="zb-h1" ZB_MAX_PENDING=0 \
    ZT_PIPE_ZB_RELEASE_GRAPH=0 DEADLINE=$(( L - 10 )) HARD_DEADLINE=$(( L - 5 )) bash scripts/device/pipe_llama_2gpu.sh
}
( side 0,1 parameters > $R/parameters.out 2>&1 ) &
( side 2,3 compute > $R/compute.out 2>&1 ) &
wait
for p in parameters compute; do echo "== partition $p"; grep -aE "^\||^bench|^llama|skipped|rc=" $R/$p.out; done
echo "total: $(( $(date +%s) - T0 )) s"
