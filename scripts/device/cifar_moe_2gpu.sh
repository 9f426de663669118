#!/usr/bin/env bash
# Device run CIFAR_MOE_2GPU (2 GPUs): issue 27's CIFAR-10 MoE tutorial row. DeepSpeed's tutorial
# settings (DeepSpeedExamples training/cifar/run_ds_moe.sh: 2 GPUs, --ep-world-size 2,
# --num-experts 2, --top-k 1, --noisy-gate-policy RSample, --moe-param-group, --log-interval 100,
# min capacity 0, the aux loss dropped, ZeRO stage 0, train_batch_size 16 = micro 8 per GPU,
# Adam(W) lr 1e-3 with WarmupLR over 1000 steps, clip 1.0) on a synthetic CIFAR-10:
#   data       bench/anchors/synthetic_cifar.py (the bytes of tests/support/synthetic_cifar.h):
#              PER_FILE records in each of data_batch_1..5.bin and test_batch.bin (default 2000:
#              10,000 train images = 625 steps an epoch, 2,000 test images), written once; both
#              sides read these files.
#   zerotrain  build-gpu/zerotrain launch -n 2 -- build-gpu/example_cifar10 DIR CONFIG EPOCHS --moe
#              --ep 2 --num-experts 2 --top-k 1 --min-capacity 0 --noisy-gate-policy RSample
#              --moe-param-group --moe-aux-coef 0 --log-interval LOG --seed SEED; CONFIG =
#              configs/cifar10_ds_config.json with the dtype switched (CUDA is picked by the
#              example itself, one GPU per local rank).
#   DeepSpeed  torchrun --nproc_per_node 2 bench/anchors/ds_cifar_moe_anchor.py (the tutorial's net,
#              config and loop; DeepSpeed 0.19.8 from .whl/), the same flags, the same starting
#              weights (--init zerotrain) and batches (DistributedSampler seed 0, reshuffled per
#              epoch), torch AdamW under FP16_UnfusedOptimizer (--torch-adam: the same update, the
#              config's loss scale; DS_FUSED=1: the tutorial's FusedAdam under FP16_Optimizer, a JIT
#              build of minutes first).
# Per dtype (DTYPES, default "fp16", the tutorial's --dtype default; "fp16 fp32" adds the fp32 pair,
# about 60 s more): rank 0's mean loss every LOG steps side by side, ms/step (wall time of steps
# 11.., each step reading its loss back), peak MiB allocated on rank 0, test accuracy (all 2,000
# test images in one forward), wall time of each run. Routing noise (RSample, random token
# selection) is each side's own draw, so the curves agree in shape, not to the digit.
# Knobs: DTYPES, EPOCHS (2), PER_FILE (2000), LOG (100), SEED (0), SITE (DeepSpeed's install
# folder, /tmp/site_cifar), PET_MASTER_PORT (torchrun's port), ZT_TIMEOUT (120 s), DS_TIMEOUT
# (180 s), SKIP_ZT, SKIP_DS, DS_DEVICE (cuda; cpu: the anchor's gloo smoke path, for a dry run
# on a machine without GPUs, where the example picks the CPU itself). Files: $OUT/cifar_moe_2gpu.tar.gz (logs, JSON, table.md,
# table.json; re-packed after every run); the table is printed last.
set -uo pipefail
SITE=${SITE:-/tmp/site_cifar}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl \
  && export PYTHONPATH=$SITE || exit 1
TAG=cifar_moe_2gpu
source scripts/device/common.sh $TAG ${SKIP_ZT:+--no-build} zerotrain_cli example_cifar10
W=/tmp/$TAG; rm -rf $W; mv $R $W; R=$W
pack() { python3 scripts/device/cifar_moe_table.py $R > $R/table.md 2>&1; tar --exclude=$TAG/data -czf $OUT/$TAG.tar.gz -C /tmp $TAG; }
DTYPES=${DTYPES:-fp16}; EPOCHS=${EPOCHS:-2}; PER_FILE=${PER_FILE:-2000}; LOG=${LOG:-100}; SEED=${SEED:-0}
python3 -c "import deepspeed as d; print('deepspeed', d.__version__)" 2>&1 | tail -1
python3 bench/anchors/synthetic_cifar.py $R/data --per-file $PER_FILE --seed 7 || exit 1
ADAM=--torch-adam; [ -z "${DS_FUSED:-}" ] || ADAM=""
MOE="--num-experts 2 --top-k 1 --min-capacity 0 --noisy-gate-policy RSample --moe-param-group"

run_zt() {  # DTYPE
  local dt=$1 t0=$(date +%s)
  python3 - "$dt" $R/zt_$dt.json <<'EOF'
import json, sys
c = json.load(open("configs/cifar10_ds_config.json"))
c["bf16"]["enabled"], c["fp16"]["enabled"] = sys.argv[1] == "bf16", sys.argv[1] == "fp16"
json.dump(c, open(sys.argv[2], "w"), indent=1)
EOF
  timeout ${ZT_TIMEOUT:-120} $Z launch -n 2 -- $B/example_cifar10 $R/data $R/zt_$dt.json $EPOCHS --moe --ep 2 $MOE \
    --moe-aux-coef 0 --log-interval $LOG --seed $SEED > $R/zt_$dt.log 2>&1
  echo "zt_$dt rc=$? $(( $(date +%s) - t0 )) s"; echo $(( $(date +%s) - t0 )) > $R/zt_$dt.wall
  grep -aiE "error|what\(\)|out of memory" $R/zt_$dt.log | head -3
}
run_ds() {  # DTYPE
  local dt=$1 t0=$(date +%s)
  timeout ${DS_TIMEOUT:-180} torchrun --nproc_per_node 2 bench/anchors/ds_cifar_moe_anchor.py --data $R/data \
    --epochs $EPOCHS --dtype $dt --ep-world-size 2 $MOE --log-interval $LOG --seed $SEED \
    $ADAM --device ${DS_DEVICE:-cuda} --out $R/ds_$dt.json > $R/ds_$dt.log 2>&1
  echo "ds_$dt rc=$? $(( $(date +%s) - t0 )) s"; echo $(( $(date +%s) - t0 )) > $R/ds_$dt.wall
  [ -s $R/ds_$dt.json ] && grep -q '"status": "ok"' $R/ds_$dt.json \
    || grep -aE "Error|error" $R/ds_$dt.log | grep -v Warning | tail -4
}
for dt in $DTYPES; do
  [ -n "${SKIP_ZT:-}" ] || { run_zt $dt; pack; }
  [ -n "${SKIP_DS:-}" ] || { run_ds $dt; pack; }
done
pack; cat $R/table.md; rm -rf $R
echo "total: $(( $(date +%s) - T0 )) s"
