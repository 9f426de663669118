#!/usr/bin/env bash
# Device run SWEEP (2 GPUs): `zerotrain bench --with-anchors` on GPT-2 Large, bf16/fp16,
# micro-batch 8, seq 1024: ten zerotrain configurations and five PyTorch anchors, each in
# fresh processes, in one call. Then one deliberately oversized run (micro-batch 64 at
# stage 0) to show an out-of-memory result with its phase.
# Results: $OUT/sweep_results.tar.gz (results.json, results.md, memory.png, time.png, logs).
set -uo pipefail
source scripts/device/common.sh sweep zerotrain_cli
cat $R/device.txt
COMMIT=${COMMIT:?pass COMMIT=<sha> (the device copy has no current git HEAD)}
t1=$(date +%s)
$Z bench --model ${MODEL:-gpt2-large} --gpus 2 --steps ${STEPS:-20} --warmup ${WARMUP:-2} --with-anchors --python python3 \
  --timeout 150 --commit $COMMIT --out $R/gpt2-large ${ONLY:+--only $ONLY} > $R/bench.log 2>&1
echo "sweep + anchors: $(( $(date +%s) - t1 )) s (exit $?)"
[ -n "${SKIP_OOM:-}" ] || $Z bench --model gpt2-large --gpus 2 --steps 2 --warmup 1 --micro-batch 64 --only z0-bf16 \
  --timeout 120 --commit $COMMIT --out $R/oom > $R/bench_oom.log 2>&1
echo "total: $(( $(date +%s) - T0 )) s"
tar -czf $OUT/sweep_results.tar.gz -C $OUT sweep
grep "^\[bench\]" $R/bench.log $R/bench_oom.log | cut -c1-200
