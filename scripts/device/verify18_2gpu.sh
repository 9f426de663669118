#!/usr/bin/env bash
# Device run VERIFY18_2GPU (2 GPUs of one host, ~5 min from cold): the final tree's GPU check after
# a refactor of kernel launchers: builds this tree (zerotrain_cli, zt_gpu) and the baseline
# .base/base.tar.gz (zerotrain_cli) at once, runs the whole zt_gpu at 2 ranks, then a Llama-3.2-1B
# base/new crossover on both GPUs (base new new base; bf16, ZeRO-0, mb 4, seq 2048, 18 steps after 3).
# DEADLINE (default 300 s from the start) bounds it. Carry .head and .base. Results: $OUT/verify18.tar.gz.
set -uo pipefail
DEADLINE=${DEADLINE:-300}
source scripts/device/l1b_ab.sh
base_build_start || exit 1
source scripts/device/common.sh verify18 zerotrain_cli zt_gpu || exit 1
wait
echo "all built: $(( $(date +%s) - T0 )) s"
row() { l1b_row "$@" 35; }  # gpu, label (base | new), tag
CUDA_VISIBLE_DEVICES=0,1 timeout 150 $Z launch -n 2 -- $B/zt_gpu > $R/zt_gpu.txt 2>&1; echo "zt_gpu rc=$?" > $R/zt_gpu.rc
for g in 0 1; do ( i=0; for v in base new new base; do i=$((i + 1)); row $g $v g${g}r$i; done ) & done
wait
echo "== zt_gpu"; cat $R/zt_gpu.rc; grep -E "^\[rank .\] \[  (PASSED|FAILED|SKIPPED) " $R/zt_gpu.txt | head -4
grep -E "FAILED  \]" $R/zt_gpu.txt | sort -u | head
echo "== 1B A/B"; python3 scripts/device/l1b_ab_table.py $R
tar -czf $OUT/verify18.tar.gz -C $OUT verify18
echo "total: $(( $(date +%s) - T0 )) s"
