#!/usr/bin/env bash
# Device run PROFILE_LLAMA (3 GPUs of one host, one call): one step of each Llama row under the
# Kineto profiler (`zerotrain train --profile`), three jobs side by side, one GPU each:
#   GPU 0  Llama-3-8B shape, QLoRA r 16 on the seven projections, seq 2048, mb 1, checkpointing
#   GPU 1  the same with bf16 LoRA
#   GPU 2  Llama-3.2-1B shape, full training, bf16, ZeRO-0, mb 4, seq 2048
# (issues 21 and 17: where the step's time goes). Each: 3 warm-up steps, profiles step 4.
# Prints each summary (stream busy time, time by kind, top kernels); Chrome traces and
# summaries in $OUT/profile_llama.tar.gz.
set -uo pipefail
source scripts/device/common.sh profile_llama zerotrain_cli || exit 1
LORA="r=16,alpha=32,targets=q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj"
B8="--config bench/configs/llama_bf16_z0.json --model llama3-8b --seq 2048 --micro-batch 1 --checkpoint-activations
  --steps 6 --warmup 3 --device cuda --print-every 1 --profile 4"
( CUDA_VISIBLE_DEVICES=0 timeout 300 $Z train $B8 --lora $LORA --qlora --profile-out $R/qlora8b > $R/qlora8b.log 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 timeout 300 $Z train $B8 --lora $LORA --profile-out $R/lora8b > $R/lora8b.log 2>&1 ) &
( CUDA_VISIBLE_DEVICES=2 timeout 300 $Z train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b --seq 2048 \
    --micro-batch 4 --steps 6 --warmup 3 --device cuda --print-every 1 --profile 4 --profile-out $R/llama1b > $R/llama1b.log 2>&1 ) &
wait
gzip -f $R/*.json 2>/dev/null
tar -czf $OUT/profile_llama.tar.gz -C $OUT profile_llama
for n in qlora8b lora8b llama1b; do
  echo "== $n"; grep -aiE "error|what\(\)|out of memory" $R/$n.log | head -3
  cat $R/$n*.txt 2>/dev/null | head -42 | cut -c1-120
done
echo "total: $(( $(date +%s) - T0 )) s"
