#!/usr/bin/env bash
# Device run LLAMA8B_2GPU (2 GPUs): issue 24, runs 2 and 3. The Llama-3-8B shape (random
# weights), bf16, micro-batch 1 x seq 2048 per GPU, activation checkpointing, 2 GPUs:
#   PHASE=1  full training at ZeRO-3: `zerotrain train` against torch FSDP2 and DeepSpeed
#            ZeRO-3 (bench/anchors/llama_dist_anchor.py, wheels in .whl/)
#   PHASE=2  LoRA r 16 on every decoder linear, the frozen base partitioned by ZeRO-3:
#            `zerotrain train --lora` against peft + DeepSpeed ZeRO-3
#   PHASE=3  the same with QLoRA (NF4 base): `zerotrain train --lora --qlora` against peft +
#            bitsandbytes + DeepSpeed ZeRO-3 (carry .whl-bnb: the bitsandbytes wheel)
#   PHASE=4  issue 21 on ONE GPU: QLoRA at ZeRO stage 0, `zerotrain train --lora --qlora`
#            against transformers + peft + bitsandbytes, torch AdamW (anchor --mode single;
#            carry .whl-bnb)
#   PHASE=5  issue 21 on one GPU: bf16 LoRA, `zerotrain train --lora` against transformers +
#            peft on a bf16 base, torch AdamW (--mode single)
# Knobs: PHASE (default 1), STEPS (timed, default 8), LAYERS (0: the shape's 32), SKIP_ZT,
# SKIP_ANCHORS, SKIP_FSDP, SKIP_DS (phase 1); phase 4: ZT_EXTRA (more train flags), ZT_TAG (suffix of its run name). Prints the table last; files under $OUT/llama8b_p$PHASE/.
set -uo pipefail
PHASE=${PHASE:-1}; S=${STEPS:-8}; W=3; L=${LAYERS:-0}
N=2; STAGE=3; [ "$PHASE" -ge 4 ] && { N=1; STAGE=0; }  # phases 4-5: one GPU, no partitioning
[ -n "${SKIP_ANCHORS:-}" ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target ${SITE:-/tmp/site} .whl/*.whl \
  $(ls .whl-bnb/*.whl 2>/dev/null) && export PYTHONPATH=${SITE:-/tmp/site} || exit 1; }
source scripts/device/common.sh llama8b_p$PHASE ${SKIP_ZT:+--no-build} zerotrain_cli
LAYER_FLAG=""; [ "$L" != 0 ] && LAYER_FLAG="--layers $L"
LORA="r=16,alpha=32,targets=q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj"
ZFLAGS="--config bench/configs/llama_bf16_z0.json --set zero_optimization.stage=$STAGE --set zero_optimization.overlap_comm=true
  --model llama3-8b $LAYER_FLAG --seq 2048 --micro-batch 1 --checkpoint-activations --steps $((S + W)) --warmup $W
  --device cuda --print-every 1"
AFLAGS="--model llama3-8b --layers $L --seq 2048 --micro-batch 1 --checkpoint-activations --steps $S --warmup $W"
zt() {  # name, extra flags
  timeout ${ZT_TIMEOUT:-300} $Z launch -n $N -- $Z train $ZFLAGS $2 --summary $R/$1.json > $R/$1.log 2>&1
  echo "$1 rc=$?"; grep -iE "error|what\(\)|out of memory" $R/$1.log | head -4
}
anchor() {  # name, flags
  timeout ${ANCHOR_TIMEOUT:-300} torchrun --standalone --nproc_per_node $N bench/anchors/llama_dist_anchor.py $AFLAGS $2 \
    > $R/$1.json 2> $R/$1.log
  echo "$1 rc=$?"; [ -s $R/$1.json ] || grep -E "Error|error|memory" $R/$1.log | grep -v Warning | tail -4
}
case $PHASE in
  1) [ -n "${SKIP_ZT:-}" ] || zt zerotrain_z3 ""
     [ -n "${SKIP_ANCHORS:-}${SKIP_FSDP:-}" ] || anchor fsdp2 "--mode fsdp2"
     [ -n "${SKIP_ANCHORS:-}${SKIP_DS:-}" ] || anchor deepspeed_z3 "--mode deepspeed" ;;
  2) [ -n "${SKIP_ZT:-}" ] || zt zerotrain_lora "--lora $LORA --lora-out $R/adapter"
     [ -n "${SKIP_ANCHORS:-}" ] || anchor peft_deepspeed_z3 "--mode deepspeed --lora 16" ;;
  3) [ -n "${SKIP_ZT:-}" ] || zt zerotrain_qlora "--lora $LORA --qlora --lora-out $R/adapter"
     [ -n "${SKIP_ANCHORS:-}" ] || anchor peft_bnb_deepspeed_z3 "--mode deepspeed --lora 16 --qlora" ;;
  4) [ -n "${SKIP_ZT:-}" ] || zt zerotrain_qlora_1gpu${ZT_TAG:-} "--lora $LORA --qlora --lora-out $R/adapter ${ZT_EXTRA:-}"
     [ -n "${SKIP_ANCHORS:-}" ] || anchor peft_bnb_1gpu "--mode single --lora 16 --qlora" ;;
  5) [ -n "${SKIP_ZT:-}" ] || zt zerotrain_lora_1gpu "--lora $LORA --lora-out $R/adapter"
     [ -n "${SKIP_ANCHORS:-}" ] || anchor peft_bf16_1gpu "--mode single --lora 16" ;;
esac
rm -rf $R/adapter
python3 scripts/device/llama8b_table.py $R
echo "total: $(( $(date +%s) - T0 )) s"
