#!/usr/bin/env bash
# Device run SPEED_AB_1GPU (one GPU): the engine split's speed check. The baseline (the commit
# before it, carried as .base/base.tar.gz: `git archive BASE | gzip > .base/base.tar.gz`) and
# this tree are built in the same call, then GPT-2 Large, bf16, micro-batch 8, seq 1024, for
# each configuration (ONLY, default stages 0-3 + CPU optimizer offload at stage 2) the baseline
# and the change run alternately (ROUNDS times, default 2), each in fresh processes.
# OFF_ROUNDS: rounds of the offload configurations (default ROUNDS; their CPU Adam step varies
# by several percent between runs). Prints a table: ms/iter of each, the ratio. Results: $OUT/speed_ab.tar.gz.
set -uo pipefail
mkdir -p /tmp/base && tar -xzf .base/base.tar.gz -C /tmp/base || exit 1
( cd /tmp/base && cmake -S . -B build-gpu -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF > /tmp/base_cmake.log 2>&1 \
  && ninja -C build-gpu zerotrain_cli > /tmp/base_build.log 2>&1; echo "baseline build rc=$?" ) &
source scripts/device/common.sh speed_ab zerotrain_cli ${EXTRA_TARGETS:-}
wait
[ -x /tmp/base/build-gpu/zerotrain ] || { tail -20 /tmp/base_build.log; exit 1; }
echo "both built: $(( $(date +%s) - T0 )) s"
# Optional quick CPU-rank checks before timing (CHECK="unit filter|dist filter").
if [ -n "${CHECK:-}" ]; then
  ( export CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1
    $B/zt_unit --gtest_filter="${CHECK%%|*}" 2>&1 | grep -E "^\[  (PASSED|FAILED) |Failure|Expected|actual|Which is|error" | head -30
    $Z launch -n 2 -- $B/zt_dist --gtest_filter="${CHECK##*|}" 2>&1 | grep -E "\[  (PASSED|FAILED) |Failure|Expected|actual|Which is" | head -30 )
fi
ROUNDS=${ROUNDS:-2}; OFF_ROUNDS=${OFF_ROUNDS:-$ROUNDS}; MAXR=$(( ROUNDS > OFF_ROUNDS ? ROUNDS : OFF_ROUNDS ))
for r in $(seq 1 $MAXR); do
  for c in ${ONLY:-z0-bf16 z1-bf16 z2-bf16 z3-bf16 z2-offopt}; do
    case $c in *off*) [ $r -le $OFF_ROUNDS ] || continue ;; *) [ $r -le $ROUNDS ] || continue ;; esac
    for v in base new; do
      Zv=$Z; [ $v = base ] && Zv=/tmp/base/build-gpu/zerotrain
      $Zv bench --model gpt2-large --gpus 1 --steps ${STEPS:-15} --warmup 3 --only $c --timeout 200 \
        --out $R/$v-r$r-$c > $R/$v-r$r-$c.log 2>&1
      grep "^\[bench\] $c" $R/$v-r$r-$c.log | cut -c1-120 | sed "s/^/$v r$r /"
    done
  done
done
python3 scripts/device/ab_table.py $R
tar -czf $OUT/speed_ab.tar.gz -C $OUT speed_ab
echo "total: $(( $(date +%s) - T0 )) s"
