#!/usr/bin/env bash
# Device run MOE_2GPU (2 GPUs): issue 27. `zerotrain train --ep 2` (docs/moe.md) against
# DeepSpeed-MoE 0.19.8 (bench/anchors/ds_moe_anchor.py; wheels in .whl/) on the same MoE GPT-2:
#   GPT-2-medium shape (24 layers, 1024, 16 heads, vocab 50257), seq 1024, micro-batch MB per
#   GPU, every other block's MLP an MoE of 8 GPT-2 MLPs, top-2, min capacity 4, aux coef 0.01,
#   no noisy gate / random token selection / sampled second expert; ep 2 over the 2 GPUs (E + D:
#   dp 2, expert-dp 1); bf16 with fp32 master weights, AdamW lr 1e-4, clip 1.0, ZeRO stage S with
#   bench/configs/gpt2_bf16_z{1,2,3}.json's buckets and overlap_comm (DeepSpeed the same at 1
#   and 2; it refuses MoE at stage 3, so stage 3 is a zerotrain row only); random tokens. Per
#   stage, two modes:
#   drop      capacity factor 1.0, tokens beyond capacity dropped (--moe-capacity-factor 1.0 /
#             --capacity-factor 1.0 --drop-tokens)
#   dropless  capacity = the most assignments to any expert, agreed over ep
# Each row: ms/iter (zerotrain: mean wall time of the timed steps; DeepSpeed: median of its
# synchronized steps), tokens/s (both ranks' tokens), peak GiB (max over ranks), the MoE
# all-to-alls' time per step (forward + backward, CUDA events: zerotrain --moe-timing, the
# anchor's wrapped _AllToAll), dropped fraction (rank 0, mean over timed steps), aux loss, last
# loss, and zerotrain's tokens/s over DeepSpeed's at the same stage and mode.
# Knobs: STAGES ("2": one call of about 8-10 min; "1 3" the other stages in a second call),
# MODES ("drop dropless"), STEPS (10 timed), WARMUP (3), MB (4),
# GPUS (2; 1: issue 20's one-GPU row, ep 1), DS_MODES (the modes DeepSpeed runs; default MODES),
# SKIP_ZT, SKIP_DS, ZT_TIMEOUT (300 s per run), DS_TIMEOUT (420 s per run; the first DeepSpeed
# run JIT-builds FusedAdam). Files: $OUT/moe_2gpu_s<STAGES>.tar.gz (summaries, metrics, logs,
# table.md, table.json; re-packed after every run); the table is printed last.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target ${SITE:-/tmp/site} .whl/*.whl \
  && export PYTHONPATH=${SITE:-/tmp/site} || exit 1
STAGES=${STAGES:-2}; GPUS=${GPUS:-2}; TAG=moe_${GPUS}gpu_s${STAGES// /}
source scripts/device/common.sh $TAG ${SKIP_ZT:+--no-build} zerotrain_cli
# The files live outside $OUT and are re-packed into $OUT/$TAG.tar.gz after every run, so a
# call that runs out of time still returns what finished (the device returns a few files only).
W=/tmp/$TAG; rm -rf $W; mv $R $W; R=$W
pack() { python3 scripts/device/moe_table.py $R > $R/table.md 2>&1; tar -czf $OUT/$TAG.tar.gz -C /tmp $TAG; }
STEPS=${STEPS:-10}; WARMUP=${WARMUP:-3}; MB=${MB:-4}
python3 -c "import deepspeed as d; print('deepspeed', d.__version__)" 2>&1 | tail -1
SHAPE_ZT="--model gpt2-medium --seq 1024 --moe-experts 8 --moe-k 2 --moe-every 2"
SHAPE_DS="--layers 24 --embd 1024 --heads 16 --vocab 50257 --seq 1024 --experts 8 --k 2 --moe-every 2"

run_zt() {  # NAME STAGE MODE: zerotrain train --ep 2, one --summary JSON line, --metrics per step
  local name=$1 stage=$2 mode=$3 cap=""
  [ $mode = drop ] && cap="--moe-capacity-factor 1.0"
  timeout ${ZT_TIMEOUT:-300} $Z launch -n $GPUS -- $Z train --config bench/configs/gpt2_bf16_z$stage.json --device cuda \
    --set train_micro_batch_size_per_gpu=$MB $SHAPE_ZT $cap --ep $GPUS --moe-timing --data random \
    --steps $((STEPS + WARMUP)) --warmup $WARMUP --print-every 5 \
    --summary $R/$name.json --metrics $R/$name.metrics.jsonl > $R/$name.log 2>&1
  echo "$name rc=$?"; grep -aiE "error|what\(\)|out of memory" $R/$name.log | head -3
}
run_ds() {  # NAME STAGE MODE: the DeepSpeed-MoE anchor on 2 processes, one JSON file
  local name=$1 stage=$2 mode=$3 cap=""
  [ $mode = drop ] && cap="--capacity-factor 1.0 --drop-tokens"
  timeout ${DS_TIMEOUT:-420} torchrun --nproc_per_node $GPUS bench/anchors/ds_moe_anchor.py $SHAPE_DS --micro $MB --ep $GPUS \
    --stage $stage $cap --steps $STEPS --warmup $WARMUP --out $R/$name.json > $R/$name.log 2>&1
  echo "$name rc=$?"; [ -s $R/$name.json ] && grep -q '"status": "ok"' $R/$name.json \
    || grep -aE "Error|error|memory" $R/$name.log | grep -v Warning | tail -4
}
for s in $STAGES; do
  for m in ${MODES:-drop dropless}; do
    [ -n "${SKIP_ZT:-}" ] || { run_zt zt_z${s}_$m $s $m; pack; }
    [ -n "${SKIP_DS:-}" ] || [ $s = 3 ] || [[ " ${DS_MODES:-${MODES:-drop dropless}} " != *" $m "* ]] || { run_ds ds_z${s}_$m $s $m; pack; }
  done
done
pack; cat $R/table.md; rm -rf $R
echo "total: $(( $(date +%s) - T0 )) s"
