#!/usr/bin/env bash
# Device run CALL18_4GPU (4 GPUs of one host, one call, ~8 min from cold): issue 17's Llama-3.2-1B
# kernel changes (the RoPE kernel's 2-D grid, warp-per-row RMSNorm, the residual add and gradient
# accumulations inside the norms: [Residual Norm]) against the baseline .base/base.tar.gz, after
# building both at once (this tree: zerotrain_cli, zt_gpu; the baseline: zerotrain_cli). Side by side:
#   GPUs 0-1  the whole zt_gpu at 2 ranks; then GPU 0: base / new crossover (new base base new),
#             GPU 1: one profiled step of this tree (--profile 4), then base, new
#   GPU 2     scripts/device/llama1b_rows.sh (this tree twice, the torch.compile'd transformers
#             anchor, DeepSpeed ZeRO-1; DS_STAGES default "1"; SITE /tmp/site_c)
#   GPU 3     base / new crossover: base new new base base new
# Every A/B row: bench/configs/llama_bf16_z0.json, mb 4, seq 2048, 18 steps after 3 (--summary).
# DEADLINE (default 540 s from the start): nothing starts that could end after it. Carry .head,
# .base and .whl. Results: $OUT/call18.tar.gz and $OUT/llama1b_rows.tar.gz; tables last.
set -uo pipefail
DEADLINE=${DEADLINE:-540}
source scripts/device/l1b_ab.sh
base_build_start || exit 1
source scripts/device/common.sh call18 zerotrain_cli zt_gpu || exit 1
wait
echo "all built: $(( $(date +%s) - T0 )) s"
row() { l1b_row "$@"; }  # gpu, label (base | new), tag
( export CUDA_VISIBLE_DEVICES=2 SITE=/tmp/site_c
  DEADLINE=$(( $(left) - 5 )) DS_STAGES=${DS_STAGES:-1} bash scripts/device/llama1b_rows.sh > $R/rows.out 2>&1 ) &
( i=0; for v in base new new base base new; do i=$((i + 1)); row 3 $v g3r$i; done ) &
( CUDA_VISIBLE_DEVICES=0,1 timeout 150 $Z launch -n 2 -- $B/zt_gpu > $R/zt_gpu.txt 2>&1; echo "zt_gpu rc=$?" > $R/zt_gpu.rc
  ( i=0; for v in new base base new; do i=$((i + 1)); row 0 $v g0r$i; done ) &
  ( if [ $(left) -gt 60 ]; then
      CUDA_VISIBLE_DEVICES=1 timeout 50 $Z train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b --seq 2048 \
        --micro-batch 4 --steps 6 --warmup 3 --device cuda --print-every 1 --profile 4 --profile-out $R/prof \
        > $R/prof.log 2>&1
      gzip -f $R/prof*.json 2>/dev/null
    fi
    row 1 base g1r1; row 1 new g1r2 ) &
  wait ) &
wait
echo "== zt_gpu"; cat $R/zt_gpu.rc; grep -E "^\[rank .\] \[  (PASSED|FAILED|SKIPPED) " $R/zt_gpu.txt | head -4
grep -E "FAILED  \]" $R/zt_gpu.txt | sort -u | head
echo "== profile"; grep -aiE "error|what\(\)" $R/prof.log | head -3; head -40 $R/prof*.txt 2>/dev/null | cut -c1-140
echo "== 1B rows: anchors"; tail -12 $R/rows.out
echo "== 1B A/B"
python3 scripts/device/l1b_ab_table.py $R
tar -czf $OUT/call18.tar.gz -C $OUT call18
echo "total: $(( $(date +%s) - T0 )) s"
