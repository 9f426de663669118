#!/usr/bin/env bash
# Device run SWEEP_AB_2GPU (2 GPUs): issue 24's stage sweep after the engine split.
# GPT-2 Large, bf16/fp16, micro-batch 8, seq 1024, every configuration in fresh processes.
# The commit before the engine split (carried as .base/base.tar.gz: `git archive 0c2350d |
# gzip > .base/base.tar.gz`) and this tree are both built in the same call. One call is at
# most 10 minutes, so the work comes in phases on one warm machine (build-gpu and
# /tmp/base survive between calls):
#   PHASE=1  build both trees; this tree's whole sweep with the PyTorch anchors (DDP,
#            ZeroRedundancyOptimizer, FSDP2 both reshard modes, FSDP2 + CPUOffloadPolicy)
#   PHASE=2  the torch.compile'd GPT-2 and DeepSpeed 0.19.8 (wheels in .whl/) at the stages
#            of the bf16 rows and with CPU optimizer offload, next to this tree's rows
#   PHASE=3  the A/B: each zerotrain row of the baseline and of this tree alternately
#            (ROUNDS, default 1), and the table change / baseline
# Results: $OUT/sweep_ab_2gpu_<phase>.tar.gz.
set -uo pipefail
PHASE=${PHASE:-1}
if [ "$PHASE" = 2 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
if [ ! -x /tmp/base/build-gpu/zerotrain ] && [ "$PHASE" != 2 ]; then
  mkdir -p /tmp/base && tar -xzf .base/base.tar.gz -C /tmp/base || exit 1
  ( cd /tmp/base && cmake -S . -B build-gpu -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF > /tmp/base_cmake.log 2>&1 \
    && ninja -C build-gpu zerotrain_cli > /tmp/base_build.log 2>&1; echo "baseline build rc=$?" ) &
fi
source scripts/device/common.sh sweep_ab_2gpu_$PHASE zerotrain_cli
wait
cat $R/device.txt
ROWS_ALL=z0-bf16,z1-bf16,z2-bf16,z3-bf16,z1-fp16,z2-fp16,z3-fp16,z2-offopt,z2-offdpu,z3-offopt,z3-offall
BENCH="--model gpt2-large --gpus 2 --steps ${STEPS:-15} --warmup ${WARMUP:-3} --python python3 --timeout 240"
case $PHASE in
1)
  timeout 480 $Z bench $BENCH --with-anchors --anchor-set pytorch --only ${ONLY:-$ROWS_ALL} \
    --out $R/gpt2-large > $R/bench.log 2>&1
  grep "^\[bench\]" $R/bench.log | cut -c1-170 ;;
2)
  python3 -c "import deepspeed; print('deepspeed', deepspeed.__version__)" 2>&1 | tail -1
  timeout 560 $Z bench $BENCH --with-anchors --anchor-set ${SET:-compile,deepspeed} \
    --only ${ONLY:-z0-bf16,z1-bf16,z2-bf16,z3-bf16,z2-offopt} --out $R/gpt2-large > $R/bench.log 2>&1
  grep "^\[bench\]" $R/bench.log | cut -c1-170
  for f in $R/gpt2-large/logs/deepspeed-*.log $R/gpt2-large/logs/torch-compile*.log; do
    [ -f "$f" ] && ! grep -q '"status": "ok"' "$f" && { echo "== $f"; grep -v "^\s*$" "$f" | tail -6; }
  done ;;
3)
  [ -x /tmp/base/build-gpu/zerotrain ] || { tail -20 /tmp/base_build.log; exit 1; }
  for r in $(seq 1 ${ROUNDS:-1}); do
    for c in ${ONLY_AB:-${ROWS_ALL//,/ }}; do
      for v in base new; do
        Zv=$Z; [ $v = base ] && Zv=/tmp/base/build-gpu/zerotrain
        timeout 120 $Zv bench $BENCH --only $c --out $R/$v-r$r-$c > $R/$v-r$r-$c.log 2>&1
        grep "^\[bench\] $c" $R/$v-r$r-$c.log | cut -c1-120 | sed "s/^/$v r$r /"
      done
    done
  done
  python3 scripts/device/ab_table.py $R
  ;;
esac
tar -czf $OUT/sweep_ab_2gpu_$PHASE.tar.gz -C $OUT sweep_ab_2gpu_$PHASE
echo "total: $(( $(date +%s) - T0 )) s"
