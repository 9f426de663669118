#!/usr/bin/env bash
# Device run NCCL_CTAS (2 GPUs): GPT-2 Large (bf16, micro-batch 8, seq 1024) at ZeRO 0/1/2
# with NCCL limited to NCCL_MAX_CTAS thread blocks (CTAS="default 16 8 4") or with a fixed
# NCCL protocol (PROTOS="default Simple LL128"): how much the gradient reductions that
# overlap backward slow the compute they share the GPU with.
# Results: $OUT/ctas.tar.gz; a table last.
set -uo pipefail
source scripts/device/common.sh ctas zerotrain_cli
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps ${STEPS:-17} --warmup 2"
for st in ${STAGES:-0 1 2}; do
  for c in ${CTAS:-}; do
    if [ $c = default ]; then unset NCCL_MAX_CTAS; else export NCCL_MAX_CTAS=$c; fi
    timeout 120 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z$st.json $A --summary $R/z${st}_ctas_$c.jsonl > $R/log_z${st}_ctas_$c.txt 2>&1
  done
  unset NCCL_MAX_CTAS
  for p in ${PROTOS:-}; do
    if [ $p = default ]; then unset NCCL_PROTO; else export NCCL_PROTO=$p; fi
    timeout 120 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z$st.json $A --summary $R/z${st}_proto_$p.jsonl > $R/log_z${st}_proto_$p.txt 2>&1
  done
  unset NCCL_PROTO
done
unset NCCL_MAX_CTAS
tar -czf $OUT/ctas.tar.gz -C $OUT ctas
python3 - $R <<'PY'
import json, sys, glob, os
print(f"{'run':16} {'ms/iter':>8} {'fwd':>6} {'bwd':>6} {'step':>6} {'exposed':>8} {'peak GiB':>8}")
for f in sorted(glob.glob(sys.argv[1] + "/*.jsonl")):
    for line in open(f):
        j = json.loads(line); p = j["phase_ms"]; e = j["last_step"]["comm"]["exposed_ms"]
        print(f"{os.path.basename(f)[:-6]:16} {j['ms_per_iter']:8.1f} {p['forward']:6.1f} {p['backward']:6.1f} {p['step']:6.1f} {e:8.2f} {j['peak_gib']:8.2f}")
PY
echo "total: $(( $(date +%s) - T0 )) s"
