#!/usr/bin/env bash
# Device run CALL17C_4GPU (4 GPUs of one host, one call, ~9 min from cold): one build of this tree
# (zerotrain_cli, zt_gpu, bench_pipe_bubble), then side by side:
#   GPUs 0-1  issue 25 on the Llama-3.2-1B shape: scripts/device/pipe_llama_2gpu.sh (zerotrain's
#             1f1b, zb-h1, interleaved, gpipe at pp 2 and DeepSpeed's PipelineEngine; SITE /tmp/site_a)
#   GPUs 2-3  the whole zt_gpu at 2 ranks, then on GPU 2 issue 17's acceptance row
#             scripts/device/llama1b_rows.sh (this tree, the torch.compile'd transformers anchor,
#             DeepSpeed ZeRO-1; DS_STAGES default "1"; SITE /tmp/site_c)
# DEADLINE (default 570 s from the start) bounds both tracks. Carry .head and .whl. Results:
# $OUT/call17c.tar.gz, $OUT/pipe_llama_2gpu.tar.gz, $OUT/llama1b_rows.tar.gz; tables last.
set -uo pipefail
DEADLINE=${DEADLINE:-570}
source scripts/device/common.sh call17c zerotrain_cli zt_gpu bench_pipe_bubble || exit 1
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
( export CUDA_VISIBLE_DEVICES=0,1 SITE=/tmp/site_a
  DEADLINE=$(( $(left) - 20 )) HARD_DEADLINE=$(( $(left) - 10 )) bash scripts/device/pipe_llama_2gpu.sh > $R/pipe.out 2>&1 ) &
( CUDA_VISIBLE_DEVICES=2,3 timeout 150 $Z launch -n 2 -- $B/zt_gpu > $R/zt_gpu.txt 2>&1; echo "zt_gpu rc=$?" > $R/zt_gpu.rc
  export CUDA_VISIBLE_DEVICES=2 SITE=/tmp/site_c
  DEADLINE=$(( $(left) - 5 )) DS_STAGES=${DS_STAGES:-1} bash scripts/device/llama1b_rows.sh > $R/rows.out 2>&1 ) &
wait
echo "== zt_gpu"; cat $R/zt_gpu.rc; grep -E "^\[rank .\] \[  (PASSED|FAILED|SKIPPED) " $R/zt_gpu.txt | head -4
grep -E "FAILED  \]" $R/zt_gpu.txt | sort -u | head
echo "== 1B rows"; tail -9 $R/rows.out
echo "== pipe llama"; tail -16 $R/pipe.out
tar -czf $OUT/call17c.tar.gz -C $OUT call17c
echo "total: $(( $(date +%s) - T0 )) s"
