#!/usr/bin/env bash
# Device run CAPACITY_1GPU (1 GPU of the 2-GPU host, 251 GiB host memory): the largest GPT-2-shaped
# model (width 4096, 32 heads, micro-batch 1, seq 1024, checkpointing) that trains on ONE
# GPU without offload (ZeRO-3 at world 1) and with CPU offload of optimizer + parameters.
# Usage: LAYERS_NO="44 48" LAYERS_OFF="59" T=170 STEPS=3 bash scripts/device/capacity_1gpu.sh
#   PROBES  further runs, "config:layers ..." (bench/configs/<config>.json), after those; a config
#           with offload_param nvme writes its parameter file under /tmp/zerotrain_nvme
#   T       per-run timeout in seconds; BUDGET (s, default 560): a probe that could end past it
#           (counted from the script's start, build included) is skipped and said so
set -uo pipefail
source scripts/device/common.sh cap zerotrain_cli
export CUDA_VISIBLE_DEVICES=0
T=${T:-170}; STEPS=${STEPS:-3}; BUDGET=${BUDGET:-560}
free -g | head -2 | tee $R/host.txt
run() {  # name config layers
  local n=$1 c=$2 l=$3 ts=$(date +%s)
  if [ $(( ts - T0 + T )) -gt $BUDGET ]; then echo "$n layers=$l skipped: $(( ts - T0 )) s used + T=$T s > BUDGET=$BUDGET s"; return; fi
  timeout -k 20 $T $Z launch -n 1 -- $Z train --config bench/configs/$c.json --model gpt2 --layers $l --embd 4096 --heads 32 \
    --seq 1024 --micro-batch 1 --steps $STEPS --warmup 1 --checkpoint-activations --summary $R/cap.jsonl 2>&1 |
    while IFS= read -r line; do echo "[$(( $(date +%s) - ts )) s] $line"; done > $R/log_${n}_$l.txt
  local rc=${PIPESTATUS[0]}
  echo "$n layers=$l rc=$rc wall=$(( $(date +%s) - ts ))s | $(grep -E 'gpt2: |ms/iteration|model states per rank|out of memory|OutOfMemory|rror|Killed' $R/log_${n}_$l.txt | head -4 | tr '\n' ' ')" | tee -a $R/summary.txt
  { echo "== after $n L=$l (rc $rc)"; free -g; } >> $R/host.txt
}
for l in ${LAYERS_NO-44 48}; do run nooffload cap_z3 $l; done
for l in ${LAYERS_OFF-59}; do run offload cap_z3_offload $l; done
mkdir -p /tmp/zerotrain_nvme; df -h /tmp/zerotrain_nvme >> $R/host.txt
for p in ${PROBES:-}; do run ${p%%:*} ${p%%:*} ${p##*:}; rm -rf /tmp/zerotrain_nvme/*; done
echo "total: $(( $(date +%s) - T0 )) s"
tar -czf $OUT/cap_results.tar.gz -C $OUT cap
