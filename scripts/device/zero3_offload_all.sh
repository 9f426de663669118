#!/usr/bin/env bash
# Device run ZERO3_OFFLOAD_ALL (2 GPUs): the sweep's z3-offall row (ZeRO-3, optimizer and parameters
# offloaded to the CPU) alone. Results: $OUT/offall.tar.gz.
set -uo pipefail
source scripts/device/common.sh offall zerotrain_cli
$Z bench --model gpt2-large --gpus 2 --steps ${STEPS:-10} --warmup 2 --only z3-offall --timeout 120 --out $R/gpt2-large > $R/bench.log 2>&1
tar -czf $OUT/offall.tar.gz -C $OUT offall
grep "^\[bench\]" $R/bench.log | cut -c1-150; grep -h -m5 -i "error\|illegal" $R/gpt2-large/logs/*.log | head -5
echo "total: $(( $(date +%s) - T0 )) s"
