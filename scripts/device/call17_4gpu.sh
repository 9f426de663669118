#!/usr/bin/env bash
# Device run CALL17_4GPU (4 GPUs of one host, one call, ~9 min from cold): one build of this
# tree (zerotrain_cli, zt_gpu, bench_pipe_bubble), then two tracks side by side:
#   GPUs 0-1  issue 25: scripts/device/pipe_zbw_2gpu.sh (GPT-2 XL pp 2: 1f1b, zb-h1 with the
#             deferred weight pass, zb-h1 with ZT_PIPE_ZB_DEFERRED_W=0, DeepSpeed's
#             PipelineEngine; SITE /tmp/site_a), then, if time is left, one profiled step of the
#             Llama-3.2-1B row on GPU 0 (issue 17: where the step's time goes)
#   GPUs 2-3  the whole zt_gpu at 2 ranks, then issue 24's LoRA pair at ZeRO-3:
#             PHASES=2 scripts/device/llama8b_call.sh (zerotrain --lora vs transformers + peft +
#             DeepSpeed ZeRO-3 on the Llama-3-8B shape; SITE /tmp/site_b)
# DEADLINE (default 560 s from the start, build included): nothing starts that could end after
# it. Carry .whl (DeepSpeed and its dependencies). Results: $OUT/*.tar.gz of each part and
# $OUT/call17/ (zt_gpu.txt, the profile).
set -uo pipefail
source scripts/device/common.sh call17 zerotrain_cli zt_gpu bench_pipe_bubble || exit 1
DEADLINE=${DEADLINE:-560}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
( export CUDA_VISIBLE_DEVICES=0,1 SITE=/tmp/site_a
  bash scripts/device/pipe_zbw_2gpu.sh > $R/pipe.out 2>&1
  if [ $(left) -gt 75 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout $(( $(left) - 10 )) $Z train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b \
      --seq 2048 --micro-batch 4 --steps 6 --warmup 3 --device cuda --print-every 1 --profile 4 --profile-out $R/llama1b \
      > $R/llama1b_profile.log 2>&1
    gzip -f $R/llama1b*.json 2>/dev/null
  else echo "1B profile skipped: $(left) s left" > $R/llama1b_profile.log; fi ) &
( export CUDA_VISIBLE_DEVICES=2,3 SITE=/tmp/site_b
  timeout 150 $Z launch -n 2 -- $B/zt_gpu > $R/zt_gpu.txt 2>&1; echo "zt_gpu rc=$?" > $R/zt_gpu.rc
  if [ $(left) -gt 240 ]; then PHASES=2 ZT_TIMEOUT=$(( $(left) / 2 )) ANCHOR_TIMEOUT=$(( $(left) / 2 )) \
    bash scripts/device/llama8b_call.sh > $R/llama8b.out 2>&1
  else echo "llama8b phase 2 skipped: $(left) s left" > $R/llama8b.out; fi ) &
wait
echo "== zt_gpu"; cat $R/zt_gpu.rc; grep -E "^\[rank .\] \[  (PASSED|FAILED|SKIPPED) " $R/zt_gpu.txt | head -4
grep -E "FAILED  \]" $R/zt_gpu.txt | sort -u | head
echo "== 1B profile"; grep -aiE "error|what\(\)|skipped" $R/llama1b_profile.log | head -3; head -45 $R/llama1b*.txt 2>/dev/null | cut -c1-150
echo "== llama8b LoRA pair"; tail -12 $R/llama8b.out
echo "== pipe"; tail -14 $R/pipe.out
tar -czf $OUT/call17.tar.gz -C $OUT call17
echo "total: $(( $(date +%s) - T0 )) s"
