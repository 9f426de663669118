#!/usr/bin/env bash
# Device run MOE_MIXTRAL_2GPU (2 GPUs): issue 27's Mixtral row. `zerotrain train --model
# bench/configs/models/mixtral-2gpu.json --ep 2` (docs/moe.md, [Mixtral]) against DeepSpeed-MoE
# 0.19.8 (bench/anchors/ds_moe_anchor.py --arch mixtral --hf-config the same file; wheels in .whl/).
#   shape     MixtralForCausalLM: 12 layers, hidden 2048, 16 heads / 8 kv heads (head_dim 128),
#             RMSNorm, RoPE theta 1e6, 8 SwiGLU experts (w1/w3 2048->5632, w2 5632->2048) per layer,
#             top-2, router_aux_loss_coef 0.02 (output_router_logits), vocab 32000, untied head:
#             3.60 B parameters (0.28 B dense, 3.32 B experts); seq SEQ (1024), micro-batch MB (2)
#             per GPU, random tokens. 12 layers, not 16 (4.76 B), for the time: zerotrain builds
#             the whole model on the host on every rank before keeping its experts (the GPT-2 MoE's
#             1.06 B took 20-27 s there), so 16 layers would be ~110 s per zerotrain run.
#   layout    ep 2 over the 2 GPUs (E + D: dp 2 for the dense part, expert-dp 1), bf16 with fp32
#             master weights, AdamW lr 1e-4, clip 1.0. zerotrain: --config
#             bench/configs/gpt2_bf16_z2.json / gpt2_bf16_z3.json (the generic bf16 AdamW configs;
#             there is no llama_bf16_z2/z3) with train_micro_batch_size_per_gpu=MB; the anchor's
#             ds_config() has gpt2_bf16_z2.json's buckets (reduce 5e7, allgather 2e8, overlap_comm).
#             DeepSpeed refuses MoE at stage 3: ZeRO-3 is a zerotrain row only.
#   bytes     per GPU: 1.94 B parameters (0.28 B dense + 4 experts x 12 layers x 34.6 M = 1.66 B):
#   per GPU   bf16 params 3.9 GB + fp32 master 7.2 GB + AdamW m, v 14.4 GB (the dense part's
#             master and moments halved over dp 2; the experts' whole at expert-dp 1) + gradients
#             (the dense part's partitioned, the experts' whole: 3.6 GB bf16, 7.2 GB fp32; DeepSpeed
#             also holds the bf16 ones until reduced) = 29-37 GB of model states (zerotrain's count
#             for 1 layer on CPU ranks, fp32: params 1.05 + grads 0.78 + master 0.78 + optimizer
#             1.57 GiB per rank, n_params 420.5 M: the same arithmetic); activations (no
#             checkpointing, 2048 tokens per GPU) ~4 GB, DeepSpeed dropless up to ~10 GB more (it
#             pads every expert to the largest expert's count, up to all 2048 tokens when the
#             routing collapses on random tokens). About 35-50 GB of 80 at SEQ 1024.
#   rows      zt_z2_dropless, zt_z3_dropless (zerotrain's Mixtral routing is HF's: dropless, no
#             capacity; --moe-capacity-factor is GPT-2's), ds_z2_drop (capacity factor 1.0,
#             tokens beyond C = ceil(T/E x 2) dropped) and ds_z2_dropless (C = the most
#             assignments to any expert over ep). So dropless is like for like, and DeepSpeed's
#             capacity-1.0 row shows what dropping buys it.
#   routing   DeepSpeed's top-2 gate = HF Mixtral's choices and renormalized weights when nothing
#             drops (no noise, no RTS, no sampled second expert); the aux losses differ (the
#             anchor's docstring): zerotrain's moe_aux_loss is HF's load_balancing_loss_func,
#             the anchor's the mean over layers of DeepSpeed's l_aux (first choices only).
# Each row: ms/iter, tokens/s (both ranks' tokens), peak GiB (max over ranks), the MoE
# all-to-alls' time per step (forward + backward, CUDA events: zerotrain --moe-timing, the
# anchor's wrapped _AllToAll), dropped fraction, aux loss, last loss, tokens/s ratio (dropless).
# Dry run on CPU ranks (fp32, no build, DeepSpeed already in SITE): DEVICE=cpu ZT_BIN=build/zerotrain
# NO_PIP=1 SITE=<DeepSpeed's folder> MODEL=<a tiny Mixtral config.json> OUT=/tmp/o DS_ACCELERATOR=cpu
# bash scripts/device/moe_mixtral_2gpu.sh
# Knobs: STEPS (5 timed), WARMUP (2), MB (2), SEQ (1024), STAGES ("2 3"; zerotrain),
# DS_MODES ("drop dropless"), SKIP_ZT, SKIP_DS, ZT_TIMEOUT (180 s per run), DS_TIMEOUT (200 s
# per run; the first DeepSpeed run JIT-builds FusedAdam), SITE (/tmp/site: the wheels' folder),
# PET_MASTER_PORT (torchrun's port, for a job beside another), CUDA_VISIBLE_DEVICES.
# About 4-5 min after the build on 2 H100s. Files: $OUT/moe_mixtral_2gpu.tar.gz (summaries,
# metrics, logs, table.md, table.json; re-packed after every run); the table is printed last.
set -uo pipefail
{ [ -n "${NO_PIP:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target ${SITE:-/tmp/site} .whl/*.whl; } && export PYTHONPATH=${SITE:-/tmp/site} || exit 1
TAG=moe_mixtral_2gpu
NOBUILD=${SKIP_ZT:-${ZT_BIN:-}}
source scripts/device/common.sh $TAG ${NOBUILD:+--no-build} zerotrain_cli
Z=${ZT_BIN:-$Z}
W=/tmp/$TAG; rm -rf $W; mv $R $W; R=$W
pack() { python3 scripts/device/moe_table.py $R > $R/table.md 2>&1; tar -czf $OUT/$TAG.tar.gz -C /tmp $TAG; }
STEPS=${STEPS:-5}; WARMUP=${WARMUP:-2}; MB=${MB:-2}; SEQ=${SEQ:-1024}
MODEL=${MODEL:-bench/configs/models/mixtral-2gpu.json}; DEVICE=${DEVICE:-cuda}
ZT_CPU=""; [ $DEVICE = cpu ] && ZT_CPU="--set bf16.enabled=false"  # the dry run on CPU ranks is fp32 on both sides
python3 -c "import deepspeed as d; print('deepspeed', d.__version__)" 2>&1 | tail -1
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-all} PET_MASTER_PORT=${PET_MASTER_PORT:-29500} seq $SEQ mb $MB" >> $R/device.txt

run_zt() {  # NAME STAGE: zerotrain train --ep 2 of the Mixtral (dropless), --summary and --metrics
  local name=$1 stage=$2
  timeout ${ZT_TIMEOUT:-180} $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z$stage.json --device $DEVICE \
    $ZT_CPU --set train_micro_batch_size_per_gpu=$MB --model $MODEL --seq $SEQ --ep 2 --moe-timing --data random \
    --steps $((STEPS + WARMUP)) --warmup $WARMUP --print-every 1 \
    --summary $R/$name.json --metrics $R/$name.metrics.jsonl > $R/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; grep -aiE "error|what\(\)|out of memory" $R/$name.log | head -3
}
run_ds() {  # NAME MODE: the DeepSpeed-MoE anchor (--arch mixtral) at ZeRO-2 on 2 processes
  local name=$1 mode=$2 cap=""
  [ $mode = drop ] && cap="--capacity-factor 1.0 --drop-tokens"
  timeout ${DS_TIMEOUT:-200} torchrun --nproc_per_node 2 bench/anchors/ds_moe_anchor.py --arch mixtral --hf-config $MODEL \
    --seq $SEQ --micro $MB --ep 2 --stage 2 $cap --steps $STEPS --warmup $WARMUP --device $DEVICE --out $R/$name.json > $R/$name.log 2>&1
  echo "$name rc=$? $(( $(date +%s) - T0 )) s"; [ -s $R/$name.json ] && grep -q '"status": "ok"' $R/$name.json \
    || grep -aE "Error|error|memory" $R/$name.log | grep -v Warning | tail -4
}
# zerotrain ZeRO-2, DeepSpeed's modes, then zerotrain's other stages (ZeRO-3, the least needed, last)
STAGES=${STAGES:-2 3}; FIRST=${STAGES%% *}; REST=${STAGES#"$FIRST"}
[ -n "${SKIP_ZT:-}" ] || { run_zt zt_z${FIRST}_dropless $FIRST; pack; }
for m in ${DS_MODES:-drop dropless}; do
  [ -n "${SKIP_DS:-}" ] || { run_ds ds_z2_$m $m; pack; }
done
for s in $REST; do
  [ -n "${SKIP_ZT:-}" ] || { run_zt zt_z${s}_dropless $s; pack; }
done
pack; cat $R/table.md; rm -rf $R
echo "total: $(( $(date +%s) - T0 )) s"
