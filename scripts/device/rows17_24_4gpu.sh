#!/usr/bin/env bash
# Device run ROWS17_24_4GPU (4 GPUs of one host, one call, ~8-9 min from cold): issues 17 and
# 24's rows side by side, one build of zerotrain_cli first, then three jobs at once:
#   GPUs 0-1  issue 24 run 2: llama8b_2gpu.sh PHASE=1 -- the Llama-3-8B shape at ZeRO-3 on two
#             GPUs, `zerotrain train` next to torch FSDP2 and DeepSpeed 0.19.8 ZeRO-3 (STEPS8,
#             default 6 timed; ZT8_TIMEOUT / FSDP_TIMEOUT / DS_TIMEOUT)
#   GPU 2     issue 17: llama1b_rows.sh -- the Llama-3.2-1B shape next to the compiled
#             transformers model and DeepSpeed (DEADLINE1B s from its start, default 430)
#   GPU 3     issue 17: one Kineto-profiled step of the same 1B run (`train --profile 4`), the
#             summary printed (where the step's time goes after the fused ops)
# Carry .whl (DeepSpeed wheels). Site folders are per job (/tmp/site8b, /tmp/site1b). Results:
# $OUT/llama8b_p1.tar.gz, $OUT/llama1b_rows.tar.gz, $OUT/profile1b.tar.gz; the tables last.
set -uo pipefail
source scripts/device/common.sh rows17_24 zerotrain_cli || exit 1
echo "$(cat $R/device.txt | head -1) x $(wc -l < $R/device.txt)"
( export CUDA_VISIBLE_DEVICES=0,1 SITE=/tmp/site8b
  PHASE=1 STEPS=${STEPS8:-6} ZT_TIMEOUT=${ZT8_TIMEOUT:-130} ANCHOR_TIMEOUT=${FSDP_TIMEOUT:-130} \
    SKIP_DS=1 bash scripts/device/llama8b_2gpu.sh > $R/llama8b_fsdp.txt 2>&1
  PHASE=1 STEPS=${STEPS8:-6} ANCHOR_TIMEOUT=${DS_TIMEOUT:-200} SKIP_ZT=1 SKIP_FSDP=1 \
    bash scripts/device/llama8b_2gpu.sh > $R/llama8b_ds.txt 2>&1
  tar -czf $OUT/llama8b_p1.tar.gz -C $OUT llama8b_p1 && rm -rf $OUT/llama8b_p1 ) &
( export CUDA_VISIBLE_DEVICES=2 SITE=/tmp/site1b
  DEADLINE=${DEADLINE1B:-430} bash scripts/device/llama1b_rows.sh > $R/llama1b_rows.txt 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=3; P=$OUT/profile1b; mkdir -p $P
  timeout 200 $Z train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b --seq 2048 --micro-batch 4 \
    --steps 6 --warmup 3 --device cuda --print-every 1 --profile 4 --profile-out $P/llama1b > $P/llama1b.log 2>&1
  echo "profile rc=$?" >> $P/llama1b.log; gzip -f $P/*.json 2>/dev/null
  tar -czf $OUT/profile1b.tar.gz -C $OUT profile1b && cp $P/llama1b*.txt $R/ 2>/dev/null; rm -rf $P ) &
wait
echo "== profile (GPU 3)"; cat $R/llama1b*.txt 2>/dev/null | head -60 | cut -c1-150
echo "== llama8b ZeRO-3 (GPUs 0-1)"; cat $R/llama8b_fsdp.txt $R/llama8b_ds.txt | grep -v "^build"
echo "== llama1b rows (GPU 2)"; cat $R/llama1b_rows.txt
echo "total: $(( $(date +%s) - T0 )) s"
