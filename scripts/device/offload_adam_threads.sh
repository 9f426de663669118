#!/usr/bin/env bash
# Device run OFFLOAD_ADAM_THREADS (2 GPUs): the host's layout (NUMA, cores) and ZeRO-2 + offload_optimizer
# cpu on GPT-2 Large (bf16, mb 8, seq 1024) at several CPU Adam thread counts, with and
# without the delayed update. Results: $OUT/offperf.tar.gz.
set -uo pipefail
source scripts/device/common.sh offperf zerotrain_cli
(lscpu; numactl --hardware 2>&1; free -g) > $R/host.txt 2>&1
grep -E "^(Model name|Socket|Core|Thread|NUMA|CPU\(s\))" $R/host.txt
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps ${STEPS:-10} --warmup 3"
for v in ${VARIANTS:-"z2_offload 16" "z2_offload 8" "z2_offload_dpu 16" "z2_offload_dpu 10" "z2_offload_dpu 6"}; do
  set -- $v; c=$1; t=$2; n=${c}_t$t${3:+_$3}
  env OMP_NUM_THREADS=$t ${EXTRA:-} timeout 120 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_$c.json $A --summary $R/$n.jsonl > $R/log_$n.txt 2>&1 || echo "$n failed"
done
tar -czf $OUT/offperf.tar.gz -C $OUT offperf
python3 scripts/device/summarize.py $R
echo "total: $(( $(date +%s) - T0 )) s"
