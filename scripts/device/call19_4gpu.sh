#!/usr/bin/env bash
# Device run CALL19_4GPU (4 GPUs of one host, one call, ~8 min from cold): issues 17 and 25 in one
# call, after building this tree (zerotrain_cli, zt_gpu, bench_pipe_bubble) and the baseline
# .base/base.tar.gz (zerotrain_cli) at once. Side by side:
#   GPUs 0-1  issue 25: scripts/device/pipe_llama_2gpu.sh on the Llama-3.2-1B shape (pp 2, bf16,
#             mb 4 x 2048, 8 micro-batches, no DeepSpeed): 1f1b, zb-h1 and zb-h1 with
#             pipeline.zb_max_pending_w 0, partition parameters, then partition compute
#   GPUs 2-3  the whole zt_gpu at 2 ranks; then
#             GPU 2  issue 17's acceptance row scripts/device/llama1b_rows.sh (this tree twice, the
#                    torch.compile'd transformers anchor, DeepSpeed ZeRO-1; SITE /tmp/site_c)
#             GPU 3  baseline / this tree crossover (base new new base base new; Llama-3.2-1B,
#                    bench/configs/llama_bf16_z0.json, mb 4, seq 2048, 18 steps after 3), then one
#                    profiled step of this tree
# DEADLINE (default 540 s from the start) bounds everything. Carry .head, .base and .whl.
# Results: $OUT/call19.tar.gz, $OUT/llama1b_rows.tar.gz, $OUT/zb_{parameters,compute}.tar.gz.
set -uo pipefail
DEADLINE=${DEADLINE:-540}
source scripts/device/l1b_ab.sh
base_build_start || exit 1
source scripts/device/common.sh call19 zerotrain_cli zt_gpu bench_pipe_bubble || exit 1
wait
echo "all built: $(( $(date +%s) - T0 )) s"
row() { l1b_row "$@"; }  # gpu, label (base | new), tag
( for p in parameters compute; do
    L=$(left)
    CUDA_VISIBLE_DEVICES=0,1 SKIP_DS=1 NAME=zb_$p PARTITION=$p SCHEDULES="1f1b zb-h1" ZB_MAX_PENDING=0 \
      DEADLINE=$(( L - 10 )) HARD_DEADLINE=$(( L - 5 )) bash scripts/device/pipe_llama_2gpu.sh > $R/pipe_$p.out 2>&1
  done ) &
( CUDA_VISIBLE_DEVICES=2,3 timeout 150 $Z launch -n 2 -- $B/zt_gpu > $R/zt_gpu.txt 2>&1; echo "zt_gpu rc=$?" > $R/zt_gpu.rc
  ( export CUDA_VISIBLE_DEVICES=2 SITE=/tmp/site_c
    DEADLINE=$(( $(left) - 5 )) DS_STAGES=${DS_STAGES:-1} bash scripts/device/llama1b_rows.sh > $R/rows.out 2>&1 ) &
  ( i=0; for v in base new new base base new; do i=$((i + 1)); row 3 $v g3r$i; done
    if [ $(left) -gt 50 ]; then
      CUDA_VISIBLE_DEVICES=3 timeout 45 $Z train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b --seq 2048 \
        --micro-batch 4 --steps 6 --warmup 3 --device cuda --print-every 1 --profile 4 --profile-out $R/prof \
        > $R/prof.log 2>&1
      gzip -f $R/prof*.json 2>/dev/null
    fi ) &
  wait ) &
wait
echo "== zt_gpu"; cat $R/zt_gpu.rc; grep -E "^\[rank .\] \[  (PASSED|FAILED|SKIPPED) " $R/zt_gpu.txt | head -4
grep -E "FAILED  \]" $R/zt_gpu.txt | sort -u | head
echo "== profile"; grep -aiE "error|what\(\)" $R/prof.log | head -3; head -12 $R/prof*.txt 2>/dev/null | cut -c1-140
echo "== 1B rows: anchors"; tail -12 $R/rows.out
echo "== 1B A/B"
python3 scripts/device/l1b_ab_table.py $R
for p in parameters compute; do echo "== pipe, partition $p"; grep -aE "^\||^bench|skipped|rc=" $R/pipe_$p.out | tail -12; done
tar -czf $OUT/call19.tar.gz -C $OUT call19
echo "total: $(( $(date +%s) - T0 )) s"
